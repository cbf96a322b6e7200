#include "parallel/mpi_parallel.h"

#include <mpi.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "common/log.h"

namespace inferd {

namespace {

using Clock = std::chrono::steady_clock;

// The step protocol: a header of kHeaderLen values, then (forward and load only) a payload of
// payload_len values, both MPI_Ibcast from rank 0 (docs/parallelism.md). A finished load is
// then settled by an all-reduce (MIN) of the blocks each rank loaded.
enum Op : int64_t {
  kForward = 1,     // tokens, sequences, logit rows, block-table entries, payload_len
  kCopyBlock = 2,   // src, dst
  kStop = 3,        //
  kStageBlock = 4,  // block, key lo, key hi
  kStartLoad = 5,   // ticket, blocks, -, -, payload_len (per block: key lo, key hi, block)
  kCancelLoad = 6,  // ticket
  kFinishLoad = 7,  // ticket
};
constexpr size_t kHeaderLen = 6;  // op, then five values as above

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

}  // namespace

bool launched_by_mpi() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK"})
    if (std::getenv(var) != nullptr) return true;
  return false;
}

Expected<std::unique_ptr<MpiRuntime>> MpiRuntime::init() {
  int provided = 0;
  if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS)
    return Status(StatusCode::kInternal, "MPI_Init_thread failed");
  if (provided < MPI_THREAD_SERIALIZED) {
    MPI_Finalize();
    return Status(StatusCode::kInternal,
                  "this MPI library does not allow calls from a thread other than the main one");
  }
  // Errors come back as codes (and end the job through abort_job), not through MPI's default
  // handler, which would end it without saying what inferd was doing.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return std::unique_ptr<MpiRuntime>(new MpiRuntime(rank, size));
}

MpiRuntime::~MpiRuntime() {
  MPI_Finalize();
}

namespace {
std::function<void(const std::string&)>& before_abort_hook() {
  static std::function<void(const std::string&)> hook;
  return hook;
}
}  // namespace

void MpiRuntime::set_before_abort(std::function<void(const std::string&)> hook) {
  before_abort_hook() = std::move(hook);
}

void MpiRuntime::abort_job(const std::string& message) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  log_error("tensor parallel: rank " + std::to_string(rank) + ": " + message + "; ending the MPI job");
  static std::atomic<bool> aborting{false};
  if (!aborting.exchange(true) && before_abort_hook()) before_abort_hook()(message);
  MPI_Abort(MPI_COMM_WORLD, 3);
  std::abort();  // MPI_Abort does not return
}

struct MpiTensorGroup::Impl {
  MPI_Comm stage_comm = MPI_COMM_NULL;
  std::vector<MPI_Request> requests;
};

MpiTensorGroup::MpiTensorGroup(const MpiRuntime& mpi, int tensor_size, double timeout_seconds)
    : job_rank_(mpi.rank()),
      job_size_(mpi.size()),
      tensor_rank_(mpi.rank() % tensor_size),
      tensor_size_(tensor_size),
      stage_(mpi.rank() / tensor_size),
      stages_(mpi.size() / tensor_size),
      timeout_seconds_(timeout_seconds),
      impl_(std::make_unique<Impl>()) {
  // The ranks of one stage, in tensor-rank order. Collective over the job, once, at start-up.
  if (MPI_Comm_split(MPI_COMM_WORLD, stage_, tensor_rank_, &impl_->stage_comm) != MPI_SUCCESS)
    MpiRuntime::abort_job("MPI_Comm_split of the stages failed");
  MPI_Comm_set_errhandler(impl_->stage_comm, MPI_ERRORS_RETURN);
}

MpiTensorGroup::~MpiTensorGroup() {
  if (impl_->stage_comm != MPI_COMM_NULL) MPI_Comm_free(&impl_->stage_comm);
}

