#include "engine/engine.h"

#include <algorithm>
#include <chrono>

#include "common/check.h"

namespace inferd {

Status EngineOptions::validate() const {
  INFERD_RETURN_IF_ERROR(scheduler.validate());
  if (block_size < 1 || block_size > 1024) return invalid_argument("block_size must be in [1, 1024]");
  if (num_kv_blocks < 1) return invalid_argument("the KV cache must hold at least one block");
  return Status::ok();
}

Engine::Engine(Transformer& model, const EngineOptions& options)
    : options_(options),
      model_(model),
      cache_(model.config().num_layers, options.num_kv_blocks, options.block_size, model.config().kv_dim(),
             options.kv_dtype),
      pool_(static_cast<int32_t>(options.num_kv_blocks)),
      kv_(pool_, options.block_size),
      scheduler_(options.scheduler, kv_),
      runner_(model, cache_, kv_) {
  INFERD_CHECK(options.validate().is_ok());
}

RequestId Engine::add(RequestSpec spec, std::optional<RequestId> id_in) {
  auto r = std::make_unique<Request>();
  r->id = id_in ? *id_in : next_id_++;
  r->prompt = std::move(spec.prompt);
  r->sampling = spec.sampling;
  r->limits = std::move(spec.limits);
  r->priority = spec.priority;
  r->arrival_order = next_arrival_++;
  const RequestId id = r->id;
  for (int32_t t : r->prompt) {
    if (t < 0 || t >= model_.config().vocab_size) {
      r->error = "token id " + std::to_string(t) + " is outside the vocabulary";
      break;
    }
  }
  if (r->error.empty()) {
    Status s = r->sampling.validate();
    if (!s.is_ok()) r->error = s.message();
  }
  samplers_.emplace(id, Sampler(r->sampling));
  scheduler_.add(std::move(r));
  return id;
}

void Engine::abort(RequestId id) {
  scheduler_.abort(id);
}

namespace {
double seconds_between(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}
}  // namespace

std::vector<StepOutput> Engine::step() {
  using Clock = std::chrono::steady_clock;
  std::vector<StepOutput> out;
  const auto t0 = Clock::now();
  const ScheduledBatch batch = scheduler_.schedule();
  auto t1 = Clock::now(), t2 = t1, t3 = t1;
  if (!batch.empty()) {
    Status s = runner_.execute(batch);
    INFERD_CHECK_MSG(s.is_ok(), s.message().c_str());  // batches are built by us: a failure is a bug
    t2 = Clock::now();
    sampled_.assign(batch.items.size(), -1);
    const auto items = runner_.sample_items();
    for (size_t k = 0; k < items.size(); ++k) {
      const auto item = static_cast<size_t>(items[k]);
      const Request& r = *batch.items[item].request;
      SampleResult res = samplers_.at(r.id).sample(runner_.logits_row(k), r.prompt, r.output);
      sampled_[item] = res.token;
      StepOutput o;
      o.id = r.id;
      o.new_tokens.push_back(res.token);
      if (r.sampling.logprobs >= 0) {
        o.logprobs.push_back(res.logprob);
        o.top_logprobs.push_back(std::move(res.top_logprobs));
      }
      out.push_back(std::move(o));
    }
    t3 = Clock::now();
    scheduler_.update(batch, sampled_);
    ++stats_.steps;
    stats_.tokens += batch.num_tokens;
  }
  collect_finished(&out);
  const auto t4 = Clock::now();
  stats_.schedule_seconds += seconds_between(t0, t1) + seconds_between(t3, t4);
  stats_.execute_seconds += seconds_between(t1, t2);
  stats_.sample_seconds += seconds_between(t2, t3);
  if (!batch.empty()) scheduler_.observe_step(batch, seconds_between(t0, t4));
  return out;
}

void Engine::collect_finished(std::vector<StepOutput>* out) {
  for (auto& r : scheduler_.take_finished()) {
    samplers_.erase(r->id);
    auto it = std::find_if(out->begin(), out->end(), [&](const StepOutput& o) { return o.id == r->id; });
    if (it == out->end()) {
      StepOutput o;
      o.id = r->id;
      it = out->insert(out->end(), std::move(o));
    }
    it->finished = true;
    it->finish_reason = r->finish_reason;
    it->error = r->error;
  }
}

}  // namespace inferd
