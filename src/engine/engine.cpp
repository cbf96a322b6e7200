#include "engine/engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <thread>
#include <utility>

#include "common/check.h"
#include "common/log.h"
#include "engine/mirrored_kv_source.h"
#include "model/model_fingerprint.h"

namespace inferd {

Status EngineOptions::validate() const {
  INFERD_RETURN_IF_ERROR(scheduler.validate());
  if (!(batch_window_seconds >= 0 && batch_window_seconds <= 10))
    return invalid_argument("the batch window must be in [0, 10] seconds");
  if (block_size < 1 || block_size > 1024) return invalid_argument("block_size must be in [1, 1024]");
  if (num_kv_blocks < 1) return invalid_argument("the KV cache must hold at least one block");
  if (offload.enabled()) {
    if (!prefix_caching)
      return invalid_argument("KV offload tiers need prefix caching (drop --no-prefix-caching)");
    INFERD_RETURN_IF_ERROR(offload.validate());
  }
  const SpeculativeOptions& spec = scheduler.speculative;
  const bool drafting = spec.enabled && spec.method == SpeculativeMethod::kDraftModel;
  if (!drafting && draft_model != nullptr)
    return invalid_argument("a draft model is given, but speculative decoding by draft model is off");
  if (step_mirror != nullptr) {
    if (kv_export != nullptr || remote_kv)
      return invalid_argument("prefill/decode disaggregation does not work with tensor parallelism yet");
  }
  return Status::ok();
}

Engine::Engine(Transformer& model, const EngineOptions& options)
    : options_(options),
      model_(model),
      cache_(model.config().num_layers, options.num_kv_blocks, options.block_size, model.config().kv_dim(),
             options.kv_dtype, model.config().head_dim, model.backend().reads_key_groups()),
      pool_(static_cast<int32_t>(options.num_kv_blocks)),
      kv_(pool_, options.block_size, options.prefix_caching),
      scheduler_(options.scheduler, kv_),
      runner_(model, cache_, kv_) {
  INFERD_CHECK(options.validate().is_ok());
  runner_.set_mirror(options.step_mirror);
  const SpeculativeOptions& spec = options.scheduler.speculative;
  INFERD_CHECK_MSG(
      options.draft_model != nullptr || !spec.enabled || spec.method != SpeculativeMethod::kDraftModel,
      "speculative decoding by draft model without the draft model loaded");
  if (options.draft_model != nullptr) {
    INFERD_CHECK_MSG(options.draft_model->config().vocab_size == model.config().vocab_size,
                     "the draft model's vocabulary must be the target's");
    drafter_ = std::make_unique<DraftProposer>(*options.draft_model, options.num_kv_blocks,
                                               options.block_size, options.kv_dtype);
  }
  const bool fingerprint_needed =
      options.offload.enabled() || options.kv_export != nullptr || options.remote_kv;
  if (fingerprint_needed) {
    const ModelFingerprint fp = model_fingerprint(model.weights());
    identity_.model = kv_shard_fingerprint(BlockHash{fp.lo, fp.hi}, options.kv_shard);
  }
  identity_.num_layers = static_cast<uint32_t>(cache_.num_layers());
  identity_.block_size = static_cast<uint32_t>(cache_.block_size());
  identity_.kv_dim = static_cast<uint32_t>(cache_.kv_dim());
  identity_.dtype = static_cast<uint32_t>(cache_.dtype());
  if (options.remote_kv) {
    auto source = options.remote_kv(cache_, identity_);
    if (source) {
      remote_ = std::move(*source);
      scheduler_.set_remote_source(remote_.get());
    } else {
      remote_status_ = source.status();
    }
  }
  if (options.offload.enabled()) {
    auto offloader = KvOffloader::create(options.offload, cache_, identity_.model);
    if (offloader) {
      offloader_ = std::move(*offloader);
      offloader_->attach(pool_);
      kv_.set_block_source(offloader_.get());
      if (StepMirror* mirror = options.step_mirror; mirror != nullptr) {
        offloader_->set_stage_hook([mirror](int32_t block, const BlockHash& key) {
          if (Status s = mirror->stage_block(block, key); !s.is_ok())
            log_error("KV offload: the other ranks did not stage a block: " + s.message());
        });
        mirrored_source_ = std::make_unique<MirroredKvSource>(*offloader_, *mirror);
        kv_.set_block_source(mirrored_source_.get());
      }
    } else {  // flags were checked before; a folder that vanished since is not worth failing for
      log_warning("KV offload off: " + offloader.status().message());
    }
  }
}

void Engine::offload_idle() {
  if (offloader_) offloader_->offload_cold(pool_, std::numeric_limits<int32_t>::max());
}

RequestId Engine::add(RequestSpec spec, std::optional<RequestId> id_in) {
  auto r = std::make_unique<Request>();
  r->id = id_in ? *id_in : next_id_++;
  r->prompt = std::move(spec.prompt);
  r->sampling = spec.sampling;
  r->limits = std::move(spec.limits);
  r->priority = spec.priority;
  if (const SloClasses& slo = options_.scheduler.slo; !slo.empty()) {
    const size_t c = slo.class_of(spec.slo_class, spec.priority);
    r->slo_class = static_cast<int32_t>(c);
    r->priority = slo.rank(c);
    const double ttft = slo.at(c).ttft_seconds;
    if (std::isfinite(ttft))
      r->deadline =
          std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                                 std::chrono::duration<double>(ttft));
  }
  r->session_id = std::move(spec.session_id);
  r->streaming = spec.streaming;
  r->prediction = std::move(spec.prediction);
  r->cache_salt = spec.cache_salt;
  r->arrival_order = next_arrival_++;
  r->group = r->id;
  r->num_samples = spec.n;
  const RequestId id = r->id;
  INFERD_CHECK(id < next_sample_id_);
  for (int32_t t : r->prompt) {
    if (t < 0 || t >= model_.config().vocab_size) {
      r->error = "token id " + std::to_string(t) + " is outside the vocabulary";
      break;
    }
  }
  if (r->error.empty() && r->streaming.enabled() && (spec.kv_export_id != 0 || spec.remote_kv))
    r->error = "a StreamingLLM window is not supported with disaggregated prefill";
  if (r->error.empty() && (spec.n < 1 || spec.n > kMaxSamples)) {
    r->error = "n must be in [1, " + std::to_string(kMaxSamples) + "], got " + std::to_string(spec.n);
    r->num_samples = 1;
  }
  if (r->error.empty() && r->sampling.prompt_logprobs &&
      (spec.n != 1 || spec.remote_kv || spec.kv_export_id != 0))
    r->error = "prompt_logprobs needs n = 1 and no disaggregated prefill";
  if (r->error.empty() && spec.pooling != Pooling::kNone) {
    r->pooling = spec.pooling;
    r->normalize_embedding = spec.normalize_embedding;
    r->limits.max_tokens = 0;
    if (spec.n != 1 || spec.remote_kv || spec.kv_export_id != 0 || r->prediction || r->streaming.enabled() ||
        r->sampling.prompt_logprobs)
      r->error =
          "an embedding request needs n = 1 and no disaggregation, prediction, prompt logprobs or "
          "StreamingLLM window";
    else if (options_.step_mirror != nullptr)
      r->error = "embeddings are not served with tensor or pipeline parallelism";
  }
  if (r->error.empty() && spec.lora != nullptr) {
    if (!model_.lora_enabled())
      r->error = "LoRA adapters are not enabled on this engine";
    else
      r->lora = std::move(spec.lora);
  }
  if (r->num_samples > 1) samples_[id] = {id};
  if (r->error.empty()) {
    Status s = r->sampling.validate();
    if (!s.is_ok()) r->error = s.message();
  }
  r->kv_export_id = options_.kv_export != nullptr ? spec.kv_export_id : 0;
  if (r->error.empty() && spec.remote_kv) {
    if (spec.first_token < 0 || spec.first_token >= model_.config().vocab_size) {
      r->error =
          "kv_transfer_params.first_token " + std::to_string(spec.first_token) + " is outside the vocabulary";
    } else if (r->num_samples != 1) {
      r->error = "kv_transfer_params needs n = 1";
    } else {
      if (spec.remote_kv->num_tokens == static_cast<int64_t>(r->prompt.size())) r->remote_kv = spec.remote_kv;
      r->output.push_back(spec.first_token);  // a count that disagrees: the prompt is computed here
      StepOutput o;
      o.id = id;
      o.new_tokens.push_back(spec.first_token);
      pending_outputs_.push_back(std::move(o));
    }
  }
  samplers_.emplace(id, Sampler(r->sampling));
  scheduler_.add(std::move(r));
  return id;
}

