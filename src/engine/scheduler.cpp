#include "engine/scheduler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "common/check.h"
#include "kernels/attention.h"

namespace inferd {

namespace {
// Earlier in the waiting queue: lower priority value, then earlier deadline (SLO classes of equal
// rank), then earlier arrival.
bool runs_before(const Request* a, const Request* b) {
  if (a->priority != b->priority) return a->priority < b->priority;
  if (a->deadline != b->deadline) return a->deadline < b->deadline;
  return a->arrival_order < b->arrival_order;
}
}  // namespace

Status SpeculativeOptions::validate() const {
  if (!enabled) return Status::ok();
  if (ngram.num_speculative_tokens < 1 || ngram.num_speculative_tokens > 64)
    return invalid_argument("num_speculative_tokens must be in [1, 64]");
  if (ngram.prompt_lookup_min < 1) return invalid_argument("prompt_lookup_min must be >= 1");
  if (ngram.prompt_lookup_max < ngram.prompt_lookup_min)
    return invalid_argument("prompt_lookup_max must be >= prompt_lookup_min");
  if (disable_by_batch_size < 1) return invalid_argument("disable_by_batch_size must be >= 1");
  if (method == SpeculativeMethod::kDraftModel && draft_model.empty())
    return invalid_argument("the draft_model method needs a model");
  return Status::ok();
}

Status SchedulerOptions::validate() const {
  if (max_num_batched_tokens < 1) return invalid_argument("max_num_batched_tokens must be >= 1");
  if (max_num_seqs < 1) return invalid_argument("max_num_seqs must be >= 1");
  if (max_prefill_tokens < 1) return invalid_argument("max_prefill_tokens must be >= 1");
  if (max_model_len < 2) return invalid_argument("max_model_len must be >= 2");
  if (!(session_ttl_seconds >= 0)) return invalid_argument("session_ttl_seconds must be >= 0");
  if (!(session_max_share >= 0 && session_max_share <= 1))
    return invalid_argument("session_max_share must be in [0, 1]");
  if (!(kv_load_timeout_seconds > 0)) return invalid_argument("kv_load_timeout_seconds must be > 0");
  return speculative.validate();
}

Scheduler::Scheduler(const SchedulerOptions& options, KVCacheManager& kv)
    : options_(options), kv_(kv), slo_last_seen_(options.slo.size()) {
  INFERD_CHECK(options.validate().is_ok());
}

void Scheduler::add(std::unique_ptr<Request> request) {
  Request* r = request.get();
  INFERD_CHECK(requests_.find(r->id) == requests_.end());
  requests_.emplace(r->id, std::move(request));
  const int64_t total = static_cast<int64_t>(r->prompt.size()) + r->limits.max_tokens;
  if (!r->error.empty()) {
    // rejected by the caller already (bad token id, bad sampling field)
  } else if (r->prompt.empty()) {
    r->error = "the prompt is empty";
  } else if (r->streaming.enabled() || r->streaming.sink_tokens != 0) {
    // The window bounds what it holds: the sink, up to two windows (the one the step's first
    // token sees, then the step's own tokens), and the rounding of both to the units blocks are
    // given back in (evict_outside_window) and to a partly filled last block.
    const int64_t bs = kv_.block_size();
    const int64_t sink = streaming_sink_len(r->streaming, bs);
    const int64_t unit = std::lcm<int64_t>(bs, kWindowGranule);
    const int64_t held = sink + 2 * r->streaming.window_tokens + 2 * unit + bs;
    if (r->streaming.window_tokens < 16) {
      r->error = "the streaming window must be at least 16 tokens";
    } else if (r->streaming.sink_tokens < 0) {
      r->error = "the streaming sink must not be negative";
    } else if (sink + r->streaming.window_tokens > options_.max_model_len) {
      r->error = "the streaming sink (" + std::to_string(sink) + " tokens) + window (" +
                 std::to_string(r->streaming.window_tokens) + ") exceed the context window of " +
                 std::to_string(options_.max_model_len);
    } else if (kv_.blocks_for(std::min(total, held)) > kv_.num_blocks_total()) {
      r->error = "the streaming sink + window need more KV cache than exists (" +
                 std::to_string(kv_.num_blocks_total() * kv_.block_size()) + " tokens)";
    }
  } else if (total > options_.max_model_len) {
    r->error = "prompt (" + std::to_string(r->prompt.size()) + " tokens) + max_tokens (" +
               std::to_string(r->limits.max_tokens) + ") exceeds the context window of " +
               std::to_string(options_.max_model_len);
  } else if (kv_.blocks_for(total) > kv_.num_blocks_total()) {
    r->error = "prompt + max_tokens (" + std::to_string(total) +
               " tokens) needs more KV cache than exists (" +
               std::to_string(kv_.num_blocks_total() * kv_.block_size()) + " tokens)";
  }
  if (!r->error.empty()) {
    finish(r, FinishReason::kError);
    return;
  }
  if (!r->output.empty()) {  // disaggregated: the first output token came from the prefill instance
    if (is_stop_token(*r, r->output.back())) return finish(r, FinishReason::kStop);
    if (static_cast<int64_t>(r->output.size()) >= r->limits.max_tokens)
      return finish(r, FinishReason::kLength);
  }
  insert_waiting(r);
}

void Scheduler::insert_waiting(Request* r) {
  r->state = RequestState::kWaiting;
  waiting_.insert(std::upper_bound(waiting_.begin(), waiting_.end(), r, runs_before), r);
}

void Scheduler::abort(RequestId id) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return;
  finish(it->second.get(), FinishReason::kAborted);
}

