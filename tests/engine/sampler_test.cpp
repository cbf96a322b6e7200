#include "engine/sampler.h"

#include <gtest/gtest.h>

#include <map>

namespace inferd {
namespace {

TEST(SamplerTest, GreedyPicksArgmaxLowestOnTies) {
  Sampler s(SamplingParams{});
  const std::vector<float> logits{0.1f, 3.0f, -1.0f, 3.0f};
  EXPECT_EQ(s.sample(logits), 1);
}

TEST(SamplerTest, SameSeedSameSequence) {
  SamplingParams p{1.0f, 0, 1.0f, 42};
  const std::vector<float> logits{0.0f, 0.5f, 1.0f, 0.2f, -0.3f};
  Sampler a(p), b(p);
  std::vector<int32_t> xa, xb;
  for (int i = 0; i < 50; ++i) {
    xa.push_back(a.sample(logits));
    xb.push_back(b.sample(logits));
  }
  EXPECT_EQ(xa, xb);
  p.seed = 43;
  Sampler c(p);
  std::vector<int32_t> xc;
  for (int i = 0; i < 50; ++i) xc.push_back(c.sample(logits));
  EXPECT_NE(xa, xc);
}

TEST(SamplerTest, FrequenciesFollowSoftmax) {
  Sampler s(SamplingParams{1.0f, 0, 1.0f, 7});
  const std::vector<float> logits{0.0f, std::log(3.0f)};  // p = 1/4, 3/4
  int ones = 0;
  const int n = 20000;
  for (int i = 0; i < n; ++i) ones += s.sample(logits);
  EXPECT_NEAR(static_cast<double>(ones) / n, 0.75, 0.02);
}

TEST(SamplerTest, TopKAndTopPRestrictSupport) {
  const std::vector<float> logits{1.0f, 0.9f, 0.8f, -5.0f, 0.7f};
  Sampler k2(SamplingParams{1.0f, 2, 1.0f, 1});
  std::map<int32_t, int> seen;
  for (int i = 0; i < 2000; ++i) seen[k2.sample(logits)]++;
  EXPECT_EQ(seen.size(), 2u);
  EXPECT_TRUE(seen.count(0) && seen.count(1));
  Sampler p(SamplingParams{1.0f, 0, 0.01f, 1});  // only the top token carries 1% mass
  for (int i = 0; i < 100; ++i) EXPECT_EQ(p.sample(logits), 0);
}

TEST(SamplerTest, ValidateRanges) {
  EXPECT_FALSE((SamplingParams{-1.0f, 0, 1.0f, {}}).validate().is_ok());
  EXPECT_FALSE((SamplingParams{1.0f, -1, 1.0f, {}}).validate().is_ok());
  EXPECT_FALSE((SamplingParams{1.0f, 0, 0.0f, {}}).validate().is_ok());
  EXPECT_TRUE((SamplingParams{0.7f, 40, 0.9f, {}}).validate().is_ok());
}

}  // namespace
}  // namespace inferd