void Engine::abort(RequestId id) {
  auto it = samples_.find(id);
  if (it == samples_.end()) return scheduler_.abort(id);
  const std::vector<RequestId> ids = it->second;  // aborting edits samples_
  for (RequestId sample : ids) scheduler_.abort(sample);
}

void Engine::abort(RequestId id, int32_t index) {
  auto it = samples_.find(id);
  if (it == samples_.end()) {
    if (index == 0) scheduler_.abort(id);
    return;
  }
  if (index >= 0 && static_cast<size_t>(index) < it->second.size())
    scheduler_.abort(it->second[static_cast<size_t>(index)]);
}

StepOutput& StepOutputs::add() {
  if (size_ == slots_.size()) slots_.emplace_back();
  StepOutput& o = slots_[size_++];
  o.id = 0;
  o.index = 0;
  o.new_tokens.clear();
  o.logprobs.clear();
  o.top_logprobs.clear();
  o.prompt_logprobs_from = 0;
  o.prompt_tokens.clear();
  o.prompt_logprobs.clear();
  o.prompt_ranks.clear();
  o.prompt_top_logprobs.clear();
  o.first_scheduled.reset();
  o.predicted_tokens = 0;
  o.accepted_predicted_tokens = 0;
  o.embedding.clear();
  o.finished = false;
  o.finish_reason.reset();
  o.error.clear();
  o.internal = false;
  return o;
}