void Scheduler::fail(RequestId id, std::string message) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return;
  it->second->error = std::move(message);
  finish(it->second.get(), FinishReason::kError);
}

ScheduledBatch Scheduler::schedule() {
  ScheduledBatch batch;
  schedule(&batch);
  return batch;
}

void Scheduler::schedule(ScheduledBatch* out) {
  ++step_;
  if (kv_.num_sessions() > 0) kv_.expire_sessions(std::chrono::steady_clock::now());
  if (!loads_.empty()) poll_kv_loads();
  ScheduledBatch& batch = *out;
  batch.items.clear();
  batch.preempted.clear();
  batch.num_tokens = 0;
  prompt_rows_left_ = kPromptLogprobsRowsPerStep;
  int64_t budget = options_.slo.empty() ? options_.max_num_batched_tokens : slo_step_tokens();
  const bool prefill_first = options_.policy == SchedulePolicy::kPrefillFirst ||
                             (options_.policy == SchedulePolicy::kAdaptive && adaptive_prefers_prefill());
  if (options_.policy == SchedulePolicy::kAdaptive)
    ++(prefill_first ? adaptive_choices_.prefill_first : adaptive_choices_.decode_first);
  // SLO classes: the ranks one after the other, best first, each by the policy. Without them
  // one pass over everything (level nullopt).
  levels_.clear();
  if (!options_.slo.empty()) {
    for (const Request* r : running_) levels_.push_back(r->priority);
    for (const Request* r : waiting_) levels_.push_back(r->priority);
    std::sort(levels_.begin(), levels_.end());
    levels_.erase(std::unique(levels_.begin(), levels_.end()), levels_.end());
  }
  int64_t prefill_left = std::min(options_.max_prefill_tokens, budget);
  bool admitting = true;  // strict order: once a request can not be admitted, nothing after it is
  const size_t passes = options_.slo.empty() ? 1 : levels_.size();
  for (size_t i = 0; i < passes; ++i) {
    const std::optional<int32_t> level =
        options_.slo.empty() ? std::nullopt : std::optional<int32_t>(levels_[i]);
    if (!prefill_first) {
      schedule_running(&batch, &budget, level);
      if (admitting) admitting = admit_waiting(&batch, &budget, budget, level);
    } else {
      if (admitting) {
        const int64_t before = budget;
        admitting = admit_waiting(&batch, &budget, std::min(prefill_left, budget), level);
        prefill_left -= before - budget;
      }
      schedule_running(&batch, &budget, level);
    }
  }
}