Status MpiTensorGroup::send(int to, int tag, std::span<const float> data) {
  MPI_Request req;
  if (MPI_Isend(data.data(), static_cast<int>(data.size()), MPI_FLOAT, to * tensor_size_ + tensor_rank_, tag,
                MPI_COMM_WORLD, &req) != MPI_SUCCESS)
    return Status(StatusCode::kInternal, "MPI_Isend failed");
  impl_->requests.push_back(req);
  return Status::ok();
}

Status MpiTensorGroup::receive(int from, int tag, std::span<float> data) {
  const Clock::time_point start = Clock::now();
  MPI_Request req;
  if (MPI_Irecv(data.data(), static_cast<int>(data.size()), MPI_FLOAT, from * tensor_size_ + tensor_rank_,
                tag, MPI_COMM_WORLD, &req) != MPI_SUCCESS)
    return Status(StatusCode::kInternal, "MPI_Irecv failed");
  wait(&req, "a pipeline stage's message", false);
  collective_seconds_ += seconds_since(start);
  ++collective_calls_;
  return Status::ok();
}

Status MpiTensorGroup::finish_sends() {
  const Clock::time_point start = Clock::now();
  for (MPI_Request& req : impl_->requests) wait(&req, "a pipeline stage's send", false);
  impl_->requests.clear();
  collective_seconds_ += seconds_since(start);
  return Status::ok();
}

void MpiTensorGroup::wait(void* request, const char* what, bool idle) {
  auto* req = static_cast<MPI_Request*>(request);
  const Clock::time_point start = Clock::now();
  int done = 0;
  for (int64_t i = 0;; ++i) {
    if (MPI_Test(req, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS)
      MpiRuntime::abort_job(std::string(what) + " failed");
    if (done) return;
    if (idle) {
      // Waiting for the next step: spin briefly (a busy server sends the next step at once), then
      // sleep so that an idle group does not hold a core per rank.
      if (i < 2000) {
        sched_yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(i < 4000 ? 50 : 500));
      }
      continue;
    }
    sched_yield();
    if ((i & 255) == 255 && seconds_since(start) > timeout_seconds_) {
      char limit[32];
      std::snprintf(limit, sizeof limit, "%g", timeout_seconds_);
      MpiRuntime::abort_job(std::string(what) + " did not complete within " + limit +
                            " s (a rank stopped answering)");
    }
  }
}

Status MpiTensorGroup::all_reduce_sum(std::span<float> data) {
  const Clock::time_point start = Clock::now();
  MPI_Request req;
  if (MPI_Iallreduce(MPI_IN_PLACE, data.data(), static_cast<int>(data.size()), MPI_FLOAT, MPI_SUM,
                     impl_->stage_comm, &req) != MPI_SUCCESS)
    return Status(StatusCode::kInternal, "MPI_Iallreduce failed");
  wait(&req, "all-reduce", false);
  collective_seconds_ += seconds_since(start);
  ++collective_calls_;
  return Status::ok();
}

Status MpiTensorGroup::gather(std::span<const float> local, std::span<const int64_t> counts,
                              std::span<float> all) {
  const Clock::time_point start = Clock::now();
  counts_.resize(static_cast<size_t>(tensor_size_));
  displs_.resize(static_cast<size_t>(tensor_size_));
  int64_t offset = 0;
  for (int r = 0; r < tensor_size_; ++r) {
    counts_[static_cast<size_t>(r)] = static_cast<int>(counts[static_cast<size_t>(r)]);
    displs_[static_cast<size_t>(r)] = static_cast<int>(offset);
    offset += counts[static_cast<size_t>(r)];
  }
  if (tensor_rank_ == 0 && static_cast<int64_t>(all.size()) < offset)
    return invalid_argument("gather: buffer too small");
  MPI_Request req;
  if (MPI_Igatherv(local.data(), static_cast<int>(local.size()), MPI_FLOAT,
                   tensor_rank_ == 0 ? all.data() : nullptr, counts_.data(), displs_.data(), MPI_FLOAT, 0,
                   impl_->stage_comm, &req) != MPI_SUCCESS)
    return Status(StatusCode::kInternal, "MPI_Igatherv failed");
  wait(&req, "gather of the logits", false);
  collective_seconds_ += seconds_since(start);
  ++collective_calls_;
  return Status::ok();
}

