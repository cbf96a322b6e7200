#include "eval/latency_benchmark.h"

#include <algorithm>
#include <chrono>
#include <random>

#include "engine/engine.h"

namespace inferd {

Status LatencyBenchOptions::validate() const {
  if (prompt_tokens < 0 || gen_tokens < 0 || depth < 0)
    return invalid_argument("-p, -n and -d must not be negative");
  if (depth > 0 && gen_tokens == 0) return invalid_argument("-d applies to the tg run: give -n");
  if (prompt_tokens == 0 && gen_tokens == 0)
    return invalid_argument("-p and -n are both 0: nothing to measure");
  if (repetitions < 1) return invalid_argument("-r must be at least 1");
  return Status::ok();
}

namespace {

using Clock = std::chrono::steady_clock;

// Runs one request to completion; returns the seconds of its steps after the first `skip`, and
// adds the collectives' seconds of those steps (by `collectives`, when given) to *in_collectives.
// *timed_steps (when given): how many steps the timing covered. A request the engine refuses or
// fails is an error: its time would measure nothing.
Expected<double> run_request(Engine& engine, RequestSpec spec, int64_t skip,
                             const std::function<double()>& collectives = {},
                             double* in_collectives = nullptr, int64_t* timed_steps = nullptr) {
  const auto clock = [&] { return collectives ? collectives() : 0.0; };
  engine.add(std::move(spec));
  int64_t step = 0;
  Clock::time_point t0 = Clock::now();
  double c0 = clock();
  while (engine.has_work()) {
    if (step++ == skip) {
      t0 = Clock::now();
      c0 = clock();
    }
    for (const StepOutput& out : engine.step())
      if (!out.error.empty()) return invalid_argument("the benchmark's request failed: " + out.error);
  }
  if (in_collectives != nullptr) *in_collectives += clock() - c0;
  if (timed_steps != nullptr) *timed_steps = step - std::min(step, skip);
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

RequestSpec spec_of(int64_t prompt_len, int64_t max_tokens, int64_t vocab, std::mt19937_64& rng) {
  RequestSpec s;
  std::uniform_int_distribution<int64_t> id(0, vocab - 1);
  for (int64_t i = 0; i < prompt_len; ++i) s.prompt.push_back(static_cast<int32_t>(id(rng)));
  s.limits.max_tokens = max_tokens;
  s.limits.ignore_eos = true;
  return s;
}

}  // namespace

Expected<LatencyBenchResult> run_latency_benchmark(Transformer& model, const LatencyBenchOptions& o) {
  INFERD_RETURN_IF_ERROR(o.validate());
  const ModelConfig& c = model.config();
  // The warm-up's prompt and its two tokens; the depth, its n tokens and the first.
  const int64_t context = std::max(o.prompt_tokens + 2, o.depth + o.gen_tokens + 2);
  const bool streaming = o.streaming.enabled();
  if (!streaming && context > c.max_position_embeddings)
    return invalid_argument("-p / -n / -d need " + std::to_string(context) + " positions; the model has " +
                            std::to_string(c.max_position_embeddings));
  EngineOptions e;
  e.block_size = 16;
  e.num_kv_blocks = context / e.block_size + 2;
  e.kv_dtype = o.kv_dtype;
  e.prefix_caching = false;  // every repetition computes its prompt
  // The depth's prompt is computed in chunks of up to 512 tokens (or p), untimed.
  e.scheduler.max_num_batched_tokens =
      std::max<int64_t>({o.prompt_tokens, std::min<int64_t>(o.depth, 512), 1});
  e.scheduler.max_prefill_tokens = e.scheduler.max_num_batched_tokens;
  e.scheduler.max_num_seqs = 1;
  e.scheduler.max_model_len = context;
  if (streaming) {  // a pool of the prompt's or the window's size, whichever is larger
    const int64_t held = streaming_sink_len(o.streaming, e.block_size) + 2 * o.streaming.window_tokens +
                         e.scheduler.max_num_batched_tokens + 4 * e.block_size;
    e.num_kv_blocks = std::min(e.num_kv_blocks, std::max(o.prompt_tokens + 1, held) / e.block_size + 2);
    e.scheduler.max_model_len =
        std::max(context, streaming_sink_len(o.streaming, e.block_size) + o.streaming.window_tokens);
  }
  if (o.prepare_engine) INFERD_RETURN_IF_ERROR(o.prepare_engine(e));
  INFERD_RETURN_IF_ERROR(e.validate());
  Engine engine(model, e);
  std::mt19937_64 rng(o.seed);
  // Warm-up (as llama-bench's): a prompt of the measured length, so weights and every buffer a
  // step of that size uses are touched before the timed runs.
  INFERD_RETURN_IF_ERROR(
      run_request(engine, spec_of(std::max<int64_t>(o.prompt_tokens, 1), 2, c.vocab_size, rng), 0).status());
  LatencyBenchResult r;
  double pp_seconds = 0, pp_collectives = 0, tg_seconds = 0, tg_collectives = 0;
  for (int32_t rep = 0; rep < o.repetitions; ++rep) {
    if (o.prompt_tokens > 0) {
      // max_tokens 1: the request ends in the step that computes the prompt.
      auto timed = run_request(engine, spec_of(o.prompt_tokens, 1, c.vocab_size, rng), 0,
                               o.collective_seconds, &pp_collectives);
      INFERD_RETURN_IF_ERROR(timed.status());
      const double s = *timed;
      pp_seconds += s;
      r.prompt_tokens_per_second.push_back(static_cast<double>(o.prompt_tokens) / s);
    }
    if (o.gen_tokens > 0) {
      // The first steps compute the context (1 token, or the depth's in chunks) and sample token
      // 1; the n steps after them decode one token each.
      const int64_t ctx = std::max<int64_t>(o.depth, 1);
      const int64_t budget = streaming
                                 ? std::min(e.scheduler.max_num_batched_tokens, o.streaming.window_tokens)
                                 : e.scheduler.max_num_batched_tokens;
      RequestSpec spec = spec_of(ctx, o.gen_tokens + 1, c.vocab_size, rng);
      spec.streaming = o.streaming;
      auto timed = run_request(engine, std::move(spec), (ctx + budget - 1) / budget, o.collective_seconds,
                               &tg_collectives, &r.generation_steps);
      INFERD_RETURN_IF_ERROR(timed.status());
      const double s = *timed;
      tg_seconds += s;
      r.generation_tokens_per_second.push_back(static_cast<double>(o.gen_tokens) / s);
    }
  }
  if (pp_seconds > 0) r.prompt_collective_share = pp_collectives / pp_seconds;
  if (tg_seconds > 0) r.generation_collective_share = tg_collectives / tg_seconds;
  return r;
}

}  // namespace inferd
