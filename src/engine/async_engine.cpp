#include "engine/async_engine.h"

#include <algorithm>

#include "common/log.h"

namespace inferd {

AsyncEngine::AsyncEngine(Transformer& model, const EngineOptions& options)
    : engine_(model, options),
      slo_(options.scheduler.slo),
      window_mode_(options.batch_window),
      window_fixed_(options.batch_window_seconds),
      max_batched_tokens_(options.scheduler.max_num_batched_tokens) {
  rate_updated_ = std::chrono::steady_clock::now();
  // auto never holds longer than kAutoWindowMax, nor than a quarter of the tightest SLO TTFT.
  window_cap_ = kAutoWindowMax;
  for (const SloClass& c : slo_.classes()) window_cap_ = std::min(window_cap_, 0.25 * c.ttft_seconds);
  if (window_mode_ == BatchWindowMode::kFixed) window_seconds_ = window_fixed_;
  num_free_blocks_ = engine_.block_pool().num_free_blocks();
  if (!slo_.empty()) {
    submitted_tokens_ = std::make_unique<std::atomic<int64_t>[]>(slo_.size());
    queued_tokens_ = std::make_unique<std::atomic<int64_t>[]>(slo_.size());
    arrived_tokens_ = std::make_unique<std::atomic<int64_t>[]>(slo_.size());
    arrival_rate_ = std::make_unique<std::atomic<double>[]>(slo_.size());
    for (size_t i = 0; i < slo_.size(); ++i) {
      submitted_tokens_[i] = 0;
      queued_tokens_[i] = 0;
      arrived_tokens_[i] = 0;
      arrival_rate_[i] = 0;
    }
    arrived_seen_.assign(slo_.size(), 0);
  }
  thread_ = std::thread([this] { loop(); });
}

AsyncEngine::~AsyncEngine() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_one();
  thread_.join();
}

RequestId AsyncEngine::submit(RequestSpec spec, OutputCallback on_output) {
  const RequestId id = next_id_.fetch_add(1);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    num_submitted_sequences_ += num_finished_outputs(spec);
    ++arrived_requests_;
    if (!slo_.empty()) {
      const auto rank = static_cast<size_t>(slo_.rank(slo_.class_of(spec.slo_class, spec.priority)));
      const int64_t tokens = static_cast<int64_t>(spec.prompt.size()) * num_finished_outputs(spec);
      submitted_tokens_[rank] += tokens;
      arrived_tokens_[rank] += tokens;
    }
    submissions_.push_back({id, std::move(spec), std::move(on_output)});
  }
  wake_.notify_one();
  return id;
}

void AsyncEngine::abort(RequestId id) {
  abort(id, -1);
}

void AsyncEngine::abort(RequestId id, int32_t index) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    aborts_.emplace_back(id, index);
  }
  wake_.notify_one();
}

void AsyncEngine::fail_all(const std::string& message) {
  if (std::this_thread::get_id() != thread_.get_id()) {
    log_error("fail_all called off the engine thread: " + message);
    return;
  }
  std::vector<Submission> subs;  // submissions not yet taken get their answer too
  {
    std::lock_guard<std::mutex> lock(mutex_);
    subs.swap(submissions_);
  }
  for (auto& sub : subs) {
    callbacks_.emplace(sub.id, Listener{std::move(sub.callback), num_finished_outputs(sub.spec),
                                        num_finished_outputs(sub.spec)});
  }
  for (auto& [id, listener] : callbacks_) {
    // Every sample: a finished one ignores it (OutputProcessor keeps its first finish).
    for (int32_t index = 0; index < listener.samples; ++index) {
      StepOutput out;
      out.id = id;
      out.index = index;
      out.finished = true;
      out.finish_reason = FinishReason::kError;
      out.error = message;
      out.internal = true;
      listener.callback(out);
    }
  }
  callbacks_.clear();
}

void AsyncEngine::take_commands() {
  std::vector<Submission> subs;
  std::vector<std::pair<RequestId, int32_t>> aborts;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    subs.swap(submissions_);
    aborts.swap(aborts_);
  }
  int64_t taken_sequences = 0;
  for (auto& s : subs) {
    taken_sequences += num_finished_outputs(s.spec);
    if (!slo_.empty())
      submitted_tokens_[static_cast<size_t>(slo_.rank(slo_.class_of(s.spec.slo_class, s.spec.priority)))] -=
          static_cast<int64_t>(s.spec.prompt.size()) * num_finished_outputs(s.spec);
    callbacks_.emplace(
        s.id, Listener{std::move(s.callback), num_finished_outputs(s.spec), num_finished_outputs(s.spec)});
    engine_.add(std::move(s.spec), s.id);
  }
  // Counted as waiting before they leave the submission count: never in neither.
  num_waiting_sequences_ = engine_.scheduler().num_waiting_sequences();
  num_submitted_sequences_ -= taken_sequences;
  for (const auto& [id, index] : aborts) {
    if (index < 0) {
      engine_.abort(id);
    } else {
      engine_.abort(id, index);
    }
  }
}