int64_t Scheduler::slo_step_tokens() {
  const auto now = std::chrono::steady_clock::now();
  auto seen = [&](const Request* r) {
    if (r->slo_class >= 0 && static_cast<size_t>(r->slo_class) < slo_last_seen_.size())
      slo_last_seen_[static_cast<size_t>(r->slo_class)] = now;
  };
  std::for_each(running_.begin(), running_.end(), seen);
  std::for_each(waiting_.begin(), waiting_.end(), seen);
  const double rate = prefill_tokens_per_second_;
  double seconds = std::numeric_limits<double>::infinity();
  for (size_t c = 0; c < options_.slo.size(); ++c) {
    // A class counts while its requests are here and for a while after the last one left (its
    // next arrival should not find a long step in flight).
    if (slo_last_seen_[c] == std::chrono::steady_clock::time_point{} ||
        now - slo_last_seen_[c] > std::chrono::duration<double>(kSloRecentSeconds))
      continue;
    const SloClass& cls = options_.slo.at(c);
    seconds = std::min({seconds, cls.tpot_seconds, cls.ttft_seconds * kSloTtftShare});
  }
  if (!(rate > 0) || !std::isfinite(seconds)) return options_.max_num_batched_tokens;
  const auto floor = std::max<int64_t>(kSloMinStepTokens, static_cast<int64_t>(running_.size()) + 1);
  const auto tokens = static_cast<int64_t>(seconds * rate);
  return std::clamp(tokens, std::min(floor, options_.max_num_batched_tokens),
                    options_.max_num_batched_tokens);
}

void Scheduler::queued_prefill_tokens(std::vector<int64_t>* by_priority) const {
  auto add = [&](const Request* r) {
    const int64_t n = r->num_uncomputed_tokens();
    if (n <= 1 || r->priority < 0) return;  // decoding (one token) or outside the class ranks
    const auto p = static_cast<size_t>(r->priority);
    if (p >= by_priority->size()) by_priority->resize(p + 1, 0);
    (*by_priority)[p] += n;
  };
  by_priority->assign(by_priority->size(), 0);
  for (const Request* r : waiting_) add(r);
  for (const Request* r : running_) add(r);
}

void Scheduler::propose_draft(Request* r, int64_t budget) {
  r->draft.clear();
  r->draft_from_prediction = false;
  const SpeculativeOptions& spec = options_.speculative;
  // A prediction drafts with or without a speculative config (not beside a draft model, which
  // drafts every request itself).
  const bool predicted = r->prediction != nullptr && !r->prediction->empty() &&
                         !(spec.enabled && spec.method == SpeculativeMethod::kDraftModel);
  // Decoding (its last token the one to compute), past its first token (forking and KV export
  // happen at that one), without a grammar (whose matcher would have to roll back rejections).
  // The draft model keeps a full KV cache of its own: not for a StreamingLLM request.
  if ((!spec.enabled && !predicted) ||
      (spec.enabled && static_cast<int64_t>(running_.size()) > spec.disable_by_batch_size) ||
      r->num_uncomputed_tokens() != 1 || r->output.empty() || r->sampling.grammar ||
      (r->streaming.enabled() && spec.method == SpeculativeMethod::kDraftModel))
    return;
  // Its last drafts were all rejected: free text that copies nothing costs the rows of the
  // drafts and saves no step, so it waits (1, 2, 4, ... 32 steps) before drafting again.
  if (r->spec_skip > 0) {
    --r->spec_skip;
    return;
  }
  // The step emits the accepted drafts and one token more: within max_tokens, the context and
  // the budget.
  const int64_t context_room =
      r->streaming.enabled() ? r->streaming.window_tokens - 1 : options_.max_model_len - r->num_tokens() - 1;
  const int64_t room =
      std::min({r->limits.max_tokens - static_cast<int64_t>(r->output.size()) - 1, context_room, budget - 1});
  if (predicted) {
    propose_from_prediction(*r->prediction, r->output,
                            spec.enabled ? spec.ngram.num_speculative_tokens : kPredictionDraftTokens, room,
                            &r->prediction_cursor, &r->draft);
    r->draft_from_prediction = !r->draft.empty();
  } else if (spec.method == SpeculativeMethod::kNgram) {
    propose_ngram(r->prompt, r->output, spec.ngram, room, &r->draft);
  } else if (room > 0) {  // positions the engine's draft model fills in before the step runs
    r->draft.assign(static_cast<size_t>(std::min<int64_t>(spec.ngram.num_speculative_tokens, room)), 0);
  }
}

