#include "kernels/ops.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "test_support.h"

namespace inferd {
namespace {

TEST(OpsTest, RmsNormMatchesDefinition) {
  std::mt19937 rng(3);
  for (int64_t n : {1, 2, 7, 64, 129}) {
    auto x = test::random_floats(static_cast<size_t>(n), rng, -3, 3);
    auto w = test::random_floats(static_cast<size_t>(n), rng);
    std::vector<float> y(static_cast<size_t>(n));
    rms_norm(x.data(), w.data(), y.data(), n, 1e-5f);
    double ms = 0;
    for (float v : x) ms += static_cast<double>(v) * v;
    ms /= static_cast<double>(n);
    for (int64_t i = 0; i < n; ++i) {
      const double want = x[static_cast<size_t>(i)] / std::sqrt(ms + 1e-5) * w[static_cast<size_t>(i)];
      EXPECT_NEAR(y[static_cast<size_t>(i)], want, 1e-5 * std::max(1.0, std::fabs(want)));
    }
  }
}

// Every path's norm has the scalar path's bits (its sum of squares in the same 16 lanes and tree),
// at lengths around the vector width.
TEST(OpsTest, RmsNormSameBitsOnEveryPath) {
  std::mt19937 rng(6);
  for (int64_t n : {1, 7, 15, 16, 17, 31, 33, 576, 896, 1001}) {
    auto x = test::random_floats(static_cast<size_t>(n), rng, -30, 30);
    auto w = test::random_floats(static_cast<size_t>(n), rng);
    std::vector<float> want(static_cast<size_t>(n));
    rms_norm(x.data(), w.data(), want.data(), n, 1e-6f, Isa::kScalar);
    for (Isa isa : test::runnable_paths()) {
      std::vector<float> got(static_cast<size_t>(n));
      rms_norm(x.data(), w.data(), got.data(), n, 1e-6f, isa);
      EXPECT_EQ(got, want) << isa_name(isa) << " n " << n;
    }
  }
}

TEST(OpsTest, RopeNeoxMatchesRotateHalfFormula) {
  const int64_t hd = 8;
  auto inv = rope_inverse_frequencies(hd, 10000.0);
  ASSERT_EQ(inv.size(), 4u);
  EXPECT_FLOAT_EQ(inv[0], 1.0f);
  EXPECT_NEAR(inv[1], std::pow(10000.0, -0.25), 1e-7);
  std::mt19937 rng(11);
  auto x = test::random_floats(2 * hd, rng);
  auto y = x;
  const int64_t pos = 7;
  rope(y.data(), 2, hd, pos, inv.data(), RopePairing::kNeox);
  for (int64_t h = 0; h < 2; ++h) {
    for (int64_t i = 0; i < hd / 2; ++i) {
      const double a = pos * static_cast<double>(inv[static_cast<size_t>(i)]);
      const float x0 = x[static_cast<size_t>(h * hd + i)], x1 = x[static_cast<size_t>(h * hd + i + hd / 2)];
      EXPECT_NEAR(y[static_cast<size_t>(h * hd + i)], x0 * std::cos(a) - x1 * std::sin(a), 1e-5);
      EXPECT_NEAR(y[static_cast<size_t>(h * hd + i + hd / 2)], x1 * std::cos(a) + x0 * std::sin(a), 1e-5);
    }
  }
}

// llama.cpp's converter permutes Q/K rows so that interleaved RoPE on the permuted vector
// equals NeoX RoPE on the original: check that identity.
TEST(OpsTest, InterleavedRopeEqualsNeoxUnderConverterPermutation) {
  const int64_t hd = 16;
  auto inv = rope_inverse_frequencies(hd, 500000.0);
  std::mt19937 rng(12);
  auto x = test::random_floats(hd, rng);
  // permuted[2i] = x[i], permuted[2i+1] = x[i + hd/2]
  std::vector<float> permuted(hd);
  for (int64_t i = 0; i < hd / 2; ++i) {
    permuted[static_cast<size_t>(2 * i)] = x[static_cast<size_t>(i)];
    permuted[static_cast<size_t>(2 * i + 1)] = x[static_cast<size_t>(i + hd / 2)];
  }
  rope(x.data(), 1, hd, 123, inv.data(), RopePairing::kNeox);
  rope(permuted.data(), 1, hd, 123, inv.data(), RopePairing::kInterleaved);
  for (int64_t i = 0; i < hd / 2; ++i) {
    EXPECT_FLOAT_EQ(permuted[static_cast<size_t>(2 * i)], x[static_cast<size_t>(i)]);
    EXPECT_FLOAT_EQ(permuted[static_cast<size_t>(2 * i + 1)], x[static_cast<size_t>(i + hd / 2)]);
  }
}

TEST(OpsTest, SiluMul) {
  const float g[] = {-2.0f, 0.0f, 1.5f};
  const float u[] = {3.0f, 4.0f, -1.0f};
  float out[3];
  silu_mul(g, u, out, 3);
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(out[i], g[i] / (1 + std::exp(-g[i])) * u[i], 1e-6);
}

// The fused query/key rotation equals two rope() calls bit for bit, for both pairings.
TEST(OpsTest, RopeQkEqualsSeparateRotations) {
  std::mt19937 rng(4);
  const int64_t hd = 64;
  auto inv = rope_inverse_frequencies(hd, 1000000.0);
  for (RopePairing pairing : {RopePairing::kNeox, RopePairing::kInterleaved}) {
    for (int64_t pos : {0, 1, 37, 4095}) {
      auto q = test::random_floats(14 * hd, rng);
      auto k = test::random_floats(2 * hd, rng);
      auto q2 = q, k2 = k;
      rope_qk(q.data(), 14, k.data(), 2, hd, pos, inv.data(), pairing);
      rope(q2.data(), 14, hd, pos, inv.data(), pairing);
      rope(k2.data(), 2, hd, pos, inv.data(), pairing);
      EXPECT_EQ(q, q2);
      EXPECT_EQ(k, k2);
    }
  }
}

// The rotation from a table of the angles' cosines and sines (computed once per token for every
// layer) equals rope_qk bit for bit: both pairings, a scale, an odd number of heads.
TEST(OpsTest, RopeQkTableEqualsRopeQk) {
  std::mt19937 rng(5);
  for (const int64_t hd : {64, 128, 6}) {
    auto inv = rope_inverse_frequencies(hd, 1000000.0);
    for (RopePairing pairing : {RopePairing::kNeox, RopePairing::kInterleaved}) {
      for (int64_t pos : {0, 1, 37, 4095, 131071}) {
        const float scale = pos % 2 == 0 ? 1.0f : 1.0693f;
        auto q = test::random_floats(static_cast<size_t>(7 * hd), rng);
        auto k = test::random_floats(static_cast<size_t>(3 * hd), rng);
        auto q2 = q, k2 = k;
        rope_qk(q.data(), 7, k.data(), 3, hd, pos, inv.data(), pairing, scale);
        std::vector<float> cos_sin(static_cast<size_t>(hd));
        rope_cos_sin(pos, inv.data(), hd, scale, cos_sin.data());
        rope_qk_table(q2.data(), 7, k2.data(), 3, hd, cos_sin.data(), pairing);
        EXPECT_EQ(q, q2) << hd << " " << pos;
        EXPECT_EQ(k, k2) << hd << " " << pos;
      }
    }
  }
}

}  // namespace
}  // namespace inferd
