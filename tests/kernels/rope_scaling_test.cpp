// Inverse frequencies of each RoPE scaling type against the formulas written out here in double
// (the papers' / transformers' definitions), and the per-position rule of dynamic NTK.
#include "kernels/rope_scaling.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numbers>
#include <random>

#include "kernels/ops.h"
#include "test_support.h"

namespace inferd {
namespace {

constexpr double kPi = std::numbers::pi;

std::vector<double> plain(int64_t head_dim, double theta) {
  std::vector<double> inv(static_cast<size_t>(head_dim / 2));
  for (size_t i = 0; i < inv.size(); ++i) inv[i] = std::pow(theta, -2.0 * static_cast<double>(i) / head_dim);
  return inv;
}

void expect_close(const std::vector<float>& got, const std::vector<double>& want, double rel,
                  const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_NEAR(got[i], want[i], rel * std::fabs(want[i])) << what << " dimension " << i;
}

TEST(RopeScalingTest, NoneAndLinear) {
  const RopeScaling none;
  expect_close(rope_scaled_inverse_frequencies(128, 500000.0, none), plain(128, 500000.0), 1e-6, "none");
  EXPECT_EQ(rope_scaled_inverse_frequencies(64, 1e6, none), rope_inverse_frequencies(64, 1e6));
  RopeScaling linear{.type = RopeScalingType::kLinear, .factor = 4.0};
  std::vector<double> want = plain(64, 10000.0);
  for (double& f : want) f /= 4.0;
  expect_close(rope_scaled_inverse_frequencies(64, 10000.0, linear), want, 1e-6, "linear");
}

// Llama 3.1 (factor 8, low 1, high 4, original 8192, theta 500000): wavelengths under 2048 are
// kept, over 8192 divided by 8, those between blended by smooth = (8192 / wavelen - 1) / 3.
TEST(RopeScalingTest, Llama3Regimes) {
  const RopeScaling s{.type = RopeScalingType::kLlama3,
                      .factor = 8.0,
                      .original_context = 8192,
                      .low_freq_factor = 1.0,
                      .high_freq_factor = 4.0};
  const std::vector<float> got = rope_scaled_inverse_frequencies(128, 500000.0, s);
  std::vector<double> want = plain(128, 500000.0);
  int kept = 0, divided = 0, blended = 0;
  for (double& f : want) {
    const double wavelen = 2 * kPi / f;
    if (wavelen < 2048) {
      ++kept;
    } else if (wavelen > 8192) {
      f /= 8;
      ++divided;
    } else {
      const double smooth = (8192 / wavelen - 1) / 3;
      f = (1 - smooth) * f / 8 + smooth * f;
      ++blended;
    }
  }
  EXPECT_GT(kept, 0);
  EXPECT_GT(divided, 0);
  EXPECT_GT(blended, 0);
  expect_close(got, want, 2e-6, "llama3");
  // llama.cpp's GGUF form (rope_freqs divisors) gives the same frequencies.
  RopeScaling gguf;
  const std::vector<double> base = plain(128, 500000.0);
  for (size_t i = 0; i < base.size(); ++i) gguf.freq_factors.push_back(static_cast<float>(base[i] / want[i]));
  expect_close(rope_scaled_inverse_frequencies(128, 500000.0, gguf), want, 2e-6, "rope_freqs");
}

// YaRN (Qwen2.5: factor 4, original 32768, theta 1e6, head_dim 128): the correction range
// [floor(d(32)), ceil(d(1))] with d(r) = dim ln(L / (2 pi r)) / (2 ln theta); dimensions below it
// extrapolate (keep theta^-2i/d), above it interpolate (divide by the factor), a linear ramp between.
TEST(RopeScalingTest, YarnBlendAndAttentionFactor) {
  for (bool truncate : {true, false}) {
    const RopeScaling s{.type = RopeScalingType::kYarn,
                        .factor = 4.0,
                        .original_context = 32768,
                        .truncate = truncate,
                        .attention_factor = yarn_attention_factor(4.0, 0, 0)};
    const double dim = 128, theta = 1e6;
    auto d = [&](double rotations) {
      return dim * std::log(32768 / (rotations * 2 * kPi)) / (2 * std::log(theta));
    };
    double low = d(32), high = d(1);
    if (truncate) {
      low = std::floor(low);
      high = std::ceil(high);
    }
    low = std::max(low, 0.0);
    high = std::min(high, dim - 1);
    std::vector<double> want = plain(128, theta);
    for (size_t i = 0; i < want.size(); ++i) {
      const double ramp = std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
      want[i] = want[i] / 4 * ramp + want[i] * (1 - ramp);
    }
    expect_close(rope_scaled_inverse_frequencies(128, theta, s), want, 2e-6,
                 truncate ? "yarn" : "yarn untruncated");
    EXPECT_NEAR(RopeFrequencies(128, theta, s).attention_factor(), 0.1 * std::log(4.0) + 1, 1e-7);
  }
  EXPECT_DOUBLE_EQ(yarn_attention_factor(1.0, 0, 0), 1.0);
  EXPECT_NEAR(yarn_attention_factor(40, 0.707, 1.0), (0.0707 * std::log(40) + 1) / (0.1 * std::log(40) + 1),
              1e-15);
}

// Dynamic NTK: base * (factor * L / L0 - (factor - 1))^(d / (d - 2)) for a sequence of L > L0
// tokens; position p takes L = p + 1, so positions inside the original context are unscaled.
TEST(RopeScalingTest, DynamicNtkPerPosition) {
  const RopeScaling s{.type = RopeScalingType::kDynamic, .factor = 2.0, .original_context = 16};
  const RopeFrequencies rope(16, 10000.0, s);
  std::vector<float> got(8);
  for (int64_t pos : {0, 7, 15}) {
    EXPECT_FALSE(rope.position_dependent(pos));
    rope.compute(pos, got.data());
    EXPECT_EQ(got, rope_inverse_frequencies(16, 10000.0)) << pos;
  }
  for (int64_t pos : {16, 28, 1000}) {
    EXPECT_TRUE(rope.position_dependent(pos));
    rope.compute(pos, got.data());
    const double base = 10000.0 * std::pow(2.0 * static_cast<double>(pos + 1) / 16 - 1, 16.0 / 14.0);
    expect_close(got, plain(16, base), 2e-6, "dynamic");
    EXPECT_EQ(got, rope_scaled_inverse_frequencies(16, 10000.0, s, pos + 1));
  }
  EXPECT_FLOAT_EQ(rope.attention_factor(), 1.0f);
}

// The attention factor multiplies cos and sin: the rotated vector scaled by it.
TEST(RopeScalingTest, RopeScaleMultipliesTheRotation) {
  std::mt19937 rng(3);
  const int64_t hd = 32;
  const std::vector<float> inv = rope_inverse_frequencies(hd, 10000.0);
  const std::vector<float> x = test::random_floats(3 * hd, rng);
  for (RopePairing pairing : {RopePairing::kNeox, RopePairing::kInterleaved}) {
    std::vector<float> a = x, b = x, k = x;
    rope(a.data(), 3, hd, 77, inv.data(), pairing);
    rope(b.data(), 3, hd, 77, inv.data(), pairing, 1.25f);
    for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(b[i], 1.25f * a[i], 1e-6f * (1 + std::fabs(a[i])));
    std::vector<float> q = x;
    rope_qk(q.data(), 3, k.data(), 3, hd, 77, inv.data(), pairing, 1.25f);
    EXPECT_EQ(q, b);
    EXPECT_EQ(k, b);
  }
}

}  // namespace
}  // namespace inferd