void Scheduler::schedule_running(ScheduledBatch* batch, int64_t* budget, std::optional<int32_t> level) {
  order_.assign(running_.begin(), running_.end());  // preemption edits running_
  for (Request* r : order_) {
    if (*budget <= 0) break;
    if (r->state != RequestState::kRunning || r->scheduled_in_step == step_) continue;
    if (level && r->priority != *level) continue;
    propose_draft(r, *budget);
    const int64_t n =
        step_cap(*r, std::min(r->num_uncomputed_tokens(), *budget)) + static_cast<int64_t>(r->draft.size());
    if (n == 0) continue;  // its prompt logprobs wait for the next step's rows
    evict_outside_window(r);
    bool fits = true;
    while (!kv_.allocate_slots(r->id, r->num_computed_tokens + n)) {
      if (!preempt_one(r, std::numeric_limits<int32_t>::min(), batch, budget)) {
        if (kv_.drop_oldest_session()) continue;  // session pins give way before r does
        preempt(r, batch, budget);                // nobody else to take blocks from: r waits
        fits = false;
        break;
      }
    }
    if (!fits) continue;
    r->scheduled_in_step = step_;
    if (r->wants_prompt_logprobs()) prompt_rows_left_ -= n;
    batch->items.push_back({r, n, static_cast<int64_t>(r->draft.size())});
    batch->num_tokens += n;
    *budget -= n;
  }
}

bool Scheduler::admit_waiting(ScheduledBatch* batch, int64_t* budget, int64_t prefill_cap,
                              std::optional<int32_t> level) {
  int64_t prefill = 0;
  while (!waiting_.empty() && *budget > 0 && prefill < prefill_cap) {
    Request* r = waiting_.front();
    if (level && r->priority != *level) return true;  // the next rank's turn
    if (static_cast<int64_t>(running_.size()) >= options_.max_num_seqs) {
      // SLO classes: a lower rank's running request gives its slot to a better one.
      if (options_.slo.empty() || !preempt_one(r, r->priority, batch, budget)) return false;
      continue;
    }
    // A request that holds no blocks starts from the longest cached prefix of its tokens.
    const bool fresh = r->num_computed_tokens == 0 && kv_.block_table(r->id).empty() && !r->kv_load_done;
    // Prompt logprobs need every prompt row's logits, mean pooling every row's hidden state: no
    // cached prefix, no loaded KV.
    if (fresh && !r->wants_prompt_logprobs() && !r->pools_every_row()) {
      r->num_computed_tokens =
          kv_.take_cached_prefix(r->id, tokens_of(*r), r->remote_kv ? nullptr : &remote_keys_);
      if (r->remote_kv) {
        bool no_room = false;
        if (start_remote_load(r, &no_room)) continue;  // waits for its KV; the queue goes on
        if (no_room) {                                 // its pull waits for free blocks, in order
          kv_.free(r->id);
          r->num_computed_tokens = 0;
          return false;
        }
      } else if (!remote_keys_.empty() && start_kv_load(r)) {
        continue;
      }
    }
    const int64_t n = step_cap(*r, std::min({r->num_uncomputed_tokens(), *budget, prefill_cap - prefill}));
    evict_outside_window(r);
    bool fits = n > 0;  // 0: its prompt logprobs wait for the next step's rows
    // Blocks short: only a strictly lower-priority running request may give way.
    while (fits && !kv_.allocate_slots(r->id, r->num_computed_tokens + n)) {
      if (preempt_one(r, r->priority, batch, budget)) continue;
      if (running_.empty() && kv_.drop_oldest_session()) continue;  // pins never starve a lone request
      fits = false;
      break;
    }
    if (!fits) {
      if (fresh) {  // waiting requests hold no blocks: the prefix stays cached, not taken
        kv_.free(r->id);
        r->num_computed_tokens = 0;
      }
      return false;  // strict order: later arrivals do not jump ahead
    }
    waiting_.pop_front();
    if (r->wants_prompt_logprobs()) prompt_rows_left_ -= n;
    if (!r->first_scheduled) {
      r->first_scheduled = std::chrono::steady_clock::now();
      r->cached_tokens = r->num_computed_tokens;
    }
    start_running(r);
    batch->items.push_back({r, n});
    batch->num_tokens += n;
    *budget -= n;
    prefill += n;
  }
  return waiting_.empty() || *budget > 0;
}

