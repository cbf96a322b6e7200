#include "kernels/f32_kernels.h"

#include <cstring>

#include "common/half.h"
#include "kernels/simd.h"
#include "tensor/dequantize.h"

namespace inferd {

namespace {

// ---------------------------------------------------------------------------------------------
// Scalar path: 16 interleaved partial sums, then a fixed pairwise tree.

float dot_scalar(const float* a, const float* b, int64_t n) {
  constexpr int kLanes = 16;
  float acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) acc[j] += a[i + j] * b[i + j];
  }
  for (int j = 0; i < n; ++i, ++j) acc[j] += a[i] * b[i];
  for (int width = kLanes / 2; width > 0; width /= 2) {
    for (int j = 0; j < width; ++j) acc[j] += acc[j + width];
  }
  return acc[0];
}

void dot4_scalar(const float* x, int64_t x_stride, const float* w, int64_t n, float* out) {
  for (int r = 0; r < 4; ++r) out[r] = dot_scalar(x + r * x_stride, w, n);
}

void f16_to_f32_scalar(const uint16_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_f32(src[i]);
}

void f32_to_f16_scalar(const float* src, int64_t n, std::byte* dst, size_t stride) {
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t h = f32_to_f16(src[i]);
    std::memcpy(dst + static_cast<size_t>(i) * stride, &h, sizeof h);
  }
}

constexpr F32Kernels kScalarKernels{dot_scalar, dot4_scalar, dequantize_row, f16_to_f32_scalar,
                                    f32_to_f16_scalar};

#if defined(__x86_64__)

// `lanes` f16 values (bits) to dst, `stride` bytes apart.
void put_f16(const uint16_t* h, int lanes, std::byte* dst, size_t stride) {
  if (stride == sizeof(uint16_t)) {
    std::memcpy(dst, h, static_cast<size_t>(lanes) * sizeof(uint16_t));
    return;
  }
  for (int j = 0; j < lanes; ++j) std::memcpy(dst + static_cast<size_t>(j) * stride, &h[j], sizeof(uint16_t));
}

// ---------------------------------------------------------------------------------------------
// AVX2 + FMA path: per row 4 accumulators of 8 lanes (32 values per step), masked tail.

INFERD_AVX2 inline __m256i tail_mask8(int64_t left) {
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(left < 8 ? left : 8)), lane);
}

INFERD_AVX2 inline float hsum8(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 s2 = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
}

template <int R>
INFERD_AVX2 inline void dot_rows_avx2(const float* x, int64_t x_stride, const float* w, int64_t n,
                                      float* out) {
  __m256 acc[R][4];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < 4; ++j) acc[r][j] = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    __m256 wv[4];
    for (int j = 0; j < 4; ++j) wv[j] = _mm256_loadu_ps(w + i + 8 * j);
    for (int r = 0; r < R; ++r)
      for (int j = 0; j < 4; ++j)
        acc[r][j] = _mm256_fmadd_ps(_mm256_loadu_ps(x + r * x_stride + i + 8 * j), wv[j], acc[r][j]);
  }
  for (int j = 0; i < n; ++j, i += 8) {
    const __m256i mask = tail_mask8(n - i);
    const __m256 wv = _mm256_maskload_ps(w + i, mask);
    for (int r = 0; r < R; ++r)
      acc[r][j] = _mm256_fmadd_ps(_mm256_maskload_ps(x + r * x_stride + i, mask), wv, acc[r][j]);
  }
  for (int r = 0; r < R; ++r)
    out[r] = hsum8(_mm256_add_ps(_mm256_add_ps(acc[r][0], acc[r][1]), _mm256_add_ps(acc[r][2], acc[r][3])));
}

INFERD_AVX2 float dot_avx2(const float* a, const float* b, int64_t n) {
  float out;
  dot_rows_avx2<1>(a, 0, b, n, &out);
  return out;
}

INFERD_AVX2 void dot4_avx2(const float* x, int64_t x_stride, const float* w, int64_t n, float* out) {
  dot_rows_avx2<4>(x, x_stride, w, n, out);
}

INFERD_AVX2 void f16_to_f32_avx2(const uint16_t* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
  for (; i < n; ++i) dst[i] = f16_to_f32(src[i]);
}

// vcvtps2ph rounds to nearest even as f32_to_f16 does, and gives inf past the largest f16 and
// f16 subnormals where it does; a NaN keeps its payload's top bits, so NaN lanes are set to
// f32_to_f16's quiet NaN (sign | 0x7e00).
INFERD_AVX2 void f32_to_f16_avx2(const float* src, int64_t n, std::byte* dst, size_t stride) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(src + i);
    alignas(16) uint16_t h[8];
    _mm_store_si128(reinterpret_cast<__m128i*>(h),
                    _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    if (const int nan = _mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)); nan != 0) {
      for (int j = 0; j < 8; ++j)
        if ((nan >> j) & 1) h[j] = f32_to_f16(src[i + j]);
    }
    put_f16(h, 8, dst + static_cast<size_t>(i) * stride, stride);
  }
  f32_to_f16_scalar(src + i, n - i, dst + static_cast<size_t>(i) * stride, stride);
}

