#include "kernels/sampling_kernels.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernels/exp_poly.h"
#include "test_support.h"

namespace inferd {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

TEST(SamplingKernelsTest, ExpPolyIsWithinFourUlpOfExp) {
  std::mt19937 gen(3);
  std::uniform_real_distribution<float> any(-87.0f, 88.0f);
  std::vector<float> xs{-87.0f, -86.5f, -20.0f, -1.0f, -0.5f, 0.0f, 1e-8f, 0.5f, 1.0f, 30.0f, 88.0f};
  for (int i = 0; i < 200000; ++i) xs.push_back(any(gen));
  for (float x : xs) {
    const double want = std::exp(static_cast<double>(x));
    const double got = exp_poly(x);
    // 4 ulp of the float result.
    EXPECT_LE(std::abs(got - want), 4.0 * want * std::ldexp(1.0, -23)) << "x=" << x;
  }
  EXPECT_EQ(exp_poly(0.0f), 1.0f);
  EXPECT_EQ(exp_poly(-1000.0f), exp_poly(-87.0f));  // clamped
}

// Logits of n tokens, some ruled out (-inf), the first one always live.
std::vector<float> random_logits(int64_t n, std::mt19937& gen, float spread, double masked) {
  std::normal_distribution<float> normal(0.0f, spread);
  std::bernoulli_distribution out(masked);
  std::vector<float> x(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) x[static_cast<size_t>(i)] = i > 0 && out(gen) ? kNegInf : normal(gen);
  return x;
}

TEST(SamplingKernelsTest, EveryPathGivesTheScalarBitsAndTheSoftmax) {
  std::mt19937 gen(11);
  for (int64_t n : {1, 2, 15, 16, 17, 1023, 1024, 1025, 3001, 49153}) {
    for (float temperature : {0.3f, 1.0f, 1.9f}) {
      for (double masked : {0.0, 0.5, 0.99}) {
        const std::vector<float> x = random_logits(n, gen, 4.0f, masked);
        const auto blocks = static_cast<size_t>((n + kSoftmaxBlock - 1) / kSoftmaxBlock);
        std::vector<float> w_ref(static_cast<size_t>(n), -1.0f), sums_ref(blocks, -1.0f);
        const float m_ref =
            softmax_weights(x.data(), n, temperature, w_ref.data(), sums_ref.data(), Isa::kScalar);
        // Against the definition, in double.
        float top = kNegInf;
        for (float v : x) top = std::max(top, v);
        ASSERT_EQ(m_ref, top / temperature);
        for (size_t b = 0; b < blocks; ++b) {
          double sum = 0;
          for (size_t i = b * kSoftmaxBlock; i < std::min(x.size(), (b + 1) * kSoftmaxBlock); ++i) {
            if (x[i] == kNegInf) {
              ASSERT_EQ(w_ref[i], 0.0f) << "masked token " << i;
              continue;
            }
            const double want = std::exp(static_cast<double>(x[i] / temperature - m_ref));
            if (want > 1e-30) {
              ASSERT_NEAR(w_ref[i], want, 4.0 * want * std::ldexp(1.0, -23)) << "n=" << n << " i=" << i;
            }
            sum += w_ref[i];
          }
          ASSERT_NEAR(sums_ref[b], sum, 1e-5 * sum + 1e-30) << "n=" << n << " block " << b;
        }
        for (Isa isa : test::runnable_paths()) {
          std::vector<float> w(static_cast<size_t>(n), -1.0f), sums(blocks, -1.0f);
          const float m = softmax_weights(x.data(), n, temperature, w.data(), sums.data(), isa);
          ASSERT_EQ(m, m_ref) << isa_name(isa);
          ASSERT_EQ(std::memcmp(w.data(), w_ref.data(), w.size() * sizeof(float)), 0)
              << isa_name(isa) << " n=" << n << " t=" << temperature;
          ASSERT_EQ(std::memcmp(sums.data(), sums_ref.data(), sums.size() * sizeof(float)), 0)
              << isa_name(isa) << " n=" << n << " t=" << temperature;
        }
      }
    }
  }
}

// A row whose every token is ruled out: m is -inf and no weight, so a sampler sees a total of 0.
TEST(SamplingKernelsTest, EveryTokenRuledOutGivesNoWeightOnEveryPath) {
  for (int64_t n : {1, 17, 1025}) {
    const std::vector<float> x(static_cast<size_t>(n), kNegInf);
    for (Isa isa : test::runnable_paths()) {
      std::vector<float> w(x.size(), 1.0f), sums(2, 1.0f);
      EXPECT_EQ(softmax_weights(x.data(), n, 0.7f, w.data(), sums.data(), isa), kNegInf) << isa_name(isa);
      for (float v : w) ASSERT_EQ(v, 0.0f) << isa_name(isa) << " n=" << n;
      for (int64_t b = 0; b < (n + kSoftmaxBlock - 1) / kSoftmaxBlock; ++b)
        ASSERT_EQ(sums[static_cast<size_t>(b)], 0.0f) << isa_name(isa) << " n=" << n;
    }
  }
}

TEST(SamplingKernelsTest, ArgmaxIsThePlainLoopsOnEveryPath) {
  // Sizes around the vector width, ties (a coarse grid), -inf runs, NaNs, a NaN first.
  std::mt19937 gen(23);
  int checked = 0;
  for (int64_t n : {1, 2, 15, 16, 17, 31, 32, 33, 47, 1000, 49153}) {
    for (int shape = 0; shape < 5; ++shape) {
      std::normal_distribution<float> normal(0.0f, 3.0f);
      std::vector<float> x(static_cast<size_t>(n));
      for (auto& v : x) v = shape == 1 ? std::round(normal(gen)) : normal(gen);
      if (shape == 2) std::fill(x.begin(), x.end(), kNegInf);
      if (shape == 3)
        for (size_t i = 0; i < x.size(); i += 3) x[i] = std::numeric_limits<float>::quiet_NaN();
      if (shape == 4) x[0] = std::numeric_limits<float>::quiet_NaN();
      size_t want = 0;
      for (size_t i = 1; i < x.size(); ++i)
        if (x[i] > x[want]) want = i;
      for (Isa isa : test::runnable_paths()) {
        ASSERT_EQ(argmax(x.data(), n, isa), static_cast<int64_t>(want))
            << isa_name(isa) << " n=" << n << " shape=" << shape;
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 0);
}

}  // namespace
}  // namespace inferd
