// `inferd perplexity`'s scoring against a direct computation: the same chunks' logits from the
// forward pass (test::all_logits), log-softmax in double, the second halves averaged.
#include "eval/perplexity.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "model/model_loader.h"
#include "model/model_test_util.h"
#include "model/transformer.h"
#include "test_support.h"

namespace inferd {
namespace {

std::vector<int32_t> random_ids(size_t n, int32_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> d(0, vocab - 1);
  std::vector<int32_t> ids(n);
  for (auto& id : ids) id = d(rng);
  return ids;
}

// Mean negative log-likelihood of tokens [c * ctx + ctx/2 + 1, (c + 1) * ctx) given the chunk
// before them, over `chunks` chunks.
double direct_mean_nll(Transformer& model, const std::vector<int32_t>& ids, int64_t ctx, int64_t chunks,
                       KvDType kv_dtype = KvDType::kF16) {
  const int64_t vocab = model.config().vocab_size;
  double nll = 0;
  int64_t n = 0;
  for (int64_t c = 0; c < chunks; ++c) {
    const std::vector<int32_t> chunk(ids.begin() + c * ctx, ids.begin() + (c + 1) * ctx);
    const auto logits = test::all_logits(model, {chunk}, 0, false, 16, kv_dtype);
    for (int64_t i = ctx / 2; i < ctx - 1; ++i) {
      const float* row = logits.data() + i * vocab;
      double mx = row[0];
      for (int64_t v = 1; v < vocab; ++v) mx = std::max(mx, static_cast<double>(row[v]));
      double sum = 0;
      for (int64_t v = 0; v < vocab; ++v) sum += std::exp(row[v] - mx);
      nll -= row[chunk[static_cast<size_t>(i + 1)]] - mx - std::log(sum);
      ++n;
    }
  }
  return nll / static_cast<double>(n);
}

TEST(PerplexityTest, MatchesADirectComputation) {
  auto w = load_model(test::fixture_path("tiny/qwen2/model-q8_0.gguf"));
  ASSERT_TRUE(w.has_value()) << w.status().message();
  ThreadPool pool(2);
  Transformer model(**w, pool);
  const auto ids = random_ids(3 * 32 + 5, 256, 3);  // 3 whole chunks of 32 and a partial one
  auto r = perplexity(model, ids, {.context = 32});
  ASSERT_TRUE(r.has_value()) << r.status().message();
  EXPECT_EQ(r->chunks, 3);
  EXPECT_EQ(r->scored_tokens, 3 * 15);
  const double want = direct_mean_nll(model, ids, 32, 3);
  EXPECT_NEAR(r->mean_nll, want, 1e-9 * want);
  EXPECT_NEAR(r->perplexity, std::exp(want), 1e-9 * std::exp(want));
  EXPECT_FALSE(r->has_reference);
  auto two = perplexity(model, ids, {.context = 32, .max_chunks = 2});
  ASSERT_TRUE(two.has_value());
  EXPECT_EQ(two->chunks, 2);
  EXPECT_NEAR(two->mean_nll, direct_mean_nll(model, ids, 32, 2), 1e-9 * want);
}

// --kv-cache-dtype: the chunks run on a cache of that dtype (the 8-bit caches score differently).
TEST(PerplexityTest, ScoresOnTheKvCacheDtypeAsked) {
  auto w = load_model(test::fixture_path("tiny/qwen2/model-q8_0.gguf"));
  ASSERT_TRUE(w.has_value()) << w.status().message();
  ThreadPool pool(2);
  Transformer model(**w, pool);
  const auto ids = random_ids(2 * 32, 256, 4);
  const double f16 = direct_mean_nll(model, ids, 32, 2);
  for (KvDType dtype : {KvDType::kInt8, KvDType::kFp8}) {
    auto r = perplexity(model, ids, {.context = 32, .kv_dtype = dtype});
    ASSERT_TRUE(r.has_value()) << r.status().message();
    const double want = direct_mean_nll(model, ids, 32, 2, dtype);
    EXPECT_NEAR(r->mean_nll, want, 1e-9 * want);
    EXPECT_NE(r->mean_nll, f16);
    EXPECT_NEAR(r->mean_nll, f16, 0.02 * f16);
  }
}

// Against itself: no divergence, full agreement; against the f32 path: a small, positive one.
TEST(PerplexityTest, ReferenceModelGivesKlAndAgreement) {
  auto w = load_model(test::fixture_path("tiny/qwen2/model-q8_0.gguf"));
  ASSERT_TRUE(w.has_value());
  ThreadPool pool(2);
  Transformer model(**w, pool), same(**w, pool), f32(**w, pool, {.backend = BackendKind::kF32});
  const auto ids = random_ids(64, 256, 4);
  auto self = perplexity(model, ids, {.context = 32}, &same);
  ASSERT_TRUE(self.has_value());
  EXPECT_EQ(self->mean_kl, 0.0);
  EXPECT_EQ(self->top1_agreement, 1.0);
  EXPECT_EQ(self->reference_perplexity, self->perplexity);
  auto other = perplexity(model, ids, {.context = 32}, &f32);
  ASSERT_TRUE(other.has_value());
  EXPECT_GT(other->mean_kl, 0.0);
  EXPECT_LT(other->mean_kl, 0.1);
  EXPECT_GE(other->max_kl, other->mean_kl);
  EXPECT_NEAR(other->reference_perplexity, std::exp(direct_mean_nll(f32, ids, 32, 2)), 1e-6);
}

TEST(PerplexityTest, ErrorsNameTheProblem) {
  auto w = load_model(test::fixture_path("tiny/qwen2/model-q8_0.gguf"));
  ASSERT_TRUE(w.has_value());
  ThreadPool pool(1);
  Transformer model(**w, pool);
  const auto ids = random_ids(40, 256, 5);
  auto short_text = perplexity(model, ids, {.context = 64});
  ASSERT_FALSE(short_text.has_value());
  EXPECT_NE(short_text.status().message().find("fewer than one chunk"), std::string::npos);
  EXPECT_FALSE(perplexity(model, ids, {.context = 2}).has_value());
  auto too_long = perplexity(model, random_ids(600, 256, 6), {.context = 512});
  ASSERT_FALSE(too_long.has_value());
  EXPECT_NE(too_long.status().message().find("256"), std::string::npos);
}

}  // namespace
}  // namespace inferd