INFERD_AVX2 void dequantize_row_avx2(DType dtype, const std::byte* src, float* dst, int64_t num_values) {
  const int64_t blocks = num_values / 32;
  switch (dtype) {
    case DType::kF16: return f16_to_f32_avx2(reinterpret_cast<const uint16_t*>(src), dst, num_values);
    case DType::kQ8_0:
      for (int64_t b = 0; b < blocks; ++b, src += 34, dst += 32) {
        const __m256 d = _mm256_set1_ps(load_f16(src));
        for (int j = 0; j < 4; ++j) {
          const __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(src + 2 + 8 * j));
          _mm256_storeu_ps(dst + 8 * j, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), d));
        }
      }
      return;
    case DType::kQ4_0:
    case DType::kQ4_1: {
      const bool has_min = dtype == DType::kQ4_1;
      const int64_t block_bytes = has_min ? 20 : 18;
      const int64_t qs_offset = has_min ? 4 : 2;
      for (int64_t b = 0; b < blocks; ++b, src += block_bytes, dst += 32) {
        const __m256 d = _mm256_set1_ps(load_f16(src));
        const __m256 m = _mm256_set1_ps(has_min ? load_f16(src + 2) : 0.0f);
        const __m256i eight = _mm256_set1_epi32(has_min ? 0 : 8);
        for (int j = 0; j < 2; ++j) {
          const __m256i raw = _mm256_cvtepu8_epi32(
              _mm_loadl_epi64(reinterpret_cast<const __m128i*>(src + qs_offset + 8 * j)));
          const __m256i lo = _mm256_sub_epi32(_mm256_and_si256(raw, _mm256_set1_epi32(0x0f)), eight);
          const __m256i hi = _mm256_sub_epi32(_mm256_srli_epi32(raw, 4), eight);
          __m256 vlo = _mm256_mul_ps(_mm256_cvtepi32_ps(lo), d);
          __m256 vhi = _mm256_mul_ps(_mm256_cvtepi32_ps(hi), d);
          if (has_min) {
            vlo = _mm256_add_ps(vlo, m);
            vhi = _mm256_add_ps(vhi, m);
          }
          _mm256_storeu_ps(dst + 8 * j, vlo);
          _mm256_storeu_ps(dst + 16 + 8 * j, vhi);
        }
      }
      return;
    }
    default: return dequantize_row(dtype, src, dst, num_values);
  }
}

constexpr F32Kernels kAvx2Kernels{dot_avx2, dot4_avx2, dequantize_row_avx2, f16_to_f32_avx2, f32_to_f16_avx2};

// ---------------------------------------------------------------------------------------------
// AVX-512 path: per row 4 accumulators of 16 lanes (64 values per step), masked tail.

INFERD_AVX512 inline __mmask16 tail_mask16(int64_t left) {
  return left >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << left) - 1u);
}

template <int R>
INFERD_AVX512 inline void dot_rows_avx512(const float* x, int64_t x_stride, const float* w, int64_t n,
                                          float* out) {
  __m512 acc[R][4];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < 4; ++j) acc[r][j] = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 64 <= n; i += 64) {
    __m512 wv[4];
    for (int j = 0; j < 4; ++j) wv[j] = _mm512_loadu_ps(w + i + 16 * j);
    for (int r = 0; r < R; ++r)
      for (int j = 0; j < 4; ++j)
        acc[r][j] = _mm512_fmadd_ps(_mm512_loadu_ps(x + r * x_stride + i + 16 * j), wv[j], acc[r][j]);
  }
  for (int j = 0; i < n; ++j, i += 16) {
    const __mmask16 mask = tail_mask16(n - i);
    const __m512 wv = _mm512_maskz_loadu_ps(mask, w + i);
    for (int r = 0; r < R; ++r)
      acc[r][j] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mask, x + r * x_stride + i), wv, acc[r][j]);
  }
  for (int r = 0; r < R; ++r)
    out[r] = _mm512_reduce_add_ps(
        _mm512_add_ps(_mm512_add_ps(acc[r][0], acc[r][1]), _mm512_add_ps(acc[r][2], acc[r][3])));
}

INFERD_AVX512 float dot_avx512(const float* a, const float* b, int64_t n) {
  float out;
  dot_rows_avx512<1>(a, 0, b, n, &out);
  return out;
}

