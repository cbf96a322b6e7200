#include "kernels/f32_kernels.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "common/half.h"
#include "tensor/dequantize.h"
#include "test_support.h"

namespace inferd {
namespace {

using test::runnable_paths;

TEST(CpuIsaTest, NamesRoundTripAndUnknownNamesAreRejected) {
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512, Isa::kVnni, Isa::kAmx})
    EXPECT_EQ(parse_isa(isa_name(isa)), isa);
  EXPECT_FALSE(parse_isa("sse9").has_value());
  EXPECT_FALSE(parse_isa("").has_value());
  EXPECT_LE(static_cast<int>(active_isa()), static_cast<int>(detected_isa()));
}

TEST(F32KernelsTest, DotMatchesDoubleReferenceOnEveryPathAndLength) {
  std::mt19937 rng(11);
  for (Isa isa : runnable_paths()) {
    const F32Kernels& k = f32_kernels(isa);
    for (int64_t n = 0; n <= 200; n += (n < 70 ? 1 : 13)) {
      auto a = test::random_floats(static_cast<size_t>(n), rng);
      auto b = test::random_floats(static_cast<size_t>(n), rng);
      double ref = 0, mag = 0;
      for (size_t i = 0; i < a.size(); ++i) {
        ref += static_cast<double>(a[i]) * b[i];
        mag += std::fabs(static_cast<double>(a[i]) * b[i]);
      }
      EXPECT_NEAR(k.dot(a.data(), b.data(), n), ref, 1e-6 * (mag + 1)) << isa_name(isa) << " n=" << n;
    }
  }
}

// Batch invariance rests on this: a row's dot4 result is bit-identical to its dot result.
TEST(F32KernelsTest, Dot4IsBitIdenticalToDotPerRow) {
  std::mt19937 rng(12);
  for (Isa isa : runnable_paths()) {
    const F32Kernels& k = f32_kernels(isa);
    for (int64_t n : {1, 7, 16, 31, 64, 65, 100, 576, 1536, 1537}) {
      const int64_t stride = n + 3;
      auto x = test::random_floats(static_cast<size_t>(4 * stride), rng);
      auto w = test::random_floats(static_cast<size_t>(n), rng);
      float out[4];
      k.dot4(x.data(), stride, w.data(), n, out);
      for (int r = 0; r < 4; ++r)
        ASSERT_EQ(out[r], k.dot(x.data() + r * stride, w.data(), n))
            << isa_name(isa) << " n=" << n << " r=" << r;
    }
  }
}

TEST(F32KernelsTest, DequantizeRowIsBitIdenticalToScalarDecoder) {
  std::mt19937 rng(13);
  for (Isa isa : runnable_paths()) {
    const F32Kernels& k = f32_kernels(isa);
    for (DType dtype :
         {DType::kF32,    DType::kF16,     DType::kBF16,  DType::kQ4_0,    DType::kQ4_1,  DType::kQ5_0,
          DType::kQ5_1,   DType::kQ8_0,    DType::kQ4_K,  DType::kQ5_K,    DType::kQ6_K,  DType::kIQ4_NL,
          DType::kIQ4_XS, DType::kQ2_K,    DType::kQ3_K,  DType::kIQ3_XXS, DType::kIQ3_S, DType::kIQ2_S,
          DType::kIQ2_XS, DType::kIQ2_XXS, DType::kIQ1_S, DType::kIQ1_M,   DType::kTQ1_0, DType::kTQ2_0}) {
      const int64_t block = dtype_info(dtype).block_values;
      for (int64_t blocks : {1, 2, 7}) {
        const int64_t n = blocks * (block == 1 ? 37 : block);
        std::vector<std::byte> storage;
        TensorView w = test::random_tensor(dtype, 3, n, rng, &storage);
        for (int64_t row = 0; row < 3; ++row) {
          std::vector<float> got(static_cast<size_t>(n)), want(static_cast<size_t>(n));
          k.dequantize_row(dtype, w.row(row), got.data(), n);
          dequantize_row(dtype, w.row(row), want.data(), n);
          ASSERT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float)))
              << isa_name(isa) << " " << dtype_info(dtype).name << " n=" << n;
        }
      }
    }
  }
}

// f32 -> f16 on every path gives f32_to_f16's bits at any element stride: random bit patterns
// (NaNs with payloads, infinities, f32 subnormals), every f16 value, the halfway points between
// neighbours (ties to even), the overflow edge, over a length no vector width divides.
TEST(F32KernelsTest, F32ToF16GivesTheScalarBitsAtAnyStride) {
  std::mt19937 rng(21);
  std::vector<float> src;
  for (int i = 0; i < 4001; ++i) src.push_back(std::bit_cast<float>(static_cast<uint32_t>(rng())));
  for (uint32_t h = 0; h < 0x7c00; h += 7) {
    const float v = f16_to_f32(static_cast<uint16_t>(h)), next = f16_to_f32(static_cast<uint16_t>(h + 1));
    src.push_back(v);
    src.push_back(-(v + (next - v) / 2));  // exactly halfway (f32 holds it)
  }
  for (float v : {65504.0f, 65519.0f, 65519.996f, 65520.0f, 1e-8f, 2.9802322e-8f, 5.9604645e-8f, -0.0f})
    src.push_back(v);
  const auto n = static_cast<int64_t>(src.size());
  for (const size_t stride : {size_t{2}, size_t{6}, size_t{32}}) {
    std::vector<std::byte> want(static_cast<size_t>(n) * stride, std::byte{0x5a});
    for (int64_t i = 0; i < n; ++i) {
      const uint16_t h = f32_to_f16(src[static_cast<size_t>(i)]);
      std::memcpy(want.data() + static_cast<size_t>(i) * stride, &h, 2);
    }
    for (Isa isa : runnable_paths()) {
      std::vector<std::byte> got(want.size(), std::byte{0x5a});  // the bytes between stay untouched
      f32_kernels(isa).f32_to_f16(src.data(), n, got.data(), stride);
      for (size_t i = 0; i < got.size(); ++i)
        ASSERT_EQ(got[i], want[i]) << isa_name(isa) << " stride " << stride << " byte " << i << " of value "
                                   << src[i / stride];
    }
  }
}

TEST(F32KernelsTest, F16ConversionIsExactForEveryValue) {
  std::vector<uint16_t> all(65536 + 5);
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<uint16_t>(i);
  for (Isa isa : runnable_paths()) {
    std::vector<float> got(all.size());
    f32_kernels(isa).f16_to_f32(all.data(), got.data(), static_cast<int64_t>(all.size()));
    for (size_t i = 0; i < all.size(); ++i) {
      const float want = f16_to_f32(all[i]);
      if (std::isnan(want)) {
        ASSERT_TRUE(std::isnan(got[i])) << i;
      } else {
        ASSERT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(want))
            << isa_name(isa) << " " << i;
      }
    }
  }
}

}  // namespace
}  // namespace inferd