Status MpiTensorGroup::broadcast(std::span<int64_t> values) {
  MPI_Request req;
  if (MPI_Ibcast(values.data(), static_cast<int>(values.size()), MPI_INT64_T, 0, MPI_COMM_WORLD, &req) !=
      MPI_SUCCESS)
    return Status(StatusCode::kInternal, "MPI_Ibcast failed");
  wait(&req, "broadcast", false);
  return Status::ok();
}

Status MpiTensorGroup::check_same_model(const ModelFingerprint& fp, const std::string& model_path) {
  uint64_t mine[2] = {fp.lo, fp.hi};
  std::vector<uint64_t> all(static_cast<size_t>(2 * job_size_));
  MPI_Request req;
  if (MPI_Igather(mine, 2, MPI_UINT64_T, all.data(), 2, MPI_UINT64_T, 0, MPI_COMM_WORLD, &req) != MPI_SUCCESS)
    return Status(StatusCode::kInternal, "MPI_Igather failed");
  wait(&req, "the start-up model check", false);
  int64_t verdict[1] = {-1};  // the first rank whose model differs from rank 0's
  if (job_rank_ == 0) {
    for (int r = 1; r < job_size_ && verdict[0] < 0; ++r)
      if (all[2 * static_cast<size_t>(r)] != mine[0] || all[2 * static_cast<size_t>(r) + 1] != mine[1])
        verdict[0] = r;
  }
  INFERD_RETURN_IF_ERROR(broadcast(verdict));
  if (verdict[0] < 0) return Status::ok();
  if (job_rank_ == 0) {
    return invalid_argument("tensor parallel: rank " + std::to_string(verdict[0]) +
                            " loaded a different model than rank 0's " + model_path +
                            " (the weights' fingerprints differ): every rank must load the same file");
  }
  return invalid_argument("tensor parallel: rank 0 refused the group: rank " + std::to_string(verdict[0]) +
                          "'s model differs from rank 0's");
}

MpiStepMirror::~MpiStepMirror() {
  if (stopped_) return;
  header_.assign(kHeaderLen, 0);
  header_[0] = kStop;
  const Status s = send(header_, {});
  if (!s.is_ok()) log_error("tensor parallel: the stop message was not sent: " + s.message());
}

Status MpiStepMirror::send(const std::vector<int64_t>& header, const std::vector<int64_t>& payload) {
  MPI_Request req;
  if (MPI_Ibcast(const_cast<int64_t*>(header.data()), static_cast<int>(kHeaderLen), MPI_INT64_T, 0,
                 MPI_COMM_WORLD, &req) != MPI_SUCCESS)
    return Status(StatusCode::kInternal, "MPI_Ibcast failed");
  group_.wait(&req, "sending a step", false);
  if (header[0] == kStop) stopped_ = true;
  if (payload.empty()) return Status::ok();
  if (MPI_Ibcast(const_cast<int64_t*>(payload.data()), static_cast<int>(payload.size()), MPI_INT64_T, 0,
                 MPI_COMM_WORLD, &req) != MPI_SUCCESS)
    return Status(StatusCode::kInternal, "MPI_Ibcast failed");
  group_.wait(&req, "sending a step's batch", false);
  return Status::ok();
}

Status MpiStepMirror::forward(const ForwardBatch& b) {
  const size_t n = b.token_ids.size();
  size_t entries = 0;
  for (const AttentionSequence& s : b.sequences) entries += s.block_table.size();
  payload_.clear();
  auto put = [&](auto span) {
    for (auto v : span) payload_.push_back(static_cast<int64_t>(v));
  };
  put(b.token_ids);
  put(b.positions);
  put(b.token_sequence);
  put(b.slot_mapping);
  put(b.logit_rows);
  for (const AttentionSequence& s : b.sequences) {
    payload_.insert(payload_.end(), {s.query_start, s.num_queries, s.context_len,
                                     static_cast<int64_t>(s.block_table.size())});
  }
  for (const AttentionSequence& s : b.sequences) put(s.block_table);
  header_.assign({kForward, static_cast<int64_t>(n), static_cast<int64_t>(b.sequences.size()),
                  static_cast<int64_t>(b.logit_rows.size()), static_cast<int64_t>(entries),
                  static_cast<int64_t>(payload_.size())});
  return send(header_, payload_);
}