void Scheduler::start_running(Request* r) {
  r->state = RequestState::kRunning;
  r->scheduled_in_step = step_;
  running_.push_back(r);
  order_.reserve(running_.size());  // schedule_running's copy: grown here, not in a later step
  // The most tokens it can reach: then its steps append to its output and block table without
  // allocating. A StreamingLLM request runs past max_model_len (its table stays within the
  // window; its output may still grow).
  const auto prompt = static_cast<int64_t>(r->prompt.size());
  if (r->streaming.enabled()) {
    r->output.reserve(
        static_cast<size_t>(std::clamp<int64_t>(r->limits.max_tokens, 0, options_.max_model_len)));
    return;
  }
  const int64_t total = std::min(prompt + r->limits.max_tokens, options_.max_model_len);
  r->output.reserve(static_cast<size_t>(std::max<int64_t>(total - prompt, 0)));
  kv_.reserve_table(r->id, total);
}

void Scheduler::evict_outside_window(Request* r) {
  if (!r->streaming.enabled()) return;
  const int64_t bs = kv_.block_size();
  AttentionSequence window;
  window.window = r->streaming.window_tokens;
  window.sink_len = streaming_sink_len(r->streaming, bs);
  // No token of the step sees positions [sink_len, start): their blocks go back to the pool,
  // whole and in runs of a multiple of 16 positions (what the attention kernel skips).
  const int64_t start = window_start(window, r->num_computed_tokens);
  const int64_t sink_blocks = window.sink_len / bs;
  const int64_t unit = std::lcm<int64_t>(bs, kWindowGranule) / bs;
  kv_.evict(r->id, sink_blocks, sink_blocks + (start / bs - sink_blocks) / unit * unit);
}

bool Scheduler::start_kv_load(Request* r) {
  KvBlockSource* source = kv_.block_source();
  const int64_t n = std::min<int64_t>(static_cast<int64_t>(remote_keys_.size()), kv_.num_free_blocks());
  if (source == nullptr || n <= 0) return false;
  auto blocks = kv_.reserve_blocks(n);
  if (!blocks) return false;
  std::vector<BlockHash> keys(remote_keys_.begin(), remote_keys_.begin() + n);
  const uint64_t ticket = source->start_load(keys, *blocks);
  track_load(r, false, ticket, std::move(keys), std::move(*blocks), -1);
  return true;
}

