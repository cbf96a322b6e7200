// Engine: the step loop of continuous batching — schedule → execute → sample → update → emit.
// This class is the synchronous core driven by one thread (tests, offline batch); the threaded
// front end with submit/abort queues wraps it. Engine thread only.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/status.h"
#include "engine/draft_proposer.h"
#include "engine/mask_prefetcher.h"
#include "engine/model_runner.h"
#include "engine/scheduler.h"
#include "engine/step_mirror.h"
#include "kv/block_pool.h"
#include "kv/kv_cache.h"
#include "kv/kv_cache_manager.h"
#include "kv/kv_export_store.h"
#include "kv/kv_offloader.h"
#include "kv/kv_record.h"
#include "model/transformer.h"

namespace inferd {

// The batch window (--batch-window): how long a step that would only prefill new arrivals (no
// request running) may wait for more of them to join it. kOff: never; kFixed: up to
// batch_window_seconds after the first arrival; kAuto: a window chosen each time from the measured
// arrival rate and step-time model (AsyncEngine: held only while arrivals come faster than one per
// step's fixed cost, at most that cost).
enum class BatchWindowMode { kOff, kAuto, kFixed };

struct EngineOptions {
  SchedulerOptions scheduler;
  BatchWindowMode batch_window = BatchWindowMode::kOff;
  double batch_window_seconds = 0;  // kFixed
  int32_t block_size = 16;
  int64_t num_kv_blocks = 256;
  KvDType kv_dtype = KvDType::kF16;  // K/V storage; attention math is f32
  bool prefix_caching = true;        // reuse full KV blocks of earlier requests by content
  KvOffloadOptions offload;          // disk / Redis tiers for cached blocks (needs prefix_caching)
  // What a step cost, as the adaptive policy learns it; unset: the step's wall time. Wall time on
  // a shared machine is noisy, so tests that assert the policy's choices give it a cost model.
  std::function<double(const ScheduledBatch&)> step_cost;
  // Compute constrained rows' grammar masks on a thread of their own during the forward pass
  // (MaskPrefetcher); off: at sampling time, on the step's critical path (for measuring).
  bool prefetch_grammar_masks = true;
  // Prefill side of disaggregation: where requests with a kv_export_id leave their prompt's KV
  // for a pull (not owned; nullptr: no exports).
  KvExportStore* kv_export = nullptr;
  // Decode side: makes the source requests with remote_kv pull from, over the engine's cache.
  std::function<Expected<std::unique_ptr<RemoteKvSource>>(KvCache&, const KvStoreIdentity&)> remote_kv;
  // Tensor/pipeline parallelism: the other ranks, which mirror every forward pass, KV block copy
  // and offload tier step (not owned; nullptr: one process). Each rank's cache holds only its
  // slice of a block, so disaggregation, which moves whole blocks, is refused with it for now.
  StepMirror* step_mirror = nullptr;
  // This rank's place in the job: names its offload store (each rank's slice in a store of its own).
  KvShard kv_shard;
  // Speculative decoding with a draft model (scheduler.speculative.method kDraftModel): the model
  // that proposes, of the target's vocabulary (not owned; required then: validate() runs before
  // the caller loads it, so the engine's constructor checks it). Its KV pool has num_kv_blocks blocks of
  // its own layers, in kv_dtype. Runs on this process only (other ranks mirror the target's steps).
  Transformer* draft_model = nullptr;

