// AsyncEngine: the engine on its own thread. Any thread may submit() or abort(); a request
// submitted mid-run joins at the next step; outputs are delivered to each request's callback
// on the engine thread (which must return quickly: push to a queue, never block on I/O).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <vector>

#include "engine/engine.h"

namespace inferd {

class AsyncEngine final {
 public:
  using OutputCallback = std::function<void(const StepOutput&)>;

  // model: not owned. Starts the engine thread.
  AsyncEngine(Transformer& model, const EngineOptions& options);
  // Aborts what is left and joins the engine thread.
  ~AsyncEngine();
  AsyncEngine(const AsyncEngine&) = delete;
  AsyncEngine& operator=(const AsyncEngine&) = delete;

  // Queues a request; its outputs go to `on_output` (each of its n samples ends with one output
  // with finished = true).
  // Thread-safe.
  RequestId submit(RequestSpec spec, OutputCallback on_output);
  // Ends a request at the next step boundary and frees its blocks there. Thread-safe; unknown
  // or finished ids are ignored.
  void abort(RequestId id);
  // Ends one sample of a request (n > 1), e.g. when a stop string matched in it. Thread-safe.
  void abort(RequestId id, int32_t index);

  // Ends every request with `message` as a server error (500): what a job that can not go on
  // tells its clients before it ends (a tensor-parallel rank stopped answering). The engine
  // thread only (it is where a forward pass finds out); elsewhere it only logs.
  void fail_all(const std::string& message);

  // Counters for metrics, updated after every step. Thread-safe.
  int64_t num_running() const { return num_running_.load(); }
  int64_t num_waiting() const { return num_waiting_.load(); }
  // Sequences (each prompt's n samples) submitted and not yet running: those still in the
  // submission queue and those the scheduler holds waiting. What a queue limit counts. Thread-safe.
  int64_t num_queued_sequences() const {
    return num_submitted_sequences_.load() + num_waiting_sequences_.load();
  }
  int64_t num_free_blocks() const { return num_free_blocks_.load(); }
  int64_t num_blocks() const { return engine_.block_pool().num_blocks(); }
  int64_t num_preemptions() const { return num_preemptions_.load(); }
  int64_t prefix_query_tokens() const { return prefix_queries_.load(); }
  int64_t prefix_hit_tokens() const { return prefix_hits_.load(); }
  int64_t num_sessions() const { return sessions_.load(); }
  int64_t num_pinned_blocks() const { return pinned_blocks_.load(); }
  // Freed cached blocks taken back from the pool's free queue by a prefix hit.
  int64_t num_revived_blocks() const { return revived_blocks_.load(); }
  // The offload tiers (nullptr when none); their counters are safe to read from any thread.
  const KvOffloader* offloader() const { return engine_.offloader(); }
  // Set at construction, then read-only: safe from any thread.
  const KvStoreIdentity& kv_identity() const { return engine_.kv_identity(); }
  const Status& remote_kv_status() const { return engine_.remote_kv_status(); }
  const KvTransferStats* remote_kv_stats() const { return engine_.remote_kv_stats(); }
  // KV loads that failed / timed out so far (tier loads and pulls). Thread-safe.
  int64_t num_kv_load_failures() const { return kv_load_failures_.load(); }
  int64_t num_kv_load_timeouts() const { return kv_load_timeouts_.load(); }
  // Speculative decoding so far (EngineStats' spec_*). Thread-safe.
  int64_t num_spec_drafts() const { return spec_drafts_.load(); }
  int64_t num_spec_draft_tokens() const { return spec_draft_tokens_.load(); }
  int64_t num_spec_accepted_tokens() const { return spec_accepted_tokens_.load(); }

  // The batch window in force (seconds; 0: steps start at once): the fixed one, or auto's latest
  // choice. Thread-safe.
  double batch_window_seconds() const { return window_seconds_.load(); }
  // Requests submitted per second (a moving average over windows of at least a second). Thread-safe.
  double arrival_rate() const { return request_rate_.load(); }

  // SLO classes (EngineOptions::scheduler.slo): set at construction, read-only after.
  const SloClasses& slo_classes() const { return slo_; }
  // How long a new request of SLO class `slo_class` with `prompt_tokens` would wait for its first
  // token at the current load: the prompt tokens queued at its rank and better (submitted, waiting,
  // and running prefills) plus its own, at the measured prefill rate less the rate at which better
  // ranks' prompt tokens arrive (they will go first), plus the step in flight.
  // Absent while nothing is measured yet (or without classes). Thread-safe.
  std::optional<double> estimated_ttft_seconds(size_t slo_class, int64_t prompt_tokens) const;

 private:
  struct Submission {
    RequestId id;
    RequestSpec spec;
    OutputCallback callback;
  };
  void loop();
  void take_commands();

  Engine engine_;  // engine thread only, after construction
  std::mutex mutex_;
  std::condition_variable wake_;
  std::vector<Submission> submissions_;                // guarded by mutex_
  std::vector<std::pair<RequestId, int32_t>> aborts_;  // (id, sample or -1 for all); guarded by mutex_
  bool stopping_ = false;                              // guarded by mutex_
  std::atomic<RequestId> next_id_{1};
  struct Listener {
    OutputCallback callback;
    int32_t unfinished;  // samples still running
    int32_t samples;     // n
  };
  std::unordered_map<RequestId, Listener> callbacks_;  // engine thread only
  std::atomic<int64_t> num_running_{0}, num_waiting_{0}, num_free_blocks_{0}, num_preemptions_{0},
      prefix_queries_{0}, prefix_hits_{0}, sessions_{0}, pinned_blocks_{0}, revived_blocks_{0},
      num_submitted_sequences_{0}, num_waiting_sequences_{0}, kv_load_failures_{0}, kv_load_timeouts_{0},
      spec_drafts_{0}, spec_draft_tokens_{0}, spec_accepted_tokens_{0};
  SloClasses slo_;
  // Per class rank: prompt tokens of submissions not yet taken, and of the scheduler's waiting and
  // running prefills (published after each step).
  std::unique_ptr<std::atomic<int64_t>[]> submitted_tokens_, queued_tokens_;
  std::vector<int64_t> queued_scratch_;  // engine thread
  // Per class rank: prompt tokens submitted so far, and their arrival rate (tokens per second,
  // a moving average over windows of at least a second, updated by the engine thread).
  std::unique_ptr<std::atomic<int64_t>[]> arrived_tokens_;
  std::unique_ptr<std::atomic<double>[]> arrival_rate_;
  std::vector<int64_t> arrived_seen_;  // engine thread: arrived_tokens_ at the last rate update
  std::chrono::steady_clock::time_point rate_updated_;
  void update_arrival_rates();
  // The batch window: true when it waited (for more arrivals or until the window closed) instead
  // of stepping; the loop then takes what came and asks again.
  bool hold_for_window();
  double choose_window() const;
  BatchWindowMode window_mode_;
  double window_fixed_ = 0, window_cap_ = 0;
  std::atomic<double> window_seconds_{0}, request_rate_{0};
  std::atomic<int64_t> arrived_requests_{0};
  int64_t arrived_requests_seen_ = 0;
  std::optional<std::chrono::steady_clock::time_point> hold_since_;  // engine thread
  int64_t max_batched_tokens_ = 0;
  std::atomic<double> prefill_tokens_per_second_{0}, step_seconds_{0};
  static constexpr double kAutoWindowMax = 0.05;  // seconds
  std::thread thread_;
};

}  // namespace inferd
