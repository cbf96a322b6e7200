// Scheduler: decides each step which requests run and how many of their tokens, within a token
// budget, a sequence limit and the KV blocks free, preempting when blocks run out. The engine
// loop calls schedule() then, after the model ran, update(). Engine thread only.
//
//   waiting (priority, arrival) ──admit──▶ running ──finish/abort──▶ freed
//     │  ▲  ▲                                 │
//     │  │  └────────── preempt (blocks freed, recomputed later) ◀──┘
//     │  └── landed / failed (recompute) / timed out (recompute) ──┐
//     └─ KV elsewhere (block source) ──▶ waiting for KV ───────────┘  (or failed, by policy)
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "engine/ngram_proposer.h"
#include "engine/request.h"
#include "engine/slo.h"
#include "kv/kv_cache_manager.h"

namespace inferd {

enum class SchedulePolicy {
  kDecodeFirst,   // running requests first, then fill the budget with waiting prefills
  kPrefillFirst,  // admit waiting prefills first (up to max_prefill_tokens), then decodes
  // Each step, prefill-first or decode-first by MindIE's select-batch rule, from measured step
  // times: prefill when (prefill seconds per request x running decodes that would wait) <=
  // (decode step seconds x waiting requests that free batch slots could take).
  kAdaptive,
};

// What a KV load that fails or times out does to its request.
enum class KvLoadFailure {
  kRecompute,  // the request computes what did not arrive (never lost, never hung)
  kFail,       // the request ends with an error naming the failure
};

// Speculative decoding: a decoding request proposes drafts that its next step computes and the
// engine verifies (vLLM's --speculative-config). kNgram: prompt lookup (engine/ngram_proposer.h),
// proposed here while the step is planned. kDraftModel: a smaller model of the same vocabulary
// (engine/draft_proposer.h); the plan reserves num_speculative_tokens positions, which the engine
// fills with the draft model's greedy continuation before the step runs.
enum class SpeculativeMethod { kNgram, kDraftModel };

struct SpeculativeOptions {
  bool enabled = false;
  SpeculativeMethod method = SpeculativeMethod::kNgram;
  NgramOptions ngram;       // its num_speculative_tokens is k for either method
  std::string draft_model;  // kDraftModel: the draft's path (the caller loads it)
  // Draft only while at most this many requests run: past it a step is compute-bound and the
  // rows of rejected drafts cost more than accepted ones save (vLLM's disable_by_batch_size).
  int64_t disable_by_batch_size = 4;
  Status validate() const;
};

struct SchedulerOptions {
  int64_t max_num_batched_tokens = 2048;  // tokens per step
  int64_t max_num_seqs = 64;              // running requests at once
  int64_t max_prefill_tokens = 2048;      // prefill tokens per step under kPrefillFirst
  SchedulePolicy policy = SchedulePolicy::kDecodeFirst;
  int64_t max_model_len = 4096;        // prompt + output must fit
  double session_ttl_seconds = 300;    // how long a session's last turn stays pinned
  double session_max_share = 0.5;      // of the KV pool that session pins may hold
  double kv_load_timeout_seconds = 5;  // a KV load not landed by then is given up (policy below)
  KvLoadFailure kv_load_failure = KvLoadFailure::kRecompute;
  SpeculativeOptions speculative;
  // SLO classes (engine/slo.h; empty: off). On, every request has a class whose rank is its
  // priority, and each step serves the ranks in order: a rank's running requests and admissions
  // (by the policy) before the next rank's; a waiting request may preempt a running one of a
  // lower rank for its KV blocks or its sequence slot.
  SloClasses slo;