bool Scheduler::start_remote_load(Request* r, bool* no_room) {
  const RemoteKvRef ref = *r->remote_kv;
  const int64_t have_blocks = r->num_computed_tokens / kv_.block_size();
  std::vector<BlockHash> keys = kv_.block_keys(tokens_of(*r), ref.num_tokens);
  const auto n = static_cast<int64_t>(keys.size()) - have_blocks;
  if (remote_ == nullptr || n <= 0) {
    r->remote_kv.reset();  // nothing to pull (its prompt is cached here): computed like any other
    return false;
  }
  auto blocks = kv_.reserve_blocks(n);
  if (!blocks) {
    *no_room = true;
    return false;
  }
  keys.erase(keys.begin(), keys.begin() + have_blocks);
  const int64_t tail = ref.num_tokens % kv_.block_size();
  const uint64_t ticket = remote_->start_load(ref, have_blocks, keys, *blocks);
  track_load(r, true, ticket, std::move(keys), std::move(*blocks), tail > 0 ? tail : -1);
  return true;
}

void Scheduler::track_load(Request* r, bool remote, uint64_t ticket, std::vector<BlockHash> keys,
                           std::vector<int32_t> blocks, int64_t last_block_tokens) {
  const auto timeout = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(options_.kv_load_timeout_seconds));
  const uint64_t key = load_key(remote, ticket);
  loads_.emplace(key, KvLoad{r, std::move(keys), std::move(blocks),
                             std::chrono::steady_clock::now() + timeout, last_block_tokens});
  waiting_.pop_front();
  r->state = RequestState::kWaitingForKv;
  r->kv_load_ticket = key;
  ++num_waiting_for_kv_;
}

void Scheduler::cancel_load(uint64_t key, bool timed_out) {
  if (key % 2 == 1) {
    remote_->cancel(key / 2, timed_out);
  } else {
    kv_.block_source()->cancel(key / 2);
  }
}

void Scheduler::end_kv_wait(Request* r, int64_t covered_tokens, const std::string& failure) {
  --num_waiting_for_kv_;
  r->kv_load_ticket = 0;
  r->kv_load_done = true;  // one load per admission: what did not arrive is computed
  if (!failure.empty() && options_.kv_load_failure == KvLoadFailure::kFail) {
    r->state = RequestState::kWaiting;  // not in waiting_: finish() finds nothing to erase there
    r->error = failure;
    finish(r, FinishReason::kError);
    return;
  }
  r->num_computed_tokens = covered_tokens;
  insert_waiting(r);
}

void Scheduler::poll_kv_loads() {
  for (const bool remote : {false, true}) {
    landed_.clear();
    if (remote && remote_ != nullptr) remote_->poll(&landed_);
    if (!remote && kv_.block_source() != nullptr) kv_.block_source()->poll(&landed_);
    for (KvBlockSource::Finished& f : landed_) {
      auto it = loads_.find(load_key(remote, f.ticket));
      if (it == loads_.end()) continue;
      KvLoad load = std::move(it->second);
      loads_.erase(it);
      if (load.request == nullptr) {  // its request ended or gave up waiting
        kv_.release_blocks(load.blocks);
        continue;
      }
      Request* r = load.request;
      const int64_t covered =
          kv_.adopt_loaded(r->id, load.keys, load.blocks, f.loaded, load.last_block_tokens, !remote);
      if (!f.error.empty()) ++num_kv_load_failures_;
      r->remote_kv.reset();  // pulled once: a later admission (after a preemption) computes
      end_kv_wait(r, covered, f.error.empty() ? "" : "KV load failed: " + f.error);
    }
  }
  const auto now = std::chrono::steady_clock::now();
  for (auto& [key, load] : loads_) {
    if (load.request == nullptr || now < load.deadline) continue;
    Request* r = load.request;
    load.request = nullptr;
    r->remote_kv.reset();
    cancel_load(key, true);
    ++num_kv_load_timeouts_;
    end_kv_wait(r, static_cast<int64_t>(kv_.block_table(r->id).size()) * kv_.block_size(),
                "KV load timed out after " + std::to_string(options_.kv_load_timeout_seconds) + " s");
  }
}

bool Scheduler::preempt_one(const Request* keep, int32_t above_priority, ScheduledBatch* batch,
                            int64_t* budget) {
  Request* victim = nullptr;
  for (Request* r : running_) {
    if (r == keep || r->priority <= above_priority) continue;
    if (victim == nullptr || runs_before(victim, r)) victim = r;  // lowest priority, latest arrival
  }
  if (victim == nullptr) return false;
  preempt(victim, batch, budget);
  return true;
}

