// The engine end to end on real weights: continuous batching gives each request exactly the
// tokens it gets alone; preemption under a tiny KV budget changes nothing but timing.
#include "engine/engine.h"

#include <gtest/gtest.h>

#include <map>
#include <random>

#include "model/default_model.h"
#include "model/model_loader.h"
#include "test_support.h"

namespace inferd {
namespace {

struct Workload {
  std::vector<RequestSpec> specs;
};

Workload random_workload(int n, int64_t vocab, int64_t max_prompt, int64_t max_out, uint32_t seed) {
  std::mt19937 rng(seed);
  Workload w;
  for (int i = 0; i < n; ++i) {
    RequestSpec s;
    const int64_t len = 1 + static_cast<int64_t>(rng() % static_cast<uint32_t>(max_prompt));
    for (int64_t k = 0; k < len; ++k)
      s.prompt.push_back(static_cast<int32_t>(rng() % static_cast<uint32_t>(vocab)));
    s.limits.max_tokens = 1 + static_cast<int64_t>(rng() % static_cast<uint32_t>(max_out));
    w.specs.push_back(s);
  }
  return w;
}

EngineOptions options(int64_t blocks, int32_t block_size, int64_t budget) {
  EngineOptions o;
  o.num_kv_blocks = blocks;
  o.block_size = block_size;
  o.scheduler.max_num_batched_tokens = budget;
  o.scheduler.max_prefill_tokens = budget;
  o.scheduler.max_num_seqs = 64;
  o.scheduler.max_model_len = 256;
  return o;
}

// Runs the specs (all submitted at once, or one at a time) and returns each one's tokens.
std::vector<std::vector<int32_t>> run(Transformer& model, const EngineOptions& o, const Workload& w,
                                      bool together, int64_t* preemptions = nullptr) {
  Engine engine(model, o);
  std::vector<std::vector<int32_t>> out(w.specs.size());
  std::map<RequestId, size_t> index;
  auto drain = [&] {
    while (engine.has_work()) {
      for (const StepOutput& s : engine.step()) {
        auto& tokens = out[index.at(s.id)];
        tokens.insert(tokens.end(), s.new_tokens.begin(), s.new_tokens.end());
        EXPECT_TRUE(s.error.empty()) << s.error;
      }
    }
  };
  for (size_t i = 0; i < w.specs.size(); ++i) {
    index[engine.add(w.specs[i])] = i;
    if (!together) drain();
  }
  drain();
  EXPECT_EQ(engine.block_pool().num_free_blocks(), engine.block_pool().num_blocks());
  if (preemptions != nullptr) *preemptions = engine.scheduler().num_preemptions();
  return out;
}

// Loads `path` and checks that the workload run all at once gives each request exactly the
// tokens it gets alone, and the asked number of them.
void expect_batched_equals_alone(const std::string& path, const Workload& w, const EngineOptions& o) {
  auto weights = load_model(path);
  ASSERT_TRUE(weights.has_value()) << weights.status().message();
  ThreadPool pool(2);
  Transformer model(**weights, pool);
  const auto alone = run(model, o, w, false);
  const auto together = run(model, o, w, true);
  EXPECT_EQ(together, alone) << path;
  for (size_t i = 0; i < w.specs.size(); ++i) {
    EXPECT_EQ(static_cast<int64_t>(alone[i].size()), w.specs[i].limits.max_tokens);
  }
}

TEST(EngineTest, ThirtyTwoRequestsTogetherEqualAloneTinyModels) {
  for (const char* variant : {"llama_untied", "qwen2", "qwen3"}) {
    expect_batched_equals_alone(test::fixture_path(std::string("tiny/") + variant),
                                random_workload(32, 256, 40, 24, 3), options(512, 16, 64));
  }
}

TEST(EngineTest, ThirtyTwoRequestsTogetherEqualAloneDefaultModel) {
  auto path = default_model_path();
  if (!path) GTEST_SKIP() << "default model not installed";
  // No stop ids in these specs: every request runs to its max_tokens.
  expect_batched_equals_alone(*path, random_workload(32, 49152, 12, 4, 9), options(256, 16, 256));
}

TEST(EngineTest, FrequentPreemptionKeepsOutputs) {
  auto weights = load_model(test::fixture_path("tiny/qwen3"));
  ASSERT_TRUE(weights.has_value());
  ThreadPool pool(2);
  Transformer model(**weights, pool);
  const Workload w = random_workload(16, 256, 20, 30, 21);
  int64_t preemptions = 0;
  const auto roomy = run(model, options(512, 4, 32), w, true);
  const auto tight = run(model, options(13, 4, 32), w, true, &preemptions);  // 52 slots
  EXPECT_EQ(tight, roomy);
  EXPECT_GT(preemptions, 0);
  std::printf("[ figures  ] %lld preemptions with 13 blocks of 4\n", static_cast<long long>(preemptions));
}

TEST(EngineTest, HighPriorityGetsItsFirstTokenFirst) {
  auto weights = load_model(test::fixture_path("tiny/llama_tied"));
  ASSERT_TRUE(weights.has_value());
  ThreadPool pool(1);
  Transformer model(**weights, pool);
  Engine engine(model, options(512, 16, 24));  // budget fits about one prompt a step
  Workload w = random_workload(6, 256, 1, 4, 5);
  std::vector<RequestId> low;
  for (auto s : w.specs) {
    s.prompt.assign(20, 3);
    s.priority = 5;
    low.push_back(engine.add(s));
  }
  RequestSpec urgent = w.specs[0];
  urgent.prompt.assign(20, 4);
  urgent.priority = -1;
  const RequestId high = engine.add(urgent);
  std::map<RequestId, int> first_step;
  for (int step = 0; engine.has_work(); ++step) {
    for (const auto& s : engine.step()) {
      if (!s.new_tokens.empty() && !first_step.count(s.id)) first_step[s.id] = step;
    }
  }
  for (RequestId id : low) EXPECT_LT(first_step.at(high), first_step.at(id));
}

TEST(EngineTest, BadRequestsFailAlone) {
  auto weights = load_model(test::fixture_path("tiny/llama_tied"));
  ASSERT_TRUE(weights.has_value());
  ThreadPool pool(1);
  Transformer model(**weights, pool);
  Engine engine(model, options(4, 4, 32));
  RequestSpec good{{1, 2, 3}, {}, {2, {}, false}, 0};
  RequestSpec bad_id{{1, 999}, {}, {2, {}, false}, 0};
  RequestSpec too_big{{1, 2, 3}, {}, {30, {}, false}, 0};
  const RequestId g = engine.add(good), b = engine.add(bad_id), t = engine.add(too_big);
  std::map<RequestId, StepOutput> last;
  while (engine.has_work()) {
    for (auto& s : engine.step()) last[s.id] = s;
  }
  for (auto& s : engine.step()) last[s.id] = s;
  EXPECT_EQ(last[g].finish_reason, FinishReason::kLength);
  EXPECT_EQ(last[b].finish_reason, FinishReason::kError);
  EXPECT_NE(last[b].error.find("outside the vocabulary"), std::string::npos);
  EXPECT_EQ(last[t].finish_reason, FinishReason::kError);
}

}  // namespace
}  // namespace inferd