void StepOutputs::reserve(size_t n, size_t tokens) {
  while (slots_.size() < size_ + n) {
    slots_.emplace_back();
    slots_.back().new_tokens.reserve(tokens);
  }
}

void Engine::fork_samples(Request& parent, std::span<const float> logits) {
  parent.forked = true;
  auto& ids = samples_.at(parent.group);
  const auto prompt_len = static_cast<int64_t>(parent.prompt.size());
  for (int32_t i = 1; i < parent.num_samples; ++i) {
    auto r = std::make_unique<Request>();
    r->id = next_sample_id_++;
    r->group = parent.group;
    r->sample_index = i;
    r->prompt = parent.prompt;
    r->sampling = parent.sampling;
    if (r->sampling.seed) r->sampling.seed = *r->sampling.seed + static_cast<uint64_t>(i);  // as vLLM
    r->limits = parent.limits;
    r->priority = parent.priority;
    r->slo_class = parent.slo_class;
    r->deadline = parent.deadline;
    r->session_id = parent.session_id;
    r->streaming = parent.streaming;
    r->prediction = parent.prediction;
    r->cache_salt = parent.cache_salt;
    r->prediction_cursor = parent.prediction_cursor;
    r->lora = parent.lora;
    r->arrival_order = parent.arrival_order;
    r->first_scheduled = parent.first_scheduled;
    r->cached_tokens = parent.cached_tokens;
    ids.push_back(r->id);
    Sampler sampler(r->sampling);
    std::optional<KVCacheManager::BlockCopy> copy;
    if (!kv_.fork(parent.id, r->id, prompt_len, &copy)) {
      // No block for the copy of the prompt's last block: this sample recomputes its prompt.
      samplers_.emplace(r->id, std::move(sampler));
      scheduler_.add(std::move(r));
      continue;
    }
    if (copy) {
      const Status s = runner_.copy_block(copy->src, copy->dst);
      INFERD_CHECK_MSG(s.is_ok(), s.message().c_str());  // the group is gone: nothing can go on
    }
    r->num_computed_tokens = prompt_len;
    SampleResult res = sampler.sample(logits, r->prompt, r->output);
    if (res.dead_end) dead_ends_.emplace_back(r->id, sampler.dead_end_error());
    samplers_.emplace(r->id, std::move(sampler));
    StepOutput& o = outputs_.add();
    o.id = r->group;
    o.index = i;
    o.first_scheduled = r->first_scheduled;
    o.cached_tokens = r->cached_tokens;
    o.new_tokens.push_back(res.token);
    if (r->sampling.logprobs) {
      o.logprobs.push_back(res.logprob);
      o.top_logprobs.push_back(std::move(res.top_logprobs));
    }
    scheduler_.add_forked(std::move(r), res.token);
  }
}

