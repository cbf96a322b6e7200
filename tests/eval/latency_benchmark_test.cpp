// `inferd bench latency`: tg at a depth times exactly n decode steps after the depth's prompt,
// on the KV cache dtype asked; bad lengths are refused.
#include "eval/latency_benchmark.h"

#include <gtest/gtest.h>

#include "model/model_loader.h"
#include "model/transformer.h"
#include "test_support.h"

namespace inferd {
namespace {

TEST(LatencyBenchmarkTest, GenerationAtADepthTimesOnlyTheDecodeSteps) {
  // 1,024 positions: room for a depth of two prefill chunks.
  auto w = load_model(test::fixture_path("tiny/qwen2_rope_yarn"));
  ASSERT_TRUE(w.has_value()) << w.status().message();
  ThreadPool pool(2);
  Transformer model(**w, pool);
  for (KvDType dtype : {KvDType::kF16, KvDType::kInt8}) {
    // A depth of 1,000 tokens: prefill chunks of 512 and 488, untimed.
    LatencyBenchOptions o{
        .prompt_tokens = 0, .gen_tokens = 5, .repetitions = 2, .depth = 1000, .kv_dtype = dtype};
    auto r = run_latency_benchmark(model, o);
    ASSERT_TRUE(r.has_value()) << r.status().message();
    EXPECT_TRUE(r->prompt_tokens_per_second.empty());
    ASSERT_EQ(r->generation_tokens_per_second.size(), 2u);
    EXPECT_EQ(r->generation_steps, 5);
    for (double tps : r->generation_tokens_per_second) EXPECT_GT(tps, 0);
  }
  // The warm-up is a prompt of 8 and two tokens: refused by the engine, it would make the run an error
  // (it once was refused, and the first timed prompt paid for touching every buffer).
  auto plain = run_latency_benchmark(model, {.prompt_tokens = 8, .gen_tokens = 3, .repetitions = 1});
  ASSERT_TRUE(plain.has_value()) << plain.status().message();
  EXPECT_EQ(plain->generation_steps, 3);
  EXPECT_EQ(plain->prompt_tokens_per_second.size(), 1u);
}

TEST(LatencyBenchmarkTest, RefusesBadLengths) {
  auto w = load_model(test::fixture_path("tiny/qwen2/model-q8_0.gguf"));
  ASSERT_TRUE(w.has_value());
  ThreadPool pool(1);
  Transformer model(**w, pool);
  EXPECT_FALSE(run_latency_benchmark(model, {.prompt_tokens = 8, .gen_tokens = 0, .depth = 16}).has_value());
  EXPECT_FALSE(run_latency_benchmark(model, {.prompt_tokens = 0, .gen_tokens = 4, .depth = -1}).has_value());
  auto r = run_latency_benchmark(model, {.prompt_tokens = 0, .gen_tokens = 4, .depth = 1 << 24});
  ASSERT_FALSE(r.has_value());
  EXPECT_NE(r.status().message().find("positions"), std::string::npos) << r.status().message();
}

}  // namespace
}  // namespace inferd
