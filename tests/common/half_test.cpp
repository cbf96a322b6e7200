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

// FP8 E4M3 against the format's definition: every code's value computed from its fields.
TEST(HalfTest, Fp8E4m3DecodesEveryCode) {
  for (int c = 0; c < 256; ++c) {
    const int sign = c >> 7, exp = (c >> 3) & 15, mant = c & 7;
    const float v = fp8_e4m3_to_f32(static_cast<uint8_t>(c));
    if (exp == 15 && mant == 7) {
      EXPECT_TRUE(std::isnan(v)) << c;
      continue;
    }
    const double mag =
        exp == 0 ? mant / 8.0 * std::ldexp(1.0, -6) : (1 + mant / 8.0) * std::ldexp(1.0, exp - 7);
    EXPECT_EQ(v, static_cast<float>(sign ? -mag : mag)) << c;
    // The f16 the packed kernels expand a byte to is the value times 2^-8, exactly.
    EXPECT_EQ(f16_to_f32(fp8_e4m3_as_f16_bits(static_cast<uint8_t>(c))) * 256.0f, v) << c;
    // Encoding a code's value gives the code back (negative zero included).
    EXPECT_EQ(f32_to_fp8_e4m3(v), c) << c;
  }
  EXPECT_EQ(fp8_e4m3_to_f32(0x7e), 448.0f);
}

// Encoding rounds to the nearest code, ties to even, and saturates at +-448.
TEST(HalfTest, Fp8E4m3RoundsToNearestEvenAndSaturates) {
  // Every float between two neighbouring positive codes goes to the nearer one.
  for (int c = 0; c < 0x7e; ++c) {
    const float a = fp8_e4m3_to_f32(static_cast<uint8_t>(c)),
                b = fp8_e4m3_to_f32(static_cast<uint8_t>(c + 1));
    const float mid = (a + b) / 2;  // exact: a and b are close in binary
    EXPECT_EQ(f32_to_fp8_e4m3(std::nextafter(mid, a)), c);
    EXPECT_EQ(f32_to_fp8_e4m3(std::nextafter(mid, b)), c + 1);
    EXPECT_EQ(f32_to_fp8_e4m3(mid), c % 2 == 0 ? c : c + 1) << "tie between " << c << " and " << c + 1;
    EXPECT_EQ(f32_to_fp8_e4m3(-mid), 0x80 | (c % 2 == 0 ? c : c + 1));
  }
  EXPECT_EQ(f32_to_fp8_e4m3(460.0f), 0x7e);
  EXPECT_EQ(f32_to_fp8_e4m3(1e30f), 0x7e);
  EXPECT_EQ(f32_to_fp8_e4m3(-1e30f), 0xfe);
  EXPECT_EQ(f32_to_fp8_e4m3(INFINITY), 0x7e);
  EXPECT_EQ(f32_to_fp8_e4m3(1e-30f), 0);
  EXPECT_EQ(f32_to_fp8_e4m3(NAN), 0x7f);
}

}  // namespace
}  // namespace inferd
