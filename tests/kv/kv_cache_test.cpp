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

// K in groups of 16 slots (the CPU backends' layout) holds what K in rows holds: the same values
// read back, the same export bytes (rows: the tiers' and the transfer's format), imports and block
// copies that land where they should, and the layout attention is told about.
TEST(KvCacheTest, KeysInGroupsHoldAndExportWhatKeysInRowsDo) {
  std::mt19937 rng(13);
  const int64_t layers = 2, blocks = 4, block_size = 32, head_dim = 20, kv_dim = 3 * head_dim;
  EXPECT_FALSE(KvCache(1, 2, 24, kv_dim, KvDType::kF16, head_dim).key_groups());  // 24: not whole groups
  EXPECT_FALSE(KvCache(1, 2, 32, kv_dim, KvDType::kF16, head_dim, false).key_groups());
  for (KvDType dtype : {KvDType::kF32, KvDType::kF16, KvDType::kBF16, KvDType::kInt8, KvDType::kFp8}) {
    SCOPED_TRACE(std::string(kv_dtype_name(dtype)));
    KvCache rows(layers, blocks, block_size, kv_dim, dtype, head_dim, false);
    KvCache groups(layers, blocks, block_size, kv_dim, dtype, head_dim);
    ASSERT_TRUE(groups.key_groups());
    ASSERT_FALSE(rows.key_groups());
    EXPECT_TRUE(groups.layer_view(1).key_groups);
    EXPECT_FALSE(rows.layer_view(1).key_groups);
    for (int64_t layer = 0; layer < layers; ++layer) {
      for (int64_t slot = 0; slot < blocks * block_size; ++slot) {
        const auto k = test::random_floats(static_cast<size_t>(kv_dim), rng);
        const auto v = test::random_floats(static_cast<size_t>(kv_dim), rng);
        rows.write(layer, slot, k.data(), v.data());
        groups.write(layer, slot, k.data(), v.data());
      }
    }
    const auto read_all = [&](const KvCache& cache) {
      std::vector<float> all;
      std::vector<float> k(static_cast<size_t>(kv_dim)), v(k.size());
      for (int64_t layer = 0; layer < layers; ++layer) {
        for (int64_t slot = 0; slot < blocks * block_size; ++slot) {
          cache.read(layer, slot, k.data(), v.data());
          all.insert(all.end(), k.begin(), k.end());
          all.insert(all.end(), v.begin(), v.end());
        }
      }
      return all;
    };
    EXPECT_EQ(read_all(groups), read_all(rows));
    // The grouped bytes sit where key_group_index says (f32: the values themselves).
    if (dtype == KvDType::kF32) {
      std::vector<float> k(static_cast<size_t>(kv_dim)), v(k.size());
      rows.read(1, 37, k.data(), v.data());
      const auto* key = static_cast<const float*>(groups.layer_view(1).key);
      for (int64_t i = 0; i < kv_dim; ++i)
        EXPECT_EQ(key[key_group_index(37, i, kv_dim)], k[static_cast<size_t>(i)]);
    }
    std::vector<std::byte> a(rows.block_bytes()), b(groups.block_bytes());
    for (int64_t block = 0; block < blocks; ++block) {
      rows.export_block(block, a.data());
      groups.export_block(block, b.data());
      EXPECT_EQ(a, b) << "block " << block;
    }
    // Import a block exported from rows, and copy one, in both caches: still the same values.
    rows.export_block(1, a.data());
    rows.import_block(3, a.data());
    groups.import_block(3, a.data());
    rows.copy_block(0, 2);
    groups.copy_block(0, 2);
    EXPECT_EQ(read_all(groups), read_all(rows));
    groups.export_block(3, b.data());
    EXPECT_EQ(a, b);
  }
}

}  // namespace
}  // namespace inferd