namespace {
double seconds_between(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}
}  // namespace

std::span<const StepOutput> Engine::step() {
  using Clock = std::chrono::steady_clock;
  outputs_.clear();
  for (StepOutput& pending : pending_outputs_) outputs_.add() = std::move(pending);
  pending_outputs_.clear();
  const auto t0 = Clock::now();
  ScheduledBatch& batch = batch_;
  scheduler_.schedule(&batch);
  // A slot for every running request's output, made in the step that admitted it, not in the
  // later one that samples its first token.
  const SpeculativeOptions& spec = options_.scheduler.speculative;
  outputs_.reserve(static_cast<size_t>(scheduler_.num_running()),
                   1 + static_cast<size_t>(std::max(spec.enabled ? spec.ngram.num_speculative_tokens : 0,
                                                    kPredictionDraftTokens)));
  if (drafter_) {
    const int64_t passes = drafter_->forward_passes();
    drafter_->propose(&batch);
    stats_.spec_draft_passes += drafter_->forward_passes() - passes;
  }
  // Every item computes its last token (and its drafts): a decode step.
  const bool decode_only =
      !batch.empty() && std::all_of(batch.items.begin(), batch.items.end(), [](const auto& item) {
        return item.num_new_tokens == 1 + item.num_draft_tokens &&
               item.request->num_computed_tokens >= static_cast<int64_t>(item.request->prompt.size());
      });
  auto t1 = Clock::now(), t2 = t1, t3 = t1;
  if (!batch.empty()) {
    // Grammar masks of the constrained rows are computed while the forward pass runs.
    prefetch_.clear();
    for (const auto& item : batch.items) {
      auto it = samplers_.find(item.request->id);
      if (it != samplers_.end() && it->second.has_grammar()) prefetch_.push_back(&it->second);
    }
    const bool prefetching = options_.prefetch_grammar_masks && !prefetch_.empty();
    if (prefetching) masks_.start(&prefetch_, static_cast<size_t>(model_.config().vocab_size));
    Status s = runner_.execute(batch);
    if (prefetching) {
      const auto wait_start = Clock::now();
      masks_.wait();
      stats_.mask_wait_seconds += seconds_between(wait_start, Clock::now());
    }
    INFERD_CHECK_MSG(s.is_ok(), s.message().c_str());  // batches are built by us: a failure is a bug
    t2 = Clock::now();
    sampled_.assign(batch.items.size(), -1);
    accepted_.assign(batch.items.size(), 0);
    const auto items = runner_.sample_items();
    for (size_t k = 0; k < items.size(); ++k) {
      const auto item = static_cast<size_t>(items[k]);
      Request& r = *batch.items[item].request;
      if (r.kv_export_id != 0 && r.output.empty()) export_prompt_kv(r);
      Sampler& sampler = samplers_.at(r.id);
      StepOutput& o = outputs_.add();
      o.id = r.group;
      o.index = r.sample_index;
      o.first_scheduled = r.first_scheduled;
      o.cached_tokens = r.cached_tokens;
      auto emit = [&](SampleResult& res) {
        o.new_tokens.push_back(res.token);
        if (r.sampling.logprobs) {
          o.logprobs.push_back(res.logprob);
          o.top_logprobs.push_back(std::move(res.top_logprobs));
        }
      };
      if (r.draft.empty()) {
        SampleResult res = sampler.sample(runner_.logits_row(k), r.prompt, r.output);
        sampled_[item] = res.token;
        if (res.dead_end) dead_ends_.emplace_back(r.id, sampler.dead_end_error());
        emit(res);
      } else {
        // Verify the drafts: sample each position as decoding one token at a time would (the
        // rows are bit for bit those, batch invariance), keep going while the sample is the
        // draft. With a draft of one token per position this is speculative sampling's
        // rejection rule exactly: a draft is kept with the target's probability of it, and a
        // rejection samples the target's distribution without it. Greedy or seeded, the tokens
        // are those of decoding without drafts.
        history_.assign(r.output.begin(), r.output.end());
        size_t j = 0;
        for (;; ++j) {
          SampleResult res = sampler.sample(runner_.logits_row(k, j), r.prompt, history_);
          const int32_t token = res.token;
          emit(res);
          history_.push_back(token);
          if (res.dead_end) {
            dead_ends_.emplace_back(r.id, sampler.dead_end_error());
            break;
          }
          if (j == r.draft.size() || token != r.draft[j] || is_stop_token(r, token)) break;
        }
        sampled_[item] = history_.back();
        accepted_[item] = static_cast<int32_t>(j);
        ++stats_.spec_drafts;
        stats_.spec_draft_tokens += static_cast<int64_t>(r.draft.size());
        stats_.spec_accepted_tokens += static_cast<int64_t>(j);
        if (r.draft_from_prediction) {
          o.predicted_tokens = static_cast<int32_t>(r.draft.size());
          o.accepted_predicted_tokens = static_cast<int32_t>(j);
        }
      }
      // Before update(): a sample that finishes at once must not free the prompt's blocks first.
      if (r.num_samples > 1 && !r.forked && r.output.empty()) fork_samples(r, runner_.logits_row(k));
    }
    emit_prompt_logprobs(batch);
    emit_embeddings(batch);
    t3 = Clock::now();
    scheduler_.update(batch, sampled_, accepted_);
    for (auto& [id, error] : dead_ends_) {
      scheduler_.fail(id, error.empty() ? "the output grammar allows no token of the model's vocabulary here"
                                        : std::move(error));
    }
    dead_ends_.clear();
    ++stats_.steps;
    stats_.tokens += batch.num_tokens;
  }
  collect_finished();
  if (offloader_) offloader_->offload_cold(pool_, options_.offload.max_blocks_per_step);
  const auto t4 = Clock::now();
  stats_.schedule_seconds += seconds_between(t0, t1) + seconds_between(t3, t4);
  if (drafter_) stats_.spec_draft_seconds = drafter_->seconds();
  stats_.execute_seconds += seconds_between(t1, t2);
  stats_.sample_seconds += seconds_between(t2, t3);
  if (decode_only) {
    ++stats_.decode_steps;
    // Tokens generated (a decode step's items each emit one and their accepted drafts).
    int64_t generated = static_cast<int64_t>(batch.items.size());
    for (const int32_t a : accepted_) generated += a;
    stats_.decode_tokens += generated;
    stats_.decode_seconds += seconds_between(t0, t4);
  }
  if (!batch.empty())
    scheduler_.observe_step(batch, options_.step_cost ? options_.step_cost(batch) : seconds_between(t0, t4));
  // Nothing to run but KV loads in flight: give the source's thread a moment instead of spinning.
  if (batch.empty() && outputs_.view().empty() && !scheduler_.has_runnable() && scheduler_.num_kv_loads() > 0)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return std::as_const(outputs_).view();
}