  Status validate() const;
};

struct ScheduledItem {
  Request* request;              // not owned
  int64_t num_new_tokens;        // tokens of this request computed in this step
  int64_t num_draft_tokens = 0;  // of which speculative drafts (the request's draft)
};

// One step's plan: plain data for the model runner.
struct ScheduledBatch {
  std::vector<ScheduledItem> items;
  std::vector<RequestId> preempted;  // sent back to waiting this step
  int64_t num_tokens = 0;
  bool empty() const { return items.empty(); }
};

// Prompt tokens a step computes for a request that asked for prompt logprobs, and for all such
// requests together: each is a row of logits (256 rows of a 152k vocabulary: 156 MB).
inline constexpr int64_t kPromptLogprobsChunk = 64;
inline constexpr int64_t kPromptLogprobsRowsPerStep = 256;

class Scheduler final {
 public:
  // kv: not owned.
  Scheduler(const SchedulerOptions& options, KVCacheManager& kv);

  // Queues a request. A request that arrives with `error` set, or that can never fit (longer than
  // max_model_len or than the whole KV pool) is finished at once with kError and returned by take_finished().
  void add(std::unique_ptr<Request> request);
  // Adds a request forked from a running one: its prompt is computed (its blocks already in
  // `kv`) and `first_token` is its first output, checked for stop / length at once.
  void add_forked(std::unique_ptr<Request> request, int32_t first_token);
  // Finishes a request wherever it is (kAborted) and frees its blocks now.
  void abort(RequestId id);
  // Finishes a request wherever it is with kError and `message`, freeing its blocks now.
  void fail(RequestId id, std::string message);

  // Where requests with remote_kv pull their KV from (not owned; nullptr: such requests compute).
  void set_remote_source(RemoteKvSource* source) { remote_ = source; }

  // Plans the next step.
  ScheduledBatch schedule();
  // The same into `batch` (its storage reused: no allocation once it has held a batch this large).
  void schedule(ScheduledBatch* batch);

  // Records the step: computed tokens advance; each item whose request reached the end of its
  // known tokens gets the sampled token appended (sampled[i] belongs to items[i]; ignored for
  // items still prefilling). Requests that finish free their blocks. An item with drafts first
  // gets its first accepted[i] drafts appended (the engine verified them; the K/V of the rest is
  // dropped: those positions count as not computed); `accepted` empty: none accepted.
  void update(const ScheduledBatch& batch, std::span<const int32_t> sampled,
              std::span<const int32_t> accepted = {});

  // Feeds the adaptive policy with how long a step took (engine thread, after update()).
  void observe_step(const ScheduledBatch& batch, double seconds);
  // The rule kAdaptive applies; exposed for tests and metrics.
  bool adaptive_prefers_prefill() const;
  // Steps the adaptive policy ran prefill-first and decode-first (kAdaptive only).
  struct AdaptiveChoices {
    int64_t prefill_first = 0, decode_first = 0;
  };
  AdaptiveChoices adaptive_choices() const { return adaptive_choices_; }
  // Prompt tokens computed per second of the steps that computed prompts (moving average; 0 until
  // one ran): what the time to a waiting request's first token is estimated from.
  double prefill_tokens_per_second() const { return prefill_tokens_per_second_; }
  // A step's seconds (moving average over steps that ran something; 0 until one ran).
  double step_seconds() const { return step_seconds_; }
  // The step-time model t = fixed + per_token x tokens, fitted by least squares over moving
  // averages of the steps run; fixed is 0 until steps of different sizes were seen.
  double step_fixed_seconds() const;
  double step_seconds_per_token() const;
  // Prompt tokens the waiting requests still have to compute.
  int64_t num_waiting_tokens() const;
  // Prompt tokens still to compute (waiting and running requests with more than one token to go),
  // by priority value (index; negative priorities left out). Resized to fit; zeroed first.
  void queued_prefill_tokens(std::vector<int64_t>* by_priority) const;

  // Requests finished since the last call (ownership passes to the caller).
  std::vector<std::unique_ptr<Request>> take_finished();