void AsyncEngine::loop() {
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      const auto ready = [&] {
        return stopping_ || !submissions_.empty() || !aborts_.empty() || engine_.has_work();
      };
      if (engine_.has_offload_work()) {
        // Idle with cold blocks not yet offloaded: stage them between short waits for work.
        if (!wake_.wait_for(lock, std::chrono::milliseconds(5), ready)) {
          lock.unlock();
          engine_.offload_idle();
          continue;
        }
      } else {
        wake_.wait(lock, ready);
      }
      if (stopping_) break;
    }
    take_commands();
    update_arrival_rates();
    if (window_mode_ != BatchWindowMode::kOff && hold_for_window()) continue;
    const auto outputs = engine_.step();
    // Published before the outputs are delivered, so a client that reads the gauges after its
    // response sees the state that response left (e.g. its session pinned).
    num_running_ = engine_.scheduler().num_running();
    // Requests waiting for their KV to arrive count as waiting.
    num_waiting_ = engine_.scheduler().num_waiting() + engine_.scheduler().num_waiting_for_kv();
    kv_load_failures_ = engine_.scheduler().num_kv_load_failures();
    kv_load_timeouts_ = engine_.scheduler().num_kv_load_timeouts();
    num_waiting_sequences_ = engine_.scheduler().num_waiting_sequences();
    num_free_blocks_ = engine_.block_pool().num_free_blocks();
    num_preemptions_ = engine_.scheduler().num_preemptions();
    prefix_queries_ = engine_.kv_cache_manager().prefix_query_tokens();
    prefix_hits_ = engine_.kv_cache_manager().prefix_hit_tokens();
    sessions_ = engine_.kv_cache_manager().num_sessions();
    pinned_blocks_ = engine_.kv_cache_manager().num_pinned_blocks();
    revived_blocks_ = engine_.block_pool().num_revived();
    spec_drafts_ = engine_.stats().spec_drafts;
    spec_draft_tokens_ = engine_.stats().spec_draft_tokens;
    spec_accepted_tokens_ = engine_.stats().spec_accepted_tokens;
    if (!slo_.empty()) {
      engine_.scheduler().queued_prefill_tokens(&queued_scratch_);
      for (size_t i = 0; i < slo_.size(); ++i)
        queued_tokens_[i] = i < queued_scratch_.size() ? queued_scratch_[i] : 0;
      prefill_tokens_per_second_ = engine_.scheduler().prefill_tokens_per_second();
      step_seconds_ = engine_.scheduler().step_seconds();
    }
    for (const StepOutput& out : outputs) {
      auto it = callbacks_.find(out.id);
      if (it == callbacks_.end()) continue;
      it->second.callback(out);
      if (out.finished && --it->second.unfinished == 0) callbacks_.erase(it);
    }
  }
  // Shutting down: every request still known ends as aborted.
  for (auto& [id, cb] : callbacks_) engine_.abort(id);
  for (const StepOutput& out : engine_.step()) {
    auto it = callbacks_.find(out.id);
    if (it != callbacks_.end()) it->second.callback(out);
  }
}

double AsyncEngine::choose_window() const {
  if (window_mode_ == BatchWindowMode::kFixed) return window_fixed_;
  // Holding costs every waiting request the window; each arrival that joins saves a step's fixed
  // cost (its own step, or the wait for one in flight). Worth it while arrivals come faster than
  // the waiting requests' number per fixed cost; never longer than that cost (or the cap).
  const double fixed = engine_.scheduler().step_fixed_seconds();
  const auto waiting = static_cast<double>(engine_.scheduler().num_waiting());
  if (!(fixed > 0) || request_rate_.load() * fixed <= waiting) return 0;
  return std::min(fixed, window_cap_);
}

bool AsyncEngine::hold_for_window() {
  const Scheduler& s = engine_.scheduler();
  // Only a step that would prefill arrivals alone waits: running requests' decodes never do.
  if (s.num_running() > 0 || s.num_waiting() == 0) {
    hold_since_.reset();
    return false;
  }
  const double window = choose_window();
  window_seconds_ = window;
  const auto now = std::chrono::steady_clock::now();
  if (!hold_since_) hold_since_ = now;
  const auto deadline = *hold_since_ + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                           std::chrono::duration<double>(window));
  if (window <= 0 || now >= deadline || s.num_waiting_tokens() >= max_batched_tokens_) {
    hold_since_.reset();
    return false;
  }
  std::unique_lock<std::mutex> lock(mutex_);
  wake_.wait_until(lock, deadline, [&] { return stopping_ || !submissions_.empty() || !aborts_.empty(); });
  return true;
}

void AsyncEngine::update_arrival_rates() {
  const auto now = std::chrono::steady_clock::now();
  const double dt = std::chrono::duration<double>(now - rate_updated_).count();
  if (dt < 1) return;
  constexpr double kAlpha = 0.3;
  const int64_t requests = arrived_requests_.load();
  request_rate_ = (1 - kAlpha) * request_rate_.load() +
                  kAlpha * static_cast<double>(requests - arrived_requests_seen_) / dt;
  arrived_requests_seen_ = requests;
  for (size_t r = 0; r < slo_.size(); ++r) {
    const int64_t total = arrived_tokens_[r].load();
    const double rate = static_cast<double>(total - arrived_seen_[r]) / dt;
    arrival_rate_[r] = (1 - kAlpha) * arrival_rate_[r].load() + kAlpha * rate;
    arrived_seen_[r] = total;
  }
  rate_updated_ = now;
}

std::optional<double> AsyncEngine::estimated_ttft_seconds(size_t slo_class, int64_t prompt_tokens) const {
  const double rate = prefill_tokens_per_second_.load();
  if (slo_.empty() || slo_class >= slo_.size() || !(rate > 0)) return std::nullopt;
  const auto rank = static_cast<size_t>(slo_.rank(slo_class));
  int64_t ahead = prompt_tokens;
  double better_arrivals = 0;  // tokens per second the better ranks keep bringing
  for (size_t r = 0; r <= rank && r < slo_.size(); ++r) {
    ahead += submitted_tokens_[r].load() + queued_tokens_[r].load();
    if (r < rank) better_arrivals += arrival_rate_[r].load();
  }
  const double left = std::max(rate - better_arrivals, 0.1 * rate);
  return static_cast<double>(ahead) / left + step_seconds_.load();
}

}  // namespace inferd
