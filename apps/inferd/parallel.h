// --tensor-parallel-size and --pipeline-parallel-size: a command run as the ranks of an MPI job
// (docs/parallelism.md).
//   mpirun -np 4 inferd serve --tensor-parallel-size 2 --pipeline-parallel-size 2 ...
// Rank 0 runs the command as usual on its slice of the model; the other ranks only load their
// slice and mirror rank 0's forward passes (run_parallel_worker).
#pragma once

#include <CLI/CLI.hpp>
#include <memory>

#include "common/status.h"
#include "engine/engine.h"
#include "model/transformer.h"
#include "parallel/mpi_parallel.h"

namespace inferd {

struct ParallelFlags {
  int tensor_parallel_size = 1;
  int pipeline_parallel_size = 1;
  double collective_timeout = 120;
};

void add_parallel_flags(CLI::App* cmd, ParallelFlags* flags);

class Parallel final {
 public:
  // Nothing (nullptr) when the flags ask for one process; else MPI started and the job's size
  // checked against the flags.
  static Expected<std::unique_ptr<Parallel>> start(const ParallelFlags& flags);
  ~Parallel();

  bool worker() const { return mpi_->rank() != 0; }
  int rank() const { return mpi_->rank(); }
  int size() const { return mpi_->size(); }
  int tensor_size() const { return group_->size(); }
  int pipeline_size() const { return group_->stages(); }
  // Every rank, right after loading: the same model everywhere, then this rank's layers (its
  // pipeline stage's) and its slice of them (its tensor rank's).
  Status split(ModelWeights& weights);
  // Rank 0, once the model is made and before the engine: the group on the model, the KV
  // cache's shape to the workers, and options.step_mirror.
  Status attach(Transformer& model, EngineOptions& options);
  // The other ranks: their KV cache (rank 0's shape, their heads), their offload tiers when rank
  // 0 has tiers (`offload`: this rank's flags, the same command line), and the step loop, until
  // rank 0 stops.
  Status run_worker(Transformer& model, const KvOffloadOptions& offload = {});

  const MpiTensorGroup& group() const { return *group_; }
  // What rank 0 does on the thread that finds a rank gone, before the job ends (MpiRuntime).
  void set_before_abort(std::function<void(const std::string&)> hook) {
    MpiRuntime::set_before_abort(std::move(hook));
  }

 private:
  Parallel() = default;
  // The model as this rank's part of the group: its slice (tensor) and its stage (pipeline).
  Status join(Transformer& model);
  std::unique_ptr<MpiRuntime> mpi_;
  std::unique_ptr<MpiTensorGroup> group_;
  std::unique_ptr<MpiStepMirror> mirror_;
};

}  // namespace inferd