void Engine::emit_embeddings(const ScheduledBatch& batch) {
  const auto pools = runner_.pool_rows();
  for (size_t k = 0; k < pools.size(); ++k) {
    const ModelRunner::PoolRows& pr = pools[k];
    Request& r = *batch.items[static_cast<size_t>(pr.item)].request;
    const auto dim = static_cast<size_t>(model_.config().hidden_size);
    // A request computed again from its start (preempted) sums its rows again.
    if ((pr.first_position == 0 && pr.count > 0) || r.pooling == Pooling::kLast) r.pooled.assign(dim, 0.0);
    for (int64_t j = 0; j < pr.count; ++j) {
      const std::span<const float> h = runner_.hidden_row(k, static_cast<size_t>(j));
      for (size_t d = 0; d < dim; ++d) r.pooled[d] += h[d];
    }
    const int64_t end = r.num_computed_tokens + batch.items[static_cast<size_t>(pr.item)].num_new_tokens;
    if (end < r.num_tokens()) continue;  // more of its prompt to come
    const double count = r.pooling == Pooling::kMean ? static_cast<double>(r.num_tokens()) : 1.0;
    double norm = 0;
    for (double& v : r.pooled) {
      v /= count;
      norm += v * v;
    }
    norm = std::sqrt(norm);
    // L2 normalization as torch's normalize(p=2, eps=1e-12) does it.
    const double scale = r.normalize_embedding ? 1.0 / std::max(norm, 1e-12) : 1.0;
    StepOutput& o = outputs_.add();
    o.id = r.group;
    o.index = r.sample_index;
    o.first_scheduled = r.first_scheduled;
    o.cached_tokens = r.cached_tokens;
    o.embedding.resize(dim);
    for (size_t d = 0; d < dim; ++d) o.embedding[d] = static_cast<float>(r.pooled[d] * scale);
  }
}

