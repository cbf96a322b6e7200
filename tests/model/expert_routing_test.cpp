// Mixture-of-experts routing: top-k against torch.topk's picks on rows full of ties
// (tests/fixtures/moe/topk_ties.json, written by scripts/fixtures/make_tiny_moe_models.py),
// softmax / renormalization, and the grouping of a step's tokens by expert.
#include "model/expert_routing.h"

#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "test_support.h"

namespace inferd {
namespace {

TEST(ExpertRoutingTest, TopKPicksWhatTorchPicksOnTies) {
  auto j = nlohmann::json::parse(test::read_text(test::fixture_path("moe/topk_ties.json")));
  std::vector<std::pair<float, int64_t>> queue;
  int cases = 0, tied = 0;
  for (const auto& c : j["cases"]) {
    const auto values = c["values"].get<std::vector<float>>();
    const auto want = c["indices"].get<std::vector<int32_t>>();
    const auto k = c["k"].get<int64_t>();
    std::vector<int32_t> got(static_cast<size_t>(k));
    top_k_indices(values, k, got, queue);
    EXPECT_EQ(got, want) << "case " << cases << " (n " << values.size() << ", k " << k << ")";
    // A case ties when the k-th value also appears outside the top k.
    const float kth = values[static_cast<size_t>(want.back())];
    tied += static_cast<int>(std::count(values.begin(), values.end(), kth)) > 1;
    ++cases;
  }
  std::printf("[ figures  ] %d torch.topk cases, %d with ties at the k-th value\n", cases, tied);
  EXPECT_GT(tied, cases / 2);
}

TEST(ExpertRoutingTest, SoftmaxTopKAndGrouping) {
  // 3 tokens, 4 experts, top-2.
  const std::vector<float> logits = {
      0.0f, 1.0f, 2.0f, 3.0f,   // token 0: experts 3, 2
      5.0f, 0.0f, 0.0f, 4.0f,   // token 1: experts 0, 3
      1.0f, 1.0f, 0.5f, -1.0f,  // token 2: experts 0 and 1, tied
  };
  ExpertRouting r;
  route_tokens(logits.data(), 3, 4, 2, /*normalize=*/false, &r);
  EXPECT_EQ(r.offsets, (std::vector<int32_t>{0, 2, 3, 4, 6}));
  EXPECT_EQ(r.tokens, (std::vector<int32_t>{1, 2, 2, 0, 0, 1}));
  // Unnormalized weights are the softmax probabilities.
  const double z0 = 1 + std::exp(1.0) + std::exp(2.0) + std::exp(3.0);
  EXPECT_NEAR(r.weights[3], std::exp(2.0) / z0, 1e-6);  // expert 2, token 0
  EXPECT_NEAR(r.weights[4], std::exp(3.0) / z0, 1e-6);  // expert 3, token 0
  route_tokens(logits.data(), 3, 4, 2, /*normalize=*/true, &r);
  EXPECT_NEAR(r.weights[3] + r.weights[4], 1.0, 1e-6);
  EXPECT_NEAR(r.weights[4], std::exp(1.0) / (1 + std::exp(1.0)), 1e-6);
  EXPECT_FLOAT_EQ(r.weights[1], 0.5f);  // token 2's two tied experts share evenly
  EXPECT_EQ(r.num_rows(0), 2);
}

}  // namespace
}  // namespace inferd
