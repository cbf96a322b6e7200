#include "common/half.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

namespace inferd {
namespace {

// The compiler's own _Float16 conversions are the reference.
TEST(HalfTest, F16ToF32MatchesCompilerForEveryValue) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const auto bits = static_cast<uint16_t>(h);
    _Float16 ref;
    std::memcpy(&ref, &bits, 2);
    const float expected = static_cast<float>(ref);
    const float got = f16_to_f32(bits);
    if (std::isnan(expected)) {
      EXPECT_TRUE(std::isnan(got));
    } else {
      EXPECT_EQ(std::bit_cast<uint32_t>(got), std::bit_cast<uint32_t>(expected)) << "h=" << h;
    }
  }
}

TEST(HalfTest, F32ToF16RoundsLikeCompiler) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<uint32_t> bits;
  int checked = 0;
  for (int i = 0; i < 200000; ++i) {
    // Random bit patterns concentrated around the f16 range, plus the full range.
    uint32_t x = bits(rng);
    if (i % 2 == 0) x = (x & 0x807fffffu) | ((100u + x % 60u) << 23);
    const float f = std::bit_cast<float>(x);
    if (std::isnan(f)) continue;
    const _Float16 ref = static_cast<_Float16>(f);
    uint16_t ref_bits;
    std::memcpy(&ref_bits, &ref, 2);
    ASSERT_EQ(f32_to_f16(f), ref_bits) << "f=" << f;
    ++checked;
  }
  EXPECT_GT(checked, 100000);
}

TEST(HalfTest, Bf16RoundTrip) {
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f)), 1.0f);
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(-2.5f)), -2.5f);
  // 1 + 2^-8 is halfway between two bf16 values: ties to even (1.0).
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + 1.0f / 256)), 1.0f);
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + 3.0f / 256)), 1.0f + 4.0f / 256);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
}

}  // namespace
}  // namespace inferd
