// KvCache storage: what each dtype keeps of the values written (the 8-bit dtypes' codes and
// per-head scales), on random heads of odd sizes and on the edge cases (zeros, huge, tiny,
// non-finite).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "common/half.h"
#include "kv/kv_cache.h"
#include "test_support.h"

namespace inferd {
namespace {

// Writes key/value into slot 3 of layer 1 and reads back what the cache holds.
void round_trip(KvCache& cache, const std::vector<float>& key, const std::vector<float>& value,
                std::vector<float>* key_out, std::vector<float>* value_out) {
  cache.write(1, 3, key.data(), value.data());
  key_out->assign(key.size(), NAN);
  value_out->assign(value.size(), NAN);
  cache.read(1, 3, key_out->data(), value_out->data());
}

TEST(KvCacheTest, EightBitHeadsKeepEveryValueWithinHalfAStepOfItsHeadsScale) {
  std::mt19937 rng(5);
  for (const int64_t head_dim : {1, 7, 16, 20, 64, 129}) {
    const int64_t heads = head_dim == 129 ? 1 : 3, kv_dim = heads * head_dim;
    for (KvDType dtype : {KvDType::kInt8, KvDType::kFp8}) {
      SCOPED_TRACE(std::string(kv_dtype_name(dtype)) + " head_dim " + std::to_string(head_dim));
      KvCache cache(2, 3, 4, kv_dim, dtype, head_dim);
      EXPECT_EQ(cache.num_heads(), heads);
      auto key = test::random_floats(static_cast<size_t>(kv_dim), rng);
      auto value = test::random_floats(static_cast<size_t>(kv_dim), rng);
      for (float& f : key) f *= 40.0f;  // heads of different magnitudes
      for (int64_t i = 0; i < head_dim; ++i) value[static_cast<size_t>(i)] *= 1e-3f;
      std::vector<float> k, v;
      round_trip(cache, key, value, &k, &v);
      for (const auto& [in, out] : {std::pair{&key, &k}, std::pair{&value, &v}}) {
        for (int64_t h = 0; h < heads; ++h) {
          float amax = 0;
          for (int64_t i = 0; i < head_dim; ++i) amax = std::max(amax, std::fabs((*in)[h * head_dim + i]));
          for (int64_t i = 0; i < head_dim; ++i) {
            const float x = (*in)[static_cast<size_t>(h * head_dim + i)];
            const float y = (*out)[static_cast<size_t>(h * head_dim + i)];
            if (dtype == KvDType::kInt8) {
              // Half a step of amax / 127, plus f32 rounding of the scale and product.
              EXPECT_LE(std::fabs(x - y), amax / 127.0f * 0.5f * (1 + 1e-5f) + 1e-7f * amax) << i;
            } else {
              // E4M3 keeps 3 mantissa bits: half an ulp is 1/16 of the value for normals, and
              // below 2^-6 of the range (subnormals) a step of 2^-9 of amax / 448.
              const float step = amax / 448.0f * 0x1p-9f;
              EXPECT_LE(std::fabs(x - y), std::max(std::fabs(x) / 16.0f, step / 2) * (1 + 1e-5f)) << i;
            }
          }
          // The head's largest magnitude is represented exactly up to the scale's rounding.
          float out_max = 0;
          for (int64_t i = 0; i < head_dim; ++i)
            out_max = std::max(out_max, std::fabs((*out)[static_cast<size_t>(h * head_dim + i)]));
          EXPECT_NEAR(out_max, amax, amax * 1e-6f);
        }
      }
    }
  }
}

TEST(KvCacheTest, EightBitEdgeCasesStayFiniteAndKeepTheRestOfTheHead) {
  for (KvDType dtype : {KvDType::kInt8, KvDType::kFp8}) {
    SCOPED_TRACE(std::string(kv_dtype_name(dtype)));
    KvCache cache(2, 3, 4, 8, dtype, 4);
    std::vector<float> k, v;
    // A zero head stays zero; a head of huge values keeps them (the scale, not the codes, is big).
    round_trip(cache, {0, 0, 0, 0, 3e38f, -3e38f, 1e38f, 0}, {-0.0f, 0, 0, 0, 1e-30f, 0, 0, 0}, &k, &v);
    EXPECT_EQ(k[0], 0.0f);
    EXPECT_EQ(k[3], 0.0f);
    EXPECT_NEAR(k[4], 3e38f, 3e36f);
    EXPECT_NEAR(k[5], -3e38f, 3e36f);
    EXPECT_EQ(v[0], 0.0f);
    EXPECT_NEAR(v[4], 1e-30f, 1e-35f);
    // Non-finite inputs are stored as 0 and do not set the scale of their head.
    round_trip(cache, {NAN, 1.0f, -0.5f, INFINITY, 2, 2, 2, 2}, {1, 2, 3, 4, 5, 6, 7, 8}, &k, &v);
    for (float f : k) EXPECT_TRUE(std::isfinite(f));
    EXPECT_EQ(k[0], 0.0f);
    EXPECT_EQ(k[1], 1.0f);
    EXPECT_NEAR(k[2], -0.5f, 0.5f / 127);
    EXPECT_EQ(k[3], 0.0f);
    // Denormal heads underflow to zeros rather than to an infinite inverse scale.
    const float tiny = std::numeric_limits<float>::denorm_min();
    round_trip(cache, {tiny, -tiny, 0, tiny, 1, 1, 1, 1}, {1, 2, 3, 4, 5, 6, 7, 8}, &k, &v);
    for (float f : k) EXPECT_TRUE(std::isfinite(f));
    EXPECT_EQ(k[4], 1.0f);
  }
}

TEST(KvCacheTest, SixteenBitAndF32KeepWhatTheirRoundingKeeps) {
  std::mt19937 rng(9);
  const auto key = test::random_floats(10, rng), value = test::random_floats(10, rng);
  for (KvDType dtype : {KvDType::kF32, KvDType::kF16, KvDType::kBF16}) {
    KvCache cache(2, 3, 4, 10, dtype);
    std::vector<float> k, v;
    round_trip(cache, key, value, &k, &v);
    for (size_t i = 0; i < key.size(); ++i) {
      const float want = dtype == KvDType::kF32   ? key[i]
                         : dtype == KvDType::kF16 ? f16_to_f32(f32_to_f16(key[i]))
                                                  : bf16_to_f32(f32_to_bf16(key[i]));
      EXPECT_EQ(k[i], want);
    }
  }
}

TEST(KvCacheTest, EightBitHalvesTheBytesOfAToken) {
  // SmolLM2-135M: 30 layers, 3 KV heads of 64.
  const int64_t f16 = KvCache::bytes_per_token(30, 192, 64, KvDType::kF16);
  for (KvDType dtype : {KvDType::kInt8, KvDType::kFp8}) {
    const int64_t b = KvCache::bytes_per_token(30, 192, 64, dtype);
    EXPECT_EQ(b, 2 * 30 * (192 + 3 * 4));
    EXPECT_LT(static_cast<double>(b) / static_cast<double>(f16), 0.54);
  }
}

}  // namespace
}  // namespace inferd