void Scheduler::preempt(Request* victim, ScheduledBatch* batch, int64_t* budget) {
  // Undo its place in this step's batch, if it had one.
  for (auto it = batch->items.begin(); it != batch->items.end(); ++it) {
    if (it->request == victim) {
      *budget += it->num_new_tokens;
      batch->num_tokens -= it->num_new_tokens;
      batch->items.erase(it);
      break;
    }
  }
  kv_.free(victim->id);
  victim->draft.clear();
  victim->num_computed_tokens = 0;
  victim->kv_load_done = false;  // a new admission may load its KV again
  ++victim->num_preemptions;
  ++num_preemptions_;
  running_.erase(std::find(running_.begin(), running_.end(), victim));
  insert_waiting(victim);
  batch->preempted.push_back(victim->id);
}

double Scheduler::step_seconds_per_token() const {
  const double var = fit_nn_ - fit_n_ * fit_n_;
  if (!(var > 1)) return 0;  // steps of one size: no slope to see
  return std::max(0.0, (fit_nt_ - fit_n_ * fit_t_) / var);
}

double Scheduler::step_fixed_seconds() const {
  const double var = fit_nn_ - fit_n_ * fit_n_;
  if (!(var > 1)) return 0;
  return std::clamp(fit_t_ - step_seconds_per_token() * fit_n_, 0.0, fit_t_);
}

int64_t Scheduler::num_waiting_tokens() const {
  int64_t n = 0;
  for (const Request* r : waiting_) n += r->num_uncomputed_tokens();
  return n;
}

bool Scheduler::adaptive_prefers_prefill() const {
  if (waiting_.empty()) return false;
  if (running_.empty()) return true;
  const auto free_slots = std::max<int64_t>(0, options_.max_num_seqs - static_cast<int64_t>(running_.size()));
  const auto admittable = std::min<int64_t>(static_cast<int64_t>(waiting_.size()), free_slots);
  const double prefill_cost = prefill_seconds_per_request_ * static_cast<double>(running_.size());
  const double decode_cost = decode_step_seconds_ * static_cast<double>(admittable);
  return prefill_cost <= decode_cost;
}

void Scheduler::observe_step(const ScheduledBatch& batch, double seconds) {
  constexpr double kAlpha = 0.2;
  int64_t prefills = 0;
  for (const auto& item : batch.items) {
    if (item.num_new_tokens - item.num_draft_tokens > 1) ++prefills;
  }
  auto blend = [&](double* avg, double x) { *avg = *avg == 0 ? x : (1 - kAlpha) * *avg + kAlpha * x; };
  if (!batch.items.empty()) {
    blend(&step_seconds_, seconds);
    constexpr double kFitAlpha = 0.05;
    const auto n = static_cast<double>(batch.num_tokens);
    auto fit = [&](double* avg, double x) {
      *avg = fit_started_ ? (1 - kFitAlpha) * *avg + kFitAlpha * x : x;
    };
    fit(&fit_n_, n);
    fit(&fit_t_, seconds);
    fit(&fit_nn_, n * n);
    fit(&fit_nt_, n * seconds);
    fit_started_ = true;
  }
  if (prefills > 0) {
    blend(&prefill_seconds_per_request_, seconds / static_cast<double>(prefills));
    int64_t prompt_tokens = 0;
    for (const auto& item : batch.items) {
      if (item.num_new_tokens - item.num_draft_tokens > 1) prompt_tokens += item.num_new_tokens;
    }
    if (seconds > 0) blend(&prefill_tokens_per_second_, static_cast<double>(prompt_tokens) / seconds);
  } else if (!batch.items.empty()) {
    blend(&decode_step_seconds_, seconds);
  }
}