void Engine::export_prompt_kv(const Request& r) {
  const auto prompt_len = static_cast<int64_t>(r.prompt.size());
  const std::vector<BlockHash> keys = kv_.block_keys(
      {r.prompt, {}, r.lora ? BlockHash{r.lora->fingerprint_lo, r.lora->fingerprint_hi} : BlockHash{}},
      prompt_len);
  const auto table = kv_.block_table(r.id);
  INFERD_CHECK(table.size() >= keys.size());
  const size_t payload = cache_.block_bytes(), record = kv_record_bytes(payload);
  const size_t bytes = record * keys.size();
  if (!options_.kv_export->fits(bytes)) {
    log_warning("KV export buffer full: request " + std::to_string(r.id) + "'s KV is not kept for a pull");
    return;
  }
  std::vector<std::byte> records(bytes);
  for (size_t i = 0; i < keys.size(); ++i) {
    std::span<std::byte> rec(records.data() + i * record, record);
    cache_.export_block(table[i], rec.data() + kKvRecordHeaderBytes);
    seal_kv_record(rec, identity_, keys[i]);
  }
  options_.kv_export->put(r.kv_export_id, std::move(records), static_cast<int64_t>(keys.size()), record);
}

void Engine::emit_prompt_logprobs(const ScheduledBatch& batch) {
  const auto rows = runner_.prompt_rows();
  for (size_t k = 0; k < rows.size(); ++k) {
    const ModelRunner::PromptRows& pr = rows[k];
    Request& r = *batch.items[static_cast<size_t>(pr.item)].request;
    // The step's output of this request when it sampled too (one output per request and step).
    const auto outs = outputs_.view();
    auto it = std::find_if(outs.begin(), outs.end(),
                           [&](const StepOutput& o) { return o.id == r.group && o.index == r.sample_index; });
    StepOutput* o = nullptr;
    if (it == outs.end()) {
      o = &outputs_.add();
      o->id = r.group;
      o->index = r.sample_index;
      o->first_scheduled = r.first_scheduled;
      o->cached_tokens = r.cached_tokens;
    } else {
      o = &*it;
    }
    o->prompt_logprobs_from = pr.first_token;
    Sampler& sampler = samplers_.at(r.id);
    for (int64_t j = 0; j < pr.count; ++j) {
      const int32_t token = r.prompt[static_cast<size_t>(pr.first_token + j)];
      SampleResult res = sampler.logprobs_of(runner_.prompt_row(k, static_cast<size_t>(j)), token,
                                             *r.sampling.prompt_logprobs);
      o->prompt_tokens.push_back(token);
      o->prompt_logprobs.push_back(res.logprob);
      o->prompt_ranks.push_back(res.rank);
      o->prompt_top_logprobs.push_back(std::move(res.top_logprobs));
    }
    r.prompt_logprobs_next = pr.first_token + pr.count;
  }
}

void Engine::collect_finished() {
  auto mark = [this](RequestId id, int32_t index, const Request& r) {
    const auto outs = outputs_.view();
    auto it = std::find_if(outs.begin(), outs.end(),
                           [&](const StepOutput& o) { return o.id == id && o.index == index; });
    StepOutput* o = nullptr;
    if (it == outs.end()) {
      o = &outputs_.add();
      o->id = id;
      o->index = index;
    } else {
      o = &*it;
    }
    o->finished = true;
    o->finish_reason = r.finish_reason;
    o->error = r.error;
  };
  for (auto& r : scheduler_.take_finished()) {
    samplers_.erase(r->id);
    if (drafter_) drafter_->release(r->id);
    mark(r->group, r->sample_index, *r);
    // Ended before its samples were forked (error, abort, or an n that was refused): the other
    // samples end with it.
    if (r->num_samples > 1 && !r->forked) {
      for (int32_t i = 1; i < r->num_samples; ++i) mark(r->group, i, *r);
    }
    auto group = samples_.find(r->group);
    if (group != samples_.end()) {
      const auto& ids = group->second;
      if (std::none_of(ids.begin(), ids.end(), [&](RequestId s) { return scheduler_.contains(s); }))
        samples_.erase(group);
    }
  }
}

}  // namespace inferd