  Status validate() const;
};

// What one step produced for one request.
struct StepOutput {
  RequestId id = 0;
  int32_t index = 0;  // which of the request's n samples (0 when n = 1)
  std::vector<int32_t> new_tokens;
  std::vector<float> logprobs;  // one per new token when the request asked for logprobs
  std::vector<std::vector<std::pair<int32_t, float>>> top_logprobs;
  // sampling.prompt_logprobs: the log-probabilities of the prompt tokens from index
  // prompt_logprobs_from on that this step computed (each with its rank and the top k).
  int64_t prompt_logprobs_from = 0;
  std::vector<int32_t> prompt_tokens;
  std::vector<float> prompt_logprobs;
  std::vector<int64_t> prompt_ranks;
  std::vector<std::vector<std::pair<int32_t, float>>> prompt_top_logprobs;
  std::optional<std::chrono::steady_clock::time_point> first_scheduled;  // when the request first ran
  int64_t cached_tokens = 0;  // with first_scheduled: the prompt tokens the prefix cache held then
  // Drafts of the request's prediction (RequestSpec::prediction) this step verified, and how
  // many of them it kept.
  int32_t predicted_tokens = 0;
  int32_t accepted_predicted_tokens = 0;
  // An embedding request (RequestSpec::pooling): its embedding, in the output that finishes it.
  std::vector<float> embedding;
  bool finished = false;                      // this sample is done; with n > 1 each sample finishes once
  std::optional<FinishReason> finish_reason;  // set exactly when finished
  std::string error;
  bool internal = false;  // with error: the server failed (500), not the request (400)
};

// Where the engine thread's time went (seconds, summed over steps).
struct EngineStats {
  int64_t steps = 0;
  int64_t tokens = 0;           // tokens computed
  double schedule_seconds = 0;  // schedule + update + finishing: the bookkeeping
  double execute_seconds = 0;   // the forward pass
  double sample_seconds = 0;
  double mask_wait_seconds = 0;  // after the forward pass, waiting for prefetched grammar masks
  // Steps in which every request computed exactly one generated token (no prompt tokens): the
  // figures of decode throughput.
  int64_t decode_steps = 0;
  int64_t decode_tokens = 0;  // tokens they generated
  double decode_seconds = 0;  // their whole step time (bookkeeping included)
  // Speculative decoding: verifications (a request's drafts in one step), drafts proposed, drafts
  // accepted (vLLM's spec_decode_num_drafts / num_draft_tokens / num_accepted_tokens).
  int64_t spec_drafts = 0;
  int64_t spec_draft_tokens = 0;
  int64_t spec_accepted_tokens = 0;
  // Draft model: its forward passes and their time (part of schedule_seconds: before the step).
  int64_t spec_draft_passes = 0;
  double spec_draft_seconds = 0;
  double total_seconds() const { return schedule_seconds + execute_seconds + sample_seconds; }
};

struct RequestSpec {
  std::vector<int32_t> prompt;
  SamplingParams sampling;
  GenerationLimits limits;
  int32_t priority = 0;
  // An SLO class of EngineOptions::scheduler.slo (-1: the class `priority` maps to when classes
  // are configured; ignored otherwise). Its rank replaces `priority`.
  int32_t slo_class = -1;
  std::string session_id;  // session context pool: the next turn of this session reuses this one's KV
  int32_t n = 1;           // independent samples of the prompt, sharing its KV blocks (1..kMaxSamples)
  // The LoRA adapter its tokens run with (null: the base); needs EngineOptions::enable_lora.
  std::shared_ptr<const LoraAdapter> lora;
  // StreamingLLM: attention sinks + a sliding window, the KV between them given back (off: full
  // attention).
  StreamingWindow streaming;
  // Prefill side of disaggregation: non-zero keeps the prompt's KV in EngineOptions::kv_export
  // under this id once computed.
  uint64_t kv_export_id = 0;
  // Decode side: the prompt's KV is pulled from a prefill instance, which sampled `first_token`
  // (this request's first output, emitted at the next step).
  std::optional<RemoteKvRef> remote_kv;
  int32_t first_token = -1;
  // OpenAI's predicted outputs: text the output is expected to repeat, as tokens. The scheduler
  // drafts from it (speculative decoding, with or without a speculative config): the output is
  // what it would be without, only sooner where the prediction is right.
  std::shared_ptr<const std::vector<int32_t>> prediction;
  // vLLM's cache_salt (cache_salt_key()): its prefix-cache blocks are shared only with requests of
  // the same salt. Zero: none.
  BlockHash cache_salt;
  // An embedding request instead of a generation: the prompt's final hidden states pooled so
  // (StepOutput::embedding), L2-normalized when normalize_embedding; no token is sampled.
  // Needs n = 1, no disaggregation, prediction or StreamingLLM window, and one process.
  Pooling pooling = Pooling::kNone;
  bool normalize_embedding = true;
};

inline constexpr int32_t kMaxSamples = 128;

// A step's outputs in storage the engine reuses: each slot keeps its vectors' capacity from step
// to step, so a step with no more outputs than an earlier one allocates nothing for them.
class StepOutputs final {
 public:
  // Empties the list; the slots keep their storage.
  void clear() { size_ = 0; }
  // Appends an output with every field at its default (taking a used slot when there is one).
  StepOutput& add();
  // Makes sure there are slots for `n` outputs (beyond those added), each with room for `tokens`
  // new tokens.
  void reserve(size_t n, size_t tokens);
  std::span<const StepOutput> view() const { return {slots_.data(), size_}; }
  std::span<StepOutput> view() { return {slots_.data(), size_}; }

 private:
  std::vector<StepOutput> slots_;
  size_t size_ = 0;
};

// How many finished outputs a request gets: n, or 1 when n is out of range (the request fails).
inline int32_t num_finished_outputs(const RequestSpec& spec) {
  return spec.n >= 1 && spec.n <= kMaxSamples ? spec.n : 1;
}

class Engine final {
 public:
  // model: not owned. Allocates the KV cache once, here.
  Engine(Transformer& model, const EngineOptions& options);