void Scheduler::update(const ScheduledBatch& batch, std::span<const int32_t> sampled,
                       std::span<const int32_t> accepted) {
  INFERD_CHECK(sampled.size() == batch.items.size());
  INFERD_CHECK(accepted.empty() || accepted.size() == batch.items.size());
  for (size_t i = 0; i < batch.items.size(); ++i) {
    Request* r = batch.items[i].request;
    if (r->state != RequestState::kRunning) {
      r->draft.clear();
      continue;
    }
    const auto drafts = static_cast<int64_t>(r->draft.size());
    const int64_t taken = accepted.empty() ? 0 : accepted[i];
    INFERD_CHECK(taken >= 0 && taken <= drafts);
    // The rejected drafts' positions are computed again when their real tokens come (the same
    // slots): they neither count as computed nor reach the prefix cache.
    r->num_computed_tokens += batch.items[i].num_new_tokens - (drafts - taken);
    r->output.insert(r->output.end(), r->draft.begin(), r->draft.begin() + taken);
    if (drafts > 0) {
      r->spec_backoff = taken > 0 ? 0 : std::min(32, std::max(1, 2 * r->spec_backoff));
      r->spec_skip = r->spec_backoff;
    }
    r->draft.clear();
    kv_.cache_full_blocks(r->id, tokens_of(*r), r->num_computed_tokens);
    if (r->num_computed_tokens < r->num_tokens()) continue;  // still prefilling
    if (r->pooling != Pooling::kNone) {                      // an embedding: done once its prompt is
      finish(r, FinishReason::kStop);
      continue;
    }
    accept_token(r, sampled[i]);
  }
}

void Scheduler::accept_token(Request* r, int32_t token) {
  r->output.push_back(token);
  if (is_stop_token(*r, token)) {
    finish(r, FinishReason::kStop);
  } else if (static_cast<int64_t>(r->output.size()) >= r->limits.max_tokens ||
             (!r->streaming.enabled() && r->num_tokens() >= options_.max_model_len)) {
    finish(r, FinishReason::kLength);
  }
}

int64_t Scheduler::num_waiting_sequences() const {
  int64_t n = 0;
  for (const Request* r : waiting_) n += r->forked ? 1 : r->num_samples;
  return n;
}

void Scheduler::add_forked(std::unique_ptr<Request> request, int32_t first_token) {
  Request* r = request.get();
  INFERD_CHECK(requests_.find(r->id) == requests_.end());
  INFERD_CHECK(r->output.empty() && r->num_computed_tokens == static_cast<int64_t>(r->prompt.size()));
  requests_.emplace(r->id, std::move(request));
  start_running(r);
  accept_token(r, first_token);
}

void Scheduler::finish(Request* r, FinishReason reason) {
  if (!r->session_id.empty() && reason != FinishReason::kError) {
    const auto ttl = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
        std::chrono::duration<double>(options_.session_ttl_seconds));
    kv_.pin_session(
        r->session_id, r->id, std::chrono::steady_clock::now() + ttl,
        static_cast<int64_t>(options_.session_max_share * static_cast<double>(kv_.num_blocks_total())));
  }
  kv_.free(r->id);
  if (r->state == RequestState::kWaitingForKv) {  // its blocks return when the load lands
    loads_.at(r->kv_load_ticket).request = nullptr;
    cancel_load(r->kv_load_ticket, false);
    --num_waiting_for_kv_;
  }
  if (r->state == RequestState::kRunning) running_.erase(std::find(running_.begin(), running_.end(), r));
  if (r->state == RequestState::kWaiting) {
    auto it = std::find(waiting_.begin(), waiting_.end(), r);
    if (it != waiting_.end()) waiting_.erase(it);
  }
  r->state = RequestState::kFinished;
  r->finish_reason = reason;
  auto it = requests_.find(r->id);
  finished_.push_back(std::move(it->second));
  requests_.erase(it);
}

std::vector<std::unique_ptr<Request>> Scheduler::take_finished() {
  return std::exchange(finished_, {});
}

}  // namespace inferd