Status MpiStepMirror::copy_block(int32_t src, int32_t dst) {
  header_.assign({kCopyBlock, src, dst, 0, 0, 0});
  return send(header_, {});
}

Status MpiStepMirror::stage_block(int32_t block, const BlockHash& key) {
  header_.assign({kStageBlock, block, static_cast<int64_t>(key.lo), static_cast<int64_t>(key.hi), 0, 0});
  return send(header_, {});
}

Status MpiStepMirror::start_load(uint64_t ticket, std::span<const BlockHash> keys,
                                 std::span<const int32_t> blocks) {
  payload_.clear();
  for (size_t i = 0; i < keys.size(); ++i)
    payload_.insert(payload_.end(), {static_cast<int64_t>(keys[i].lo), static_cast<int64_t>(keys[i].hi),
                                     static_cast<int64_t>(blocks[i])});
  header_.assign({kStartLoad, static_cast<int64_t>(ticket), static_cast<int64_t>(keys.size()), 0, 0,
                  static_cast<int64_t>(payload_.size())});
  return send(header_, payload_);
}

Status MpiStepMirror::cancel_load(uint64_t ticket) {
  header_.assign({kCancelLoad, static_cast<int64_t>(ticket), 0, 0, 0, 0});
  return send(header_, {});
}

Expected<int64_t> MpiStepMirror::finish_load(uint64_t ticket, int64_t loaded) {
  header_.assign({kFinishLoad, static_cast<int64_t>(ticket), 0, 0, 0, 0});
  INFERD_RETURN_IF_ERROR(send(header_, {}));
  return group_.min_over_job(loaded, "the other ranks' KV load");
}

int64_t MpiTensorGroup::min_over_job(int64_t value, const char* what) {
  MPI_Request req;
  if (MPI_Iallreduce(MPI_IN_PLACE, &value, 1, MPI_INT64_T, MPI_MIN, MPI_COMM_WORLD, &req) != MPI_SUCCESS)
    MpiRuntime::abort_job(std::string(what) + ": MPI_Iallreduce failed");
  wait(&req, what, false);
  return value;
}

void MpiWorker::stage_block(int32_t block, const BlockHash& key) {
  if (offloader_ != nullptr) offloader_->stage_block(block, key);  // a busy writer drops it: counted
}

void MpiWorker::start_load(uint64_t ticket) {
  if (offloader_ == nullptr) return;
  const size_t n = payload_.size() / 3;
  std::vector<BlockHash> keys(n);
  std::vector<int32_t> blocks(n);
  for (size_t i = 0; i < n; ++i) {
    keys[i] = BlockHash{static_cast<uint64_t>(payload_[3 * i]), static_cast<uint64_t>(payload_[3 * i + 1])};
    blocks[i] = static_cast<int32_t>(payload_[3 * i + 2]);
  }
  loads_[ticket] = offloader_->start_load(std::move(keys), std::move(blocks));
}

void MpiWorker::cancel_load(uint64_t ticket) {
  if (auto it = loads_.find(ticket); it != loads_.end()) offloader_->cancel(it->second);
}

void MpiWorker::finish_load(uint64_t ticket) {
  int64_t loaded = 0;  // a load this rank did not start (no tiers here) holds nothing
  if (auto it = loads_.find(ticket); it != loads_.end()) {
    const KvBlockSource::Finished f = offloader_->wait_load(it->second);
    loaded = f.loaded;
    if (!f.error.empty()) log_warning("KV offload: " + f.error);
    loads_.erase(it);
  }
  group_.min_over_job(loaded, "settling a KV load with rank 0");
}