INFERD_AVX512 void dot4_avx512(const float* x, int64_t x_stride, const float* w, int64_t n, float* out) {
  dot_rows_avx512<4>(x, x_stride, w, n, out);
}

INFERD_AVX512 void f16_to_f32_avx512(const uint16_t* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i))));
  for (; i < n; ++i) dst[i] = f16_to_f32(src[i]);
}

INFERD_AVX512 void f32_to_f16_avx512(const float* src, int64_t n, std::byte* dst, size_t stride) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_loadu_ps(src + i);
    __m256i h = _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    if (const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q); nan != 0) {  // sign | 0x7e00
      const __m256i sign =
          _mm256_and_si256(_mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(v), 16)),
                           _mm256_set1_epi16(static_cast<short>(0x8000)));
      h = _mm256_mask_blend_epi16(nan, h, _mm256_or_si256(sign, _mm256_set1_epi16(0x7e00)));
    }
    if (stride == sizeof(uint16_t)) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + static_cast<size_t>(i) * stride), h);
    } else {
      alignas(32) uint16_t lanes[16];
      _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), h);
      put_f16(lanes, 16, dst + static_cast<size_t>(i) * stride, stride);
    }
  }
  f32_to_f16_scalar(src + i, n - i, dst + static_cast<size_t>(i) * stride, stride);
}

INFERD_AVX512 void dequantize_row_avx512(DType dtype, const std::byte* src, float* dst, int64_t num_values) {
  const int64_t blocks = num_values / 32;
  switch (dtype) {
    case DType::kF16: return f16_to_f32_avx512(reinterpret_cast<const uint16_t*>(src), dst, num_values);
    case DType::kBF16: {
      const auto* h = reinterpret_cast<const uint16_t*>(src);
      int64_t i = 0;
      for (; i + 16 <= num_values; i += 16) {
        const __m512i wide =
            _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(h + i)));
        _mm512_storeu_ps(dst + i, _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16)));
      }
      for (; i < num_values; ++i) dst[i] = bf16_to_f32(load_u16(src + 2 * i));
      return;
    }
    case DType::kQ8_0:
      for (int64_t b = 0; b < blocks; ++b, src += 34, dst += 32) {
        const __m512 d = _mm512_set1_ps(load_f16(src));
        for (int j = 0; j < 2; ++j) {
          const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 2 + 16 * j));
          _mm512_storeu_ps(dst + 16 * j, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)), d));
        }
      }
      return;
    case DType::kQ4_0:
    case DType::kQ4_1: {
      const bool has_min = dtype == DType::kQ4_1;
      const int64_t block_bytes = has_min ? 20 : 18;
      const int64_t qs_offset = has_min ? 4 : 2;
      const __m512i low_bits = _mm512_set1_epi32(0x0f);
      for (int64_t b = 0; b < blocks; ++b, src += block_bytes, dst += 32) {
        const __m512 d = _mm512_set1_ps(load_f16(src));
        const __m512i raw =
            _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + qs_offset)));
        const __m512i eight = _mm512_set1_epi32(has_min ? 0 : 8);
        const __m512i lo = _mm512_sub_epi32(_mm512_and_si512(raw, low_bits), eight);
        const __m512i hi = _mm512_sub_epi32(_mm512_srli_epi32(raw, 4), eight);
        __m512 vlo = _mm512_mul_ps(_mm512_cvtepi32_ps(lo), d);
        __m512 vhi = _mm512_mul_ps(_mm512_cvtepi32_ps(hi), d);
        if (has_min) {
          const __m512 m = _mm512_set1_ps(load_f16(src + 2));
          vlo = _mm512_add_ps(vlo, m);
          vhi = _mm512_add_ps(vhi, m);
        }
        _mm512_storeu_ps(dst, vlo);
        _mm512_storeu_ps(dst + 16, vhi);
      }
      return;
    }
    default: return dequantize_row(dtype, src, dst, num_values);
  }
}

constexpr F32Kernels kAvx512Kernels{dot_avx512, dot4_avx512, dequantize_row_avx512, f16_to_f32_avx512,
                                    f32_to_f16_avx512};

#endif  // __x86_64__

}  // namespace

const F32Kernels& f32_kernels(Isa isa) {
#if defined(__x86_64__)
  if (static_cast<int>(isa) >= static_cast<int>(Isa::kAvx512)) return kAvx512Kernels;
  if (isa == Isa::kAvx2) return kAvx2Kernels;
#else
  (void)isa;
#endif
  return kScalarKernels;
}

const F32Kernels& f32_kernels() {
  static const F32Kernels& kernels = f32_kernels(active_isa());
  return kernels;
}

}  // namespace inferd