  // Queues a request; it joins at the next step. Returns its id (`id` when given: callers that
  // hand out ids themselves must keep them unique and below 2^63, which the engine keeps for the
  // samples it forks).
  RequestId add(RequestSpec spec, std::optional<RequestId> id = std::nullopt);
  // Ends a request (all its samples) now and frees its blocks.
  void abort(RequestId id);
  // Ends one sample of a request (e.g. a stop string matched in it).
  void abort(RequestId id, int32_t index);
  // Runs one step (nothing when idle) and returns the outputs of the requests it touched, valid
  // until the next step(). Once warm, a step of requests that only decode allocates nothing
  // (tests/engine/hot_loop_alloc_test.cpp), apart from top log-probabilities when asked for.
  std::span<const StepOutput> step();

  bool has_work() const { return scheduler_.has_work(); }
  const Scheduler& scheduler() const { return scheduler_; }
  const BlockPool& block_pool() const { return pool_; }
  const KVCacheManager& kv_cache_manager() const { return kv_; }
  const EngineStats& stats() const { return stats_; }
  // The draft model's proposer (nullptr unless speculating with one).
  const DraftProposer* drafter() const { return drafter_.get(); }
  // The offload tiers, or nullptr when none is configured (or they could not be opened).
  const KvOffloader* offloader() const { return offloader_.get(); }
  // Whether cold cached blocks wait for the offload tiers while no request runs: the owner of
  // the loop calls offload_idle() now and then until this is false.
  bool has_offload_work() const { return offloader_ && offloader_->has_cold_work(pool_); }
  void offload_idle();
  // Waits until the offload tiers stored every block staged so far (tests, benchmarks).
  void flush_offload() {
    if (offloader_) offloader_->flush();
  }
  // What this engine's KV blocks are: model fingerprint and cache layout (records, transfers).
  const KvStoreIdentity& kv_identity() const { return identity_; }
  // Why the remote KV source could not be made (ok when none was asked for, or it was).
  const Status& remote_kv_status() const { return remote_status_; }
  // The remote KV source's counters (nullptr without one); thread-safe.
  const KvTransferStats* remote_kv_stats() const { return remote_ ? &remote_->stats() : nullptr; }
  int64_t max_tokens_in_cache() const {
    return pool_.num_blocks() * static_cast<int64_t>(options_.block_size);
  }

 private:
  void collect_finished();
  // This step's prompt logprobs (ModelRunner::prompt_rows) into the requests' outputs.
  void emit_prompt_logprobs(const ScheduledBatch& batch);
  // This step's pooled hidden states (ModelRunner::pool_rows) into the embedding requests' sums;
  // the embedding of each whose prompt this step completed into its output.
  void emit_embeddings(const ScheduledBatch& batch);
  // Seals the blocks of r's prompt into the export store under r.kv_export_id.
  void export_prompt_kv(const Request& r);
  // Forks samples 1..n-1 of `parent` after its prompt was computed, sampling each one's first
  // token from the same logits row; appends their outputs.
  void fork_samples(Request& parent, std::span<const float> logits);
  // The internal ids of a request's samples (n > 1 only); index i at position i.
  std::unordered_map<RequestId, std::vector<RequestId>> samples_;
  RequestId next_sample_id_ = RequestId{1} << 63;

  // This step's sequences whose grammar or masks allowed no token, with Sampler::dead_end_error().
  std::vector<std::pair<RequestId, std::string>> dead_ends_;
  EngineOptions options_;
  Transformer& model_;
  KvCache cache_;
  BlockPool pool_;
  KVCacheManager kv_;
  Scheduler scheduler_;
  ModelRunner runner_;
  std::unordered_map<RequestId, Sampler> samplers_;
  // After samplers_ (destroyed first): this step's constrained samplers, masked during the forward.
  MaskPrefetcher masks_;
  std::vector<Sampler*> prefetch_;
  RequestId next_id_ = 1;
  uint64_t next_arrival_ = 0;
  std::vector<int32_t> sampled_;
  std::vector<int32_t> accepted_;  // [item] its drafts accepted this step
  std::vector<int32_t> history_;   // a verified request's output so far, drafts accepted included
  EngineStats stats_;
  KvStoreIdentity identity_;
  std::vector<StepOutput> pending_outputs_;  // first tokens of disaggregated requests, for the next step
  StepOutputs outputs_;                      // what step() returns
  ScheduledBatch batch_;                     // the step's plan (storage reused)
  Status remote_status_;
  std::unique_ptr<RemoteKvSource> remote_;          // refers to cache_
  std::unique_ptr<KvOffloader> offloader_;          // last: it refers to cache_ and pool_
  std::unique_ptr<KvBlockSource> mirrored_source_;  // refers to offloader_ (with a step mirror)
  std::unique_ptr<DraftProposer> drafter_;          // draft-model speculation only
};

}  // namespace inferd
