// Google Benchmark: one sampled token (Sampler::sample) over a vocabulary of logits, for the
// filters a chat client sends: top-p, min-p, top-k, and the whole distribution. Vocabularies of
// SmolLM2 (49,152) and Qwen2.5 (151,936); logits drawn from a normal of spread 2 (flat: a
// nucleus of thousands of tokens) or 5 (peaked: tens), fixed per run. And a greedy token with
// its log-probabilities.
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "engine/sampler.h"

namespace {

using namespace inferd;

// state.range(0): vocabulary; range(1): 0 whole distribution, 1 top_p 0.95, 2 min_p 0.05,
// 3 top_k 40; range(2): the logits' spread.
void BM_SampleOneToken(benchmark::State& state) {
  const auto n = static_cast<size_t>(state.range(0));
  std::mt19937 gen(7);
  std::normal_distribution<float> normal(0.0f, static_cast<float>(state.range(2)));
  std::vector<float> logits(n);
  for (auto& l : logits) l = normal(gen);
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
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> logits(n);
  for (auto& l : logits) l = normal(gen);
  SamplingParams p{0.0f, 0, 1.0f, 1};
  if (state.range(1) >= 0) p.logprobs = static_cast<int32_t>(state.range(1));  // -1: none
  Sampler sampler(p);
  for (auto _ : state) benchmark::DoNotOptimize(sampler.sample(logits, {}, {}));
}

BENCHMARK(BM_GreedyWithLogprobs)
    ->ArgsProduct({{49152, 151936}, {-1, 0, 5, 20}})
    ->Unit(benchmark::kMicrosecond)
    ->MinTime(0.3);

}  // namespace

BENCHMARK_MAIN();