Status MpiWorker::run() {
  header_.resize(kHeaderLen);
  for (;;) {
    MPI_Request req;
    if (MPI_Ibcast(header_.data(), static_cast<int>(kHeaderLen), MPI_INT64_T, 0, MPI_COMM_WORLD, &req) !=
        MPI_SUCCESS)
      return Status(StatusCode::kInternal, "MPI_Ibcast failed");
    group_.wait(&req, "waiting for the next step", true);
    const int64_t op = header_[0];
    if (op == kStop) return Status::ok();
    if (op == kCopyBlock) {
      cache_.copy_block(header_[1], header_[2]);
      continue;
    }
    if (op == kStageBlock) {
      stage_block(static_cast<int32_t>(header_[1]),
                  BlockHash{static_cast<uint64_t>(header_[2]), static_cast<uint64_t>(header_[3])});
      continue;
    }
    if (op == kCancelLoad) {
      cancel_load(static_cast<uint64_t>(header_[1]));
      continue;
    }
    if (op == kFinishLoad) {
      finish_load(static_cast<uint64_t>(header_[1]));
      continue;
    }
    if (op != kForward && op != kStartLoad)
      return Status(StatusCode::kInternal, "tensor parallel: unknown step message " + std::to_string(op));
    payload_.resize(static_cast<size_t>(header_[5]));
    if (op == kStartLoad && payload_.size() != 3 * static_cast<size_t>(header_[2]))
      return Status(StatusCode::kInternal, "tensor parallel: a KV load's blocks do not add up");
    if (MPI_Ibcast(payload_.data(), static_cast<int>(payload_.size()), MPI_INT64_T, 0, MPI_COMM_WORLD,
                   &req) != MPI_SUCCESS)
      return Status(StatusCode::kInternal, "MPI_Ibcast failed");
    group_.wait(&req, "receiving a step's batch", false);
    if (op == kStartLoad) {
      start_load(static_cast<uint64_t>(header_[1]));
      continue;
    }
    const auto n = static_cast<size_t>(header_[1]), num_seqs = static_cast<size_t>(header_[2]);
    const auto rows = static_cast<size_t>(header_[3]), entries = static_cast<size_t>(header_[4]);
    if (payload_.size() != 4 * n + rows + 4 * num_seqs + entries)
      return Status(StatusCode::kInternal, "tensor parallel: a step's batch does not add up");
    const int64_t* p = payload_.data();
    auto take = [&](auto& out, size_t count) {
      out.resize(count);
      for (size_t i = 0; i < count; ++i)
        out[i] = static_cast<typename std::decay_t<decltype(out)>::value_type>(*p++);
    };
    take(ids_, n);
    take(positions_, n);
    take(token_sequence_, n);
    take(slots_, n);
    take(logit_rows_, rows);
    sequences_.resize(num_seqs);
    lens_.resize(num_seqs);
    for (size_t s = 0; s < num_seqs; ++s, p += 4) {
      sequences_[s].query_start = p[0];
      sequences_[s].num_queries = p[1];
      sequences_[s].context_len = p[2];
      lens_[s] = p[3];
    }
    take(tables_, entries);
    size_t at = 0;
    for (size_t s = 0; s < num_seqs; ++s) {
      sequences_[s].block_table =
          std::span<const int32_t>(tables_).subspan(at, static_cast<size_t>(lens_[s]));
      at += static_cast<size_t>(lens_[s]);
    }
    const ForwardBatch fb{ids_, positions_, slots_, token_sequence_, sequences_, logit_rows_};
    // A batch forward() refuses is refused on every rank before any collective (the checks see
    // the same data), and rank 0 reports it: this rank just waits for the next step.
    if (Status s = model_.forward(fb, cache_, {}); !s.is_ok())
      log_debug("tensor parallel: a step was refused: " + s.message());
  }
}

}  // namespace inferd