  // Whether the request is waiting or running.
  bool contains(RequestId id) const { return requests_.count(id) != 0; }
  int64_t num_waiting() const { return static_cast<int64_t>(waiting_.size()); }
  // Sequences the waiting requests stand for: a request whose n samples are not forked yet counts n.
  int64_t num_waiting_sequences() const;
  int64_t num_running() const { return static_cast<int64_t>(running_.size()); }
  // Requests waiting for their KV to land (kWaitingForKv).
  int64_t num_waiting_for_kv() const { return num_waiting_for_kv_; }
  // KV loads in flight, those of finished or timed-out requests included (their blocks return
  // when the source reports them).
  int64_t num_kv_loads() const { return static_cast<int64_t>(loads_.size()); }
  int64_t num_preemptions() const { return num_preemptions_; }
  // KV loads that failed / timed out (each handled by kv_load_failure).
  int64_t num_kv_load_failures() const { return num_kv_load_failures_; }
  int64_t num_kv_load_timeouts() const { return num_kv_load_timeouts_; }
  bool has_work() const { return !waiting_.empty() || !running_.empty() || !loads_.empty(); }
  // Whether the next schedule() may run something (false when only KV loads are pending).
  bool has_runnable() const { return !waiting_.empty() || !running_.empty(); }

 private:
  // level: only the requests of that priority (SLO classes), else all.
  void schedule_running(ScheduledBatch* batch, int64_t* budget, std::optional<int32_t> level = std::nullopt);
  // Sets r->draft for this step (cleared when r does not speculate now).
  void propose_draft(Request* r, int64_t budget);
  // Admits from the front of waiting_ (of priority `level` only, when given); false when the front
  // request could not be admitted (nothing behind it may be).
  bool admit_waiting(ScheduledBatch* batch, int64_t* budget, int64_t prefill_cap,
                     std::optional<int32_t> level = std::nullopt);
  // Starts a load of the request's KV past its cached prefix when the block source may hold it;
  // true when the request now waits for it.
  bool start_kv_load(Request* r);
  // Starts the pull of a disaggregated request's prompt KV past its cached prefix; false when
  // there is nothing to pull or no source. Sets *no_room when the pool lacks the blocks now.
  bool start_remote_load(Request* r, bool* no_room);
  void track_load(Request* r, bool remote, uint64_t ticket, std::vector<BlockHash> keys,
                  std::vector<int32_t> blocks, int64_t last_block_tokens);
  static uint64_t load_key(bool remote, uint64_t ticket) { return ticket * 2 + (remote ? 1 : 0); }
  void cancel_load(uint64_t key, bool timed_out);
  // Requests whose loads landed, failed or timed out go back to waiting (or fail, by policy).
  void poll_kv_loads();
  // The request stops waiting for its load: back to the waiting queue, or failed by policy.
  void end_kv_wait(Request* r, int64_t covered_tokens, const std::string& failure);
  // Preempts the lowest-priority, latest running request other than `keep` whose priority
  // value is above `above_priority`; false when there is none.
  bool preempt_one(const Request* keep, int32_t above_priority, ScheduledBatch* batch, int64_t* budget);
  void preempt(Request* victim, ScheduledBatch* batch, int64_t* budget);
  // r joins running_ (admitted, or forked): its output and block table are reserved for the
  // most tokens it can reach, so that the steps that run it do not allocate.
  void start_running(Request* r);
  void finish(Request* r, FinishReason reason);
  // Appends a sampled token to a running request and finishes it on a stop token or at its length.
  void accept_token(Request* r, int32_t token);
  void insert_waiting(Request* r);
  // Its tokens, and the root of their blocks' keys: the adapter's fingerprint, mixed with the
  // sliding window's sizes for a StreamingLLM request (whose K/V past the window differ from
  // full attention's), so requests share blocks only where their K/V are the same; and with the
  // request's cache salt, so they share them only with requests of the same salt.
  static KVCacheManager::Tokens tokens_of(const Request& r) {
    BlockHash root = r.lora ? BlockHash{r.lora->fingerprint_lo, r.lora->fingerprint_hi} : BlockHash{};
    root.lo ^= r.cache_salt.lo;
    root.hi ^= r.cache_salt.hi;
    if (r.streaming.enabled()) {
      root.lo ^= mix64(0x53545245414d4c4cULL ^ static_cast<uint64_t>(r.streaming.window_tokens));
      root.hi ^= mix64(0x53494e4b544f4b4eULL ^ static_cast<uint64_t>(r.streaming.sink_tokens));
    }
    return {r.prompt, r.output, root};
  }
  // splitmix64's finalizer.
  static uint64_t mix64(uint64_t x) {
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
  }
  // A StreamingLLM request: gives back the blocks between its sink and the window of the first
  // token it computes next; caps that step's new tokens at the window.
  void evict_outside_window(Request* r);
  // The most of its n uncomputed tokens r may compute this step: a StreamingLLM request's window;
  // a request that still owes prompt logprobs kPromptLogprobsChunk and the step's rows left (0:
  // it waits for the next step), each such token being a row of logits (vocabulary-sized).
  int64_t step_cap(const Request& r, int64_t n) const {
    if (r.wants_prompt_logprobs()) n = std::min({n, kPromptLogprobsChunk, prompt_rows_left_});
    return r.streaming.enabled() ? std::min(n, r.streaming.window_tokens) : n;
  }

