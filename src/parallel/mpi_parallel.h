// Tensor and pipeline parallelism over MPI (Open MPI from Debian; docs/parallelism.md). One process per
// rank, launched by `mpirun -np T inferd ... --tensor-parallel-size T`. Rank 0 owns the server,
// the scheduler and sampling; the other ranks run MpiWorker::run, which mirrors each forward
// pass and KV block copy rank 0's MpiStepMirror sends. MPI's own collectives do the sums (its
// shared-memory transport within a host, TCP or RDMA across).
//
// No collective waits forever: every wait is MPI_Test in a loop against a deadline, and a rank
// that misses it ends the whole job (MPI_Abort) with a message naming what it waited for. A rank
// that dies is seen by mpirun, which ends the job; rank 0 logs why it is being stopped.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "engine/step_mirror.h"
#include "kv/kv_cache.h"
#include "kv/kv_offloader.h"
#include "model/model_fingerprint.h"
#include "model/pipeline_parallel.h"
#include "model/tensor_parallel.h"
#include "model/transformer.h"

namespace inferd {

// Whether this process was started by mpirun (Open MPI's or PMIx's environment is set).
bool launched_by_mpi();

// MPI_Init_thread (MPI_THREAD_SERIALIZED: the engine thread makes the calls) and, at the end,
// MPI_Finalize. One per process.
class MpiRuntime final {
 public:
  static Expected<std::unique_ptr<MpiRuntime>> init();
  ~MpiRuntime();
  MpiRuntime(const MpiRuntime&) = delete;
  MpiRuntime& operator=(const MpiRuntime&) = delete;
  int rank() const { return rank_; }
  int size() const { return size_; }
  // Ends every rank of the job at once, after logging `message` here and calling the hook.
  [[noreturn]] static void abort_job(const std::string& message);
  // Called by abort_job on the thread that found the fault, before the job ends: e.g. the server
  // answering its open requests with the reason. Set once, before the engine runs.
  static void set_before_abort(std::function<void(const std::string&)> hook);

 private:
  MpiRuntime(int rank, int size) : rank_(rank), size_(size) {}
  int rank_, size_;
};

// The ranks of the job as a grid of `stages` pipeline stages of `tensor_size` tensor-parallel
// ranks each: job rank = stage * tensor_size + tensor rank. The tensor-parallel collectives run
// among one stage's ranks (a communicator of their own); a stage's message goes to the rank of
// the same tensor rank in the other stage. With one stage it is plain tensor parallelism, with a
// tensor size of 1 plain pipeline parallelism. `timeout_seconds`: the longest one collective or
// message waits.
class MpiTensorGroup final : public TensorParallelGroup, public PipelineGroup {
 public:
  MpiTensorGroup(const MpiRuntime& mpi, int tensor_size, double timeout_seconds = 120);
  ~MpiTensorGroup() override;
  // Within this rank's stage (TensorParallelGroup).
  int rank() const override { return tensor_rank_; }
  int size() const override { return tensor_size_; }
  Status all_reduce_sum(std::span<float> data) override;
  Status gather(std::span<const float> local, std::span<const int64_t> counts, std::span<float> all) override;
  // Across the stages, along this rank's tensor rank (PipelineGroup).
  int stage() const override { return stage_; }
  int stages() const override { return stages_; }
  Status send(int to, int tag, std::span<const float> data) override;
  Status receive(int from, int tag, std::span<float> data) override;
  Status finish_sends() override;
  // In the whole job (rank 0 runs the scheduler).
  int job_rank() const { return job_rank_; }
  int job_size() const { return job_size_; }

  // Seconds spent in collectives so far (all_reduce_sum and gather, or a stage's waits for its
  // messages: receive and finish_sends; waiting for the other ranks included).
  double collective_seconds() const { return collective_seconds_; }
  int64_t collective_calls() const { return collective_calls_; }

  // Start-up checks, collective over the job: every rank loaded the same model (fingerprints of
  // the whole weights, before splitting). Rank 0 gets an error naming the first rank that
  // differs; the other ranks an error saying rank 0 refused the group.
  Status check_same_model(const ModelFingerprint& fp, const std::string& model_path);
  // Job rank 0 sends `values`, the others receive them into it (same size everywhere).
  Status broadcast(std::span<int64_t> values);
  // The smallest of every rank's `value` (collective over the job; `what` names it in a timeout).
  int64_t min_over_job(int64_t value, const char* what);

 private:
  // Waits for `request` (an MPI_Request) until the deadline, yielding the CPU between tests;
  // `idle`: a wait for work, which may last (it sleeps longer and never times out).
  void wait(void* request, const char* what, bool idle);
  friend class MpiStepMirror;
  friend class MpiWorker;

  int job_rank_ = 0, job_size_ = 1;
  int tensor_rank_ = 0, tensor_size_ = 1;
  int stage_ = 0, stages_ = 1;
  double timeout_seconds_;
  double collective_seconds_ = 0;
  int64_t collective_calls_ = 0;
  std::vector<int> counts_, displs_;
  // The stage's communicator and the MPI_Requests of sends started and not yet finished (mpi.h
  // stays out of this header).
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Rank 0's side: sends each step to the other ranks.
class MpiStepMirror final : public StepMirror {
 public:
  explicit MpiStepMirror(MpiTensorGroup& group) : group_(group) {}
  // Sends the stop message: the workers return from run().
  ~MpiStepMirror() override;
  Status forward(const ForwardBatch& batch) override;
  Status copy_block(int32_t src, int32_t dst) override;
  Status stage_block(int32_t block, const BlockHash& key) override;
  Status start_load(uint64_t ticket, std::span<const BlockHash> keys,
                    std::span<const int32_t> blocks) override;
  Status cancel_load(uint64_t ticket) override;
  Expected<int64_t> finish_load(uint64_t ticket, int64_t loaded) override;

 private:
  Status send(const std::vector<int64_t>& header, const std::vector<int64_t>& payload);
  MpiTensorGroup& group_;
  std::vector<int64_t> header_, payload_;
  bool stopped_ = false;
};

// A rank other than 0: runs what rank 0's mirror sends until it says stop.
class MpiWorker final {
 public:
  // offloader: this rank's offload tiers over `cache` (its own store), or nullptr when rank 0
  // has none or they did not open here (this rank's loads then hold nothing: rank 0 recomputes).
  MpiWorker(MpiTensorGroup& group, Transformer& model, KvCache& cache, KvOffloader* offloader = nullptr)
      : group_(group), model_(model), cache_(cache), offloader_(offloader) {}
  // Returns at rank 0's stop; an error when a step failed here (the job is then ended).
  Status run();

 private:
  void stage_block(int32_t block, const BlockHash& key);
  void start_load(uint64_t ticket);  // its blocks in payload_
  void cancel_load(uint64_t ticket);
  void finish_load(uint64_t ticket);

  MpiTensorGroup& group_;
  Transformer& model_;
  KvCache& cache_;
  KvOffloader* offloader_;
  std::unordered_map<uint64_t, uint64_t> loads_;  // rank 0's ticket -> this rank's
  std::vector<int64_t> header_, payload_;
  std::vector<int32_t> ids_, positions_, token_sequence_, logit_rows_, tables_;
  std::vector<int64_t> slots_, lens_;
  std::vector<AttentionSequence> sequences_;
};

}  // namespace inferd
