// Google Benchmark: one sampled token (Sampler::sample) over a vocabulary of logits, for the
// filters a chat client sends: top-p, min-p, top-k, and the whole distribution. Vocabularies of
// SmolLM2 (49,152) and Qwen2.5 (151,936); logits drawn from a normal of spread 2 (flat: a
// nucleus of thousands of tokens) or 5 (peaked: tens), fixed per run. And a greedy token with
// its log-probabilities, and a token with repetition penalties.
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "engine/sampler.h"

namespace {

using namespace inferd;

// n logits drawn from a normal of the given spread.
std::vector<float> random_logits(size_t n, float spread, std::mt19937& gen) {
  std::normal_distribution<float> normal(0.0f, spread);
  std::vector<float> logits(n);
  for (auto& l : logits) l = normal(gen);
  return logits;
}

// state.range(0): vocabulary; range(1): 0 whole distribution, 1 top_p 0.95, 2 min_p 0.05,
// 3 top_k 40; range(2): the logits' spread.
void BM_SampleOneToken(benchmark::State& state) {
  const auto n = static_cast<size_t>(state.range(0));
  std::mt19937 gen(7);
  const std::vector<float> logits = random_logits(n, static_cast<float>(state.range(2)), gen);
  SamplingParams p{0.8f, 0, 1.0f, 1};
  if (state.range(1) == 1) p.top_p = 0.95f;
  if (state.range(1) == 2) p.min_p = 0.05f;
  if (state.range(1) == 3) p.top_k = 40;
  Sampler sampler(p);
  for (auto _ : state) benchmark::DoNotOptimize(sampler.sample(logits));
  const char* names[] = {"whole distribution", "top_p 0.95", "min_p 0.05", "top_k 40"};
  state.SetLabel(names[state.range(1)]);
}

BENCHMARK(BM_SampleOneToken)
    ->ArgsProduct({{49152, 151936}, {0, 1, 2, 3}, {2, 5}})
    ->Unit(benchmark::kMicrosecond)
    ->MinTime(0.3);

// A greedy token, alone (state.range(1) -1) or with its log-probability and the top range(1)
// (OpenAI's logprobs): the log-sum-exp over the vocabulary and the best k.
void BM_GreedyWithLogprobs(benchmark::State& state) {
  const auto n = static_cast<size_t>(state.range(0));
  std::mt19937 gen(7);
  const std::vector<float> logits = random_logits(n, 2.0f, gen);
  SamplingParams p{0.0f, 0, 1.0f, 1};
  if (state.range(1) >= 0) p.logprobs = static_cast<int32_t>(state.range(1));  // -1: none
  Sampler sampler(p);
  for (auto _ : state) benchmark::DoNotOptimize(sampler.sample(logits, {}, {}));
}

BENCHMARK(BM_GreedyWithLogprobs)
    ->ArgsProduct({{49152, 151936}, {-1, 0, 5, 20}})
    ->Unit(benchmark::kMicrosecond)
    ->MinTime(0.3);

// A token with repetition, presence and frequency penalties (a chat client's anti-repetition
// settings) after a prompt of range(1) tokens and an output of range(2); greedy (range(3) 0) or
// temperature 0.8 over the whole distribution (1).
void BM_SampleWithPenalties(benchmark::State& state) {
  const auto n = static_cast<size_t>(state.range(0));
  std::mt19937 gen(7);
  const std::vector<float> logits = random_logits(n, 2.0f, gen);
  std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(n) - 1);
  std::vector<int32_t> prompt(static_cast<size_t>(state.range(1))),
      output(static_cast<size_t>(state.range(2)));
  for (auto& t : prompt) t = token(gen);
  for (auto& t : output) t = token(gen);
  SamplingParams p{state.range(3) ? 0.8f : 0.0f, 0, 1.0f, 1};
  p.repetition_penalty = 1.1f;
  p.presence_penalty = 0.5f;
  p.frequency_penalty = 0.5f;
  Sampler sampler(p);
  for (auto _ : state) benchmark::DoNotOptimize(sampler.sample(logits, prompt, output));
}

BENCHMARK(BM_SampleWithPenalties)
    ->ArgsProduct({{49152, 151936}, {512, 4096}, {256}, {0, 1}})
    ->Unit(benchmark::kMicrosecond)
    ->MinTime(0.3);

}  // namespace

BENCHMARK_MAIN();