  SchedulerOptions options_;
  KVCacheManager& kv_;
  std::unordered_map<RequestId, std::unique_ptr<Request>> requests_;
  std::deque<Request*> waiting_;   // ordered by (priority, arrival)
  std::vector<Request*> running_;  // in admission order
  std::vector<std::unique_ptr<Request>> finished_;
  int64_t num_preemptions_ = 0;
  int64_t prompt_rows_left_ = 0;  // this step's rows for prompt logprobs (kPromptLogprobsRowsPerStep)
  struct KvLoad {
    Request* request;  // nullptr once it finished or timed out: the blocks are released on landing
    std::vector<BlockHash> keys;
    std::vector<int32_t> blocks;
    std::chrono::steady_clock::time_point deadline;
    int64_t last_block_tokens = -1;  // a remote pull's partly filled last block (-1: all full)
  };
  std::unordered_map<uint64_t, KvLoad> loads_;  // by load_key(remote, ticket)
  RemoteKvSource* remote_ = nullptr;
  std::vector<BlockHash> remote_keys_;           // scratch
  std::vector<KvBlockSource::Finished> landed_;  // scratch
  int64_t num_waiting_for_kv_ = 0, num_kv_load_failures_ = 0, num_kv_load_timeouts_ = 0;
  AdaptiveChoices adaptive_choices_;
  int64_t step_ = 0;
  // Exponential moving averages of measured step costs (0 until first seen).
  double prefill_seconds_per_request_ = 0;
  double decode_step_seconds_ = 0;
  double prefill_tokens_per_second_ = 0;
  double step_seconds_ = 0;
  // Moving averages of n (tokens), t (seconds), n^2 and n t over steps, for the step-time model.
  double fit_n_ = 0, fit_t_ = 0, fit_nn_ = 0, fit_nt_ = 0;
  bool fit_started_ = false;
  // SLO classes: a step's tokens are capped so that it lasts no longer than the tightest TPOT, and
  // than kSloTtftShare of the tightest TTFT, of the classes with requests here now or within the
  // last kSloRecentSeconds (at the measured prefill rate; never below kSloMinStepTokens or a
  // token per running request). Sarathi-Serve's token budget, chosen from the SLOs.
  static constexpr double kSloTtftShare = 0.25;
  static constexpr double kSloRecentSeconds = 10;
  static constexpr int64_t kSloMinStepTokens = 32;
  int64_t slo_step_tokens();
  std::vector<std::chrono::steady_clock::time_point> slo_last_seen_;  // per class
  std::vector<int32_t> levels_;  // scratch: the priorities present this step (SLO classes)
  std::vector<Request*> order_;  // scratch: running_ as a step began scheduling it
};

}  // namespace inferd
