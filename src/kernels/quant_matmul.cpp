#include "kernels/quant_matmul.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>

#include "common/check.h"
#include "common/half.h"
#include "kernels/ops.h"

#if defined(__x86_64__)
// GCC 12's AVX-512 headers trip its own -Wmaybe-uninitialized (GCC bug 105593).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#else
#include <immintrin.h>
#endif
#endif

namespace inferd {

namespace {

constexpr int kMaxTokens = 8;  // tokens per pass over a tile's weights
constexpr size_t kAlign = 64;

std::byte* aligned_bytes(size_t n) {
  const size_t rounded = (n + kAlign - 1) / kAlign * kAlign;
  void* p = std::aligned_alloc(kAlign, rounded == 0 ? kAlign : rounded);
  INFERD_CHECK_MSG(p != nullptr, "out of memory packing weights");
  std::memset(p, 0, rounded == 0 ? kAlign : rounded);
  return static_cast<std::byte*>(p);
}

// Offset subtracted from the stored u8 quants to get the weight's integer value.
int32_t quant_offset(DType dtype) {
  switch (dtype) {
    case DType::kQ8_0: return 128;
    case DType::kQ4_0: return 8;
    default: return 0;
  }
}

size_t scales_bytes(DType dtype) {
  return dtype == DType::kQ4_1 ? 64 : 32;
}

int8_t clamp_q(long v) {
  return static_cast<int8_t>(std::clamp<long>(v, -127, 127));
}

// ---------------------------------------------------------------------------------------------
// Scalar path (the reference).

struct TileArgs {
  const std::byte* tile;
  DType dtype;
  int64_t blocks;
  size_t block_bytes;
  const QuantizedActivations* x;
  int64_t first_token;
  int num_tokens;
  float* out;  // [num_tokens][16]
};

void tile_scalar(const TileArgs& a) {
  const int32_t offset = quant_offset(a.dtype);
  const size_t qs = scales_bytes(a.dtype);
  for (int t = 0; t < a.num_tokens; ++t) {
    const int8_t* xq = a.x->q(a.first_token + t);
    const float* xd = a.x->scale(a.first_token + t);
    const float* xss = a.x->scaled_sum(a.first_token + t);
    float acc[kQuantTileRows] = {};
    for (int64_t b = 0; b < a.blocks; ++b) {
      const auto* blk = reinterpret_cast<const uint8_t*>(a.tile + static_cast<size_t>(b) * a.block_bytes);
      const int8_t* xb = xq + b * kQuantBlockValues;
      for (int r = 0; r < kQuantTileRows; ++r) {
        int32_t dot = 0;
        if (a.dtype == DType::kQ8_0) {
          for (int g = 0; g < 8; ++g)
            for (int j = 0; j < 4; ++j) dot += (blk[qs + 64 * g + 4 * r + j] - offset) * xb[4 * g + j];
        } else {
          for (int g = 0; g < 4; ++g)
            for (int j = 0; j < 4; ++j) {
              const uint8_t byte = blk[qs + 64 * g + 4 * r + j];
              dot += ((byte & 0x0f) - offset) * xb[4 * g + j] + ((byte >> 4) - offset) * xb[16 + 4 * g + j];
            }
        }
        const float dw = load_f16(blk + 2 * r);
        acc[r] = std::fma(dw * xd[b], static_cast<float>(dot), acc[r]);
        if (a.dtype == DType::kQ4_1) acc[r] = std::fma(load_f16(blk + 32 + 2 * r), xss[b], acc[r]);
      }
    }
    std::memcpy(a.out + t * kQuantTileRows, acc, sizeof(acc));
  }
}

void quantize_row_scalar(const float* x, int64_t k, int8_t* q, float* scale, int32_t* sum,
                         float* scaled_sum) {
  quantize_activations_reference(x, k, q, scale, sum, scaled_sum);
}

// e^x by range reduction to [-ln2/2, ln2/2] and a degree-6 polynomial (Cephes' coefficients),
// x clamped to [-87, 88]; every operation is one the AVX-512 version performs the same way
// (fma, round to nearest even, exact scaling by 2^n), so both give the same bits.
float exp_poly(float x) {
  x = std::min(std::max(x, -87.0f), 88.0f);
  const float n = std::nearbyint(x * 1.44269504088896341f);
  float r = std::fma(-n, 0.693359375f, x);
  r = std::fma(-n, -2.12194440e-4f, r);
  float p = 1.9875691500e-4f;
  p = std::fma(p, r, 1.3981999507e-3f);
  p = std::fma(p, r, 8.3333519073e-3f);
  p = std::fma(p, r, 4.1665795894e-2f);
  p = std::fma(p, r, 1.6666665459e-1f);
  p = std::fma(p, r, 5.0000001201e-1f);
  p = std::fma(p, r * r, r + 1.0f);
  return std::ldexp(p, static_cast<int>(n));
}

// Epilogues: a tile's [num_tokens][16] results into y (+ bias), or silu(gate) * up.
void store_scalar(const float* out, int nt, int rows, float* y, int64_t ld, const float* bias) {
  for (int t = 0; t < nt; ++t)
    for (int r = 0; r < rows; ++r)
      y[t * ld + r] = out[t * kQuantTileRows + r] + (bias != nullptr ? bias[r] : 0.0f);
}

void swiglu_scalar(const float* gate, const float* up, int nt, int rows, float* y, int64_t ld) {
  for (int t = 0; t < nt; ++t) {
    for (int r = 0; r < rows; ++r) {
      const float g = gate[t * kQuantTileRows + r];
      y[t * ld + r] = g / (1.0f + exp_poly(-g)) * up[t * kQuantTileRows + r];
    }
  }
}

#if defined(__x86_64__)

#define INFERD_AVX2 __attribute__((target("avx2,fma,f16c")))
#define INFERD_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")))

// ---------------------------------------------------------------------------------------------
// AVX2 path: the 16 rows as two halves of 8 lanes; vpmaddubsw + vpmaddwd per group of 4 bytes.

template <DType DT, int NT>
INFERD_AVX2 void tile_avx2(const TileArgs& a) {
  constexpr size_t qs = DT == DType::kQ4_1 ? 64 : 32;
  constexpr int32_t offset = DT == DType::kQ8_0 ? 0 : (DT == DType::kQ4_0 ? 8 : 0);  // Q8_0: signed dot
  const __m256i ones16 = _mm256_set1_epi16(1);
  const __m256i low4 = _mm256_set1_epi8(0x0f);
  const __m256i sign_flip = _mm256_set1_epi8(static_cast<char>(0x80));
  for (int h = 0; h < 2; ++h) {
    __m256 acc[NT];
    for (int t = 0; t < NT; ++t) acc[t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < a.blocks; ++b) {
      const std::byte* blk = a.tile + static_cast<size_t>(b) * a.block_bytes;
      const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 16 * h)));
      __m256 mw = _mm256_setzero_ps();
      if constexpr (DT == DType::kQ4_1)
        mw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 32 + 16 * h)));
      __m256i w[8];
      if constexpr (DT == DType::kQ8_0) {
        for (int g = 0; g < 8; ++g)
          w[g] = _mm256_xor_si256(
              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + qs + 64 * g + 32 * h)), sign_flip);
      } else {
        for (int g = 0; g < 4; ++g) {
          const __m256i raw =
              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + qs + 64 * g + 32 * h));
          w[g] = _mm256_and_si256(raw, low4);
          w[g + 4] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4);
        }
      }
      for (int t = 0; t < NT; ++t) {
        const int8_t* xb = a.x->q(a.first_token + t) + b * kQuantBlockValues;
        __m256i dot = _mm256_setzero_si256();
        for (int g = 0; g < 8; ++g) {
          const __m256i xv = _mm256_set1_epi32(static_cast<int>(load_u32(xb + 4 * g)));
          __m256i p;
          if constexpr (DT == DType::kQ8_0) {
            p = _mm256_maddubs_epi16(_mm256_sign_epi8(w[g], w[g]), _mm256_sign_epi8(xv, w[g]));
          } else {
            p = _mm256_maddubs_epi16(w[g], xv);
          }
          dot = _mm256_add_epi32(dot, _mm256_madd_epi16(p, ones16));
        }
        if constexpr (offset != 0)
          dot = _mm256_sub_epi32(dot, _mm256_set1_epi32(offset * a.x->sum(a.first_token + t)[b]));
        const __m256 dwdx = _mm256_mul_ps(dw, _mm256_set1_ps(a.x->scale(a.first_token + t)[b]));
        acc[t] = _mm256_fmadd_ps(dwdx, _mm256_cvtepi32_ps(dot), acc[t]);
        if constexpr (DT == DType::kQ4_1)
          acc[t] = _mm256_fmadd_ps(mw, _mm256_set1_ps(a.x->scaled_sum(a.first_token + t)[b]), acc[t]);
      }
    }
    for (int t = 0; t < NT; ++t) _mm256_storeu_ps(a.out + t * kQuantTileRows + 8 * h, acc[t]);
  }
}

// ---------------------------------------------------------------------------------------------
// AVX512-VNNI path: one vpdpbusd per group of 4 bytes covers all 16 rows.

template <DType DT, int NT>
INFERD_VNNI void tile_vnni(const TileArgs& a) {
  constexpr size_t qs = DT == DType::kQ4_1 ? 64 : 32;
  constexpr int32_t offset = DT == DType::kQ8_0 ? 128 : (DT == DType::kQ4_0 ? 8 : 0);
  const __m512i low4 = _mm512_set1_epi8(0x0f);
  const int8_t* xq[NT];
  const float* xd[NT];
  const int32_t* xs[NT];
  const float* xss[NT];
  for (int t = 0; t < NT; ++t) {
    xq[t] = a.x->q(a.first_token + t);
    xd[t] = a.x->scale(a.first_token + t);
    xs[t] = a.x->sum(a.first_token + t);
    xss[t] = a.x->scaled_sum(a.first_token + t);
  }
  __m512 acc[NT];
  for (int t = 0; t < NT; ++t) acc[t] = _mm512_setzero_ps();
  for (int64_t b = 0; b < a.blocks; ++b) {
    const std::byte* blk = a.tile + static_cast<size_t>(b) * a.block_bytes;
    const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk)));
    __m512 mw = _mm512_setzero_ps();
    if constexpr (DT == DType::kQ4_1)
      mw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 32)));
    __m512i w[8];
    if constexpr (DT == DType::kQ8_0) {
      for (int g = 0; g < 8; ++g) w[g] = _mm512_loadu_si512(blk + qs + 64 * g);
    } else {
      for (int g = 0; g < 4; ++g) {
        const __m512i raw = _mm512_loadu_si512(blk + qs + 64 * g);
        w[g] = _mm512_and_si512(raw, low4);
        w[g + 4] = _mm512_and_si512(_mm512_srli_epi16(raw, 4), low4);
      }
    }
    // Each token's integer accumulator starts at -offset * sum(x), so that after the eight
    // vpdpbusd it holds sum_j (w_j - offset) * x_j; tokens interleave for independent chains.
    // With few tokens, each token's sum runs as several chains (integer sums are exact in any
    // order), so the vpdpbusd latency does not serialise the block.
    constexpr int kChains = NT == 1 ? 4 : (NT == 2 ? 2 : 1);
    __m512i dot[NT];
    for (int t = 0; t < NT; ++t) {
      __m512i part[kChains];
      part[0] = offset != 0 ? _mm512_set1_epi32(-offset * xs[t][b]) : _mm512_setzero_si512();
      for (int c = 1; c < kChains; ++c) part[c] = _mm512_setzero_si512();
      const int8_t* xb = xq[t] + b * kQuantBlockValues;
      for (int g = 0; g < 8; ++g)
        part[g % kChains] = _mm512_dpbusd_epi32(part[g % kChains], w[g],
                                                _mm512_set1_epi32(static_cast<int>(load_u32(xb + 4 * g))));
      if constexpr (kChains == 4) {
        dot[t] = _mm512_add_epi32(_mm512_add_epi32(part[0], part[1]), _mm512_add_epi32(part[2], part[3]));
      } else if constexpr (kChains == 2) {
        dot[t] = _mm512_add_epi32(part[0], part[1]);
      } else {
        dot[t] = part[0];
      }
    }
    for (int t = 0; t < NT; ++t) {
      const __m512 dwdx = _mm512_mul_ps(dw, _mm512_set1_ps(xd[t][b]));
      acc[t] = _mm512_fmadd_ps(dwdx, _mm512_cvtepi32_ps(dot[t]), acc[t]);
      if constexpr (DT == DType::kQ4_1) acc[t] = _mm512_fmadd_ps(mw, _mm512_set1_ps(xss[t][b]), acc[t]);
    }
  }
  for (int t = 0; t < NT; ++t) _mm512_storeu_ps(a.out + t * kQuantTileRows, acc[t]);
}

INFERD_VNNI inline __m512 exp_poly_avx512(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.0f)), _mm512_set1_ps(88.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3333519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_scalef_ps(p, n);
}

INFERD_VNNI void store_avx512(const float* out, int nt, int rows, float* y, int64_t ld, const float* bias) {
  const auto mask = static_cast<__mmask16>((1u << rows) - 1u);
  const __m512 b = bias != nullptr ? _mm512_maskz_loadu_ps(mask, bias) : _mm512_setzero_ps();
  for (int t = 0; t < nt; ++t)
    _mm512_mask_storeu_ps(y + t * ld, mask, _mm512_add_ps(_mm512_loadu_ps(out + t * kQuantTileRows), b));
}

INFERD_VNNI void swiglu_avx512(const float* gate, const float* up, int nt, int rows, float* y, int64_t ld) {
  const auto mask = static_cast<__mmask16>((1u << rows) - 1u);
  const __m512 one = _mm512_set1_ps(1.0f);
  for (int t = 0; t < nt; ++t) {
    const __m512 g = _mm512_loadu_ps(gate + t * kQuantTileRows);
    const __m512 e = exp_poly_avx512(_mm512_sub_ps(_mm512_setzero_ps(), g));
    const __m512 silu = _mm512_div_ps(g, _mm512_add_ps(one, e));
    _mm512_mask_storeu_ps(y + t * ld, mask, _mm512_mul_ps(silu, _mm512_loadu_ps(up + t * kQuantTileRows)));
  }
}

INFERD_VNNI void quantize_row_avx512(const float* x, int64_t k, int8_t* q, float* scale, int32_t* sum,
                                     float* scaled_sum) {
  const __m512i lo = _mm512_set1_epi32(-127);
  const __m512i hi = _mm512_set1_epi32(127);
  for (int64_t b = 0; b < k / kQuantBlockValues; ++b) {
    const float* xb = x + b * kQuantBlockValues;
    const __m512 v0 = _mm512_loadu_ps(xb);
    const __m512 v1 = _mm512_loadu_ps(xb + 16);
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const __m512 idv = _mm512_set1_ps(id);
    const __m512i q0 = _mm512_min_epi32(_mm512_max_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(v0, idv)), lo), hi);
    const __m512i q1 = _mm512_min_epi32(_mm512_max_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(v1, idv)), lo), hi);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + b * kQuantBlockValues), _mm512_cvtepi32_epi8(q0));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + b * kQuantBlockValues + 16), _mm512_cvtepi32_epi8(q1));
    const int32_t s = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
    scale[b] = d;
    sum[b] = s;
    scaled_sum[b] = d * static_cast<float>(s);
  }
}

#endif  // __x86_64__

using TileFn = void (*)(const TileArgs&);

template <template <DType, int> class Kernel, DType DT>
struct ByTokens {
  static constexpr TileFn table[kMaxTokens] = {Kernel<DT, 1>::fn, Kernel<DT, 2>::fn, Kernel<DT, 3>::fn,
                                               Kernel<DT, 4>::fn, Kernel<DT, 5>::fn, Kernel<DT, 6>::fn,
                                               Kernel<DT, 7>::fn, Kernel<DT, 8>::fn};
};

#if defined(__x86_64__)
template <DType DT, int NT>
struct Avx2Kernel {
  static void fn(const TileArgs& a) { tile_avx2<DT, NT>(a); }
};
template <DType DT, int NT>
struct VnniKernel {
  static void fn(const TileArgs& a) { tile_vnni<DT, NT>(a); }
};

template <template <DType, int> class Kernel>
const TileFn* tables_for(DType dtype) {
  switch (dtype) {
    case DType::kQ8_0: return ByTokens<Kernel, DType::kQ8_0>::table;
    case DType::kQ4_0: return ByTokens<Kernel, DType::kQ4_0>::table;
    default: return ByTokens<Kernel, DType::kQ4_1>::table;
  }
}
#endif

// The tile kernel of `isa` for `dtype` and num_tokens (1..8).
TileFn tile_kernel(Isa isa, DType dtype, int num_tokens) {
#if defined(__x86_64__)
  if (static_cast<int>(isa) >= static_cast<int>(Isa::kVnni))
    return tables_for<VnniKernel>(dtype)[num_tokens - 1];
  if (static_cast<int>(isa) >= static_cast<int>(Isa::kAvx2))
    return tables_for<Avx2Kernel>(dtype)[num_tokens - 1];
#else
  (void)isa;
  (void)dtype;
  (void)num_tokens;
#endif
  return tile_scalar;
}

}  // namespace

void quantize_activations_reference(const float* x, int64_t k, int8_t* q, float* scale, int32_t* sum,
                                    float* scaled_sum) {
  for (int64_t b = 0; b < k / kQuantBlockValues; ++b) {
    const float* xb = x + b * kQuantBlockValues;
    float amax = 0.0f;
    for (int j = 0; j < kQuantBlockValues; ++j) amax = std::max(amax, std::fabs(xb[j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    int32_t s = 0;
    for (int j = 0; j < kQuantBlockValues; ++j) {
      const int8_t v = clamp_q(std::lrintf(xb[j] * id));
      q[b * kQuantBlockValues + j] = v;
      s += v;
    }
    scale[b] = d;
    sum[b] = s;
    scaled_sum[b] = d * static_cast<float>(s);
  }
}

void QuantizedActivations::reserve(int64_t tokens, int64_t k) {
  INFERD_CHECK_MSG(k % kQuantBlockValues == 0, "activation row length must be a multiple of 32");
  const auto need = static_cast<size_t>(tokens * k);
  if (need > capacity_) {
    q_ = {reinterpret_cast<int8_t*>(aligned_bytes(need)), std::free};
    capacity_ = need;
  }
  const auto blocks = static_cast<size_t>(tokens * (k / kQuantBlockValues));
  if (scale_.size() < blocks) {
    scale_.resize(blocks);
    sum_.resize(blocks);
    scaled_sum_.resize(blocks);
  }
  tokens_ = tokens;
  k_ = k;
}

QuantizedActivations::RowFn QuantizedActivations::row_function() {
#if defined(__x86_64__)
  if (static_cast<int>(active_isa()) >= static_cast<int>(Isa::kVnni)) return quantize_row_avx512;
#endif
  return quantize_row_scalar;
}

void QuantizedActivations::quantize(const float* x, int64_t tokens, int64_t k) {
  reserve(tokens, k);
  const RowFn row_fn = row_function();
  for (int64_t t = 0; t < tokens; ++t) {
    const int64_t bt = t * blocks();
    row_fn(x + t * k, k, q_.get() + t * k, scale_.data() + bt, sum_.data() + bt, scaled_sum_.data() + bt);
  }
}

void QuantizedActivations::quantize_rms_norm(const float* x, const float* weight, float eps, int64_t tokens,
                                             int64_t k) {
  reserve(tokens, k);
  const RowFn row_fn = row_function();
  thread_local std::vector<float> row;
  if (static_cast<int64_t>(row.size()) < k) row.resize(static_cast<size_t>(k));
  for (int64_t t = 0; t < tokens; ++t) {
    rms_norm(x + t * k, weight, row.data(), k, eps);
    const int64_t bt = t * blocks();
    row_fn(row.data(), k, q_.get() + t * k, scale_.data() + bt, sum_.data() + bt, scaled_sum_.data() + bt);
  }
}

bool PackedQuantWeight::supports(DType dtype) {
  return dtype == DType::kQ8_0 || dtype == DType::kQ4_0 || dtype == DType::kQ4_1;
}

Expected<PackedQuantWeight> PackedQuantWeight::pack(std::span<const TensorView* const> parts) {
  return pack_tiles(parts, false);
}

Expected<PackedQuantWeight> PackedQuantWeight::pack_swiglu(const TensorView& gate, const TensorView& up) {
  const TensorView* parts[2] = {&gate, &up};
  if (gate.num_rows() != up.num_rows()) {
    return invalid_argument("gate " + gate.shape_string() + " and up " + up.shape_string() +
                            " differ in shape");
  }
  return pack_tiles(parts, true);
}

Expected<PackedQuantWeight> PackedQuantWeight::pack_tiles(std::span<const TensorView* const> parts,
                                                          bool interleave) {
  INFERD_CHECK(!parts.empty());
  const TensorView& first = *parts[0];
  for (const TensorView* p : parts) {
    if (!supports(p->dtype)) {
      return unsupported(p->name + ": " + std::string(dtype_info(p->dtype).name) + " has no integer kernel");
    }
    if (p->dtype != first.dtype || p->row_length() != first.row_length() || p->num_dims != 2) {
      return invalid_argument(p->name + ": packed together, matrices need one dtype and row length");
    }
  }
  PackedQuantWeight w;
  w.dtype_ = first.dtype;
  w.cols_ = first.row_length();
  w.swiglu_ = interleave;
  const int64_t blocks = w.cols_ / kQuantBlockValues;
  w.block_bytes_ = scales_bytes(w.dtype_) + (w.dtype_ == DType::kQ8_0 ? 512 : 256);
  w.tile_bytes_ = static_cast<size_t>(blocks) * w.block_bytes_;
  const auto src_block = static_cast<size_t>(dtype_info(w.dtype_).block_bytes);
  int64_t tiles = 0;
  for (const TensorView* p : parts) {
    const int64_t n = (p->num_rows() + kQuantTileRows - 1) / kQuantTileRows;
    w.parts_.push_back({interleave ? static_cast<int64_t>(w.parts_.size()) : tiles, n, p->num_rows()});
    tiles += n;
  }
  w.tiles_ = tiles;
  w.data_ = {aligned_bytes(w.num_bytes()), std::free};
  const size_t qs = scales_bytes(w.dtype_);
  for (size_t pi = 0; pi < parts.size(); ++pi) {
    const TensorView& src = *parts[pi];
    const Part& part = w.parts_[pi];
    for (int64_t ti = 0; ti < part.num_tiles; ++ti) {
      const int64_t tile_index = interleave ? 2 * ti + static_cast<int64_t>(pi) : part.first_tile + ti;
      auto* tile =
          reinterpret_cast<uint8_t*>(w.data_.get() + static_cast<size_t>(tile_index) * w.tile_bytes_);
      for (int r = 0; r < kQuantTileRows && ti * kQuantTileRows + r < part.rows; ++r) {
        const auto* row = reinterpret_cast<const uint8_t*>(src.row(ti * kQuantTileRows + r));
        for (int64_t b = 0; b < blocks; ++b) {
          const uint8_t* s = row + static_cast<size_t>(b) * src_block;
          uint8_t* blk = tile + static_cast<size_t>(b) * w.block_bytes_;
          std::memcpy(blk + 2 * r, s, 2);  // d
          if (w.dtype_ == DType::kQ8_0) {
            for (int g = 0; g < 8; ++g)
              for (int j = 0; j < 4; ++j)
                blk[qs + 64 * g + 4 * r + j] = static_cast<uint8_t>(s[2 + 4 * g + j] ^ 0x80);
          } else {
            const size_t q_in = w.dtype_ == DType::kQ4_1 ? 4 : 2;
            if (w.dtype_ == DType::kQ4_1) std::memcpy(blk + 32 + 2 * r, s + 2, 2);  // m
            for (int g = 0; g < 4; ++g) std::memcpy(blk + qs + 64 * g + 4 * r, s + q_in + 4 * g, 4);
          }
        }
      }
    }
  }
  return w;
}

void quant_matmul(const QuantizedActivations& x, const PackedQuantWeight& w,
                  std::span<const QuantMatmulOutput> outputs, ThreadPool& pool, Isa isa) {
  INFERD_CHECK(x.k() == w.cols_);
  INFERD_CHECK(outputs.size() == (w.swiglu_ ? 1 : w.parts_.size()));
  const int64_t tokens = x.tokens();
  if (tokens == 0) return;
  const int64_t units = w.swiglu_ ? w.tiles_ / 2 : w.tiles_;
  const int64_t blocks = w.cols_ / kQuantBlockValues;
  auto store = store_scalar;
  auto swiglu = swiglu_scalar;
#if defined(__x86_64__)
  if (static_cast<int>(isa) >= static_cast<int>(Isa::kVnni)) {
    store = store_avx512;
    swiglu = swiglu_avx512;
  }
#endif
  pool.parallel_for(units, [&](int64_t begin, int64_t end) {
    alignas(64) float out[kMaxTokens * kQuantTileRows];
    alignas(64) float out_up[kMaxTokens * kQuantTileRows];
    for (int64_t u = begin; u < end; ++u) {
      // The part this unit's rows belong to, and the unit's first row in it.
      size_t part = 0;
      int64_t row0 = 0;
      if (w.swiglu_) {
        row0 = u * kQuantTileRows;
      } else {
        while (u >= w.parts_[part].first_tile + w.parts_[part].num_tiles) ++part;
        row0 = (u - w.parts_[part].first_tile) * kQuantTileRows;
      }
      const int rows = static_cast<int>(std::min<int64_t>(kQuantTileRows, w.parts_[part].rows - row0));
      const QuantMatmulOutput& o = outputs[w.swiglu_ ? 0 : part];
      for (int64_t t0 = 0; t0 < tokens; t0 += kMaxTokens) {
        const int nt = static_cast<int>(std::min<int64_t>(kMaxTokens, tokens - t0));
        const TileFn fn = tile_kernel(isa, w.dtype_, nt);
        float* y = o.y + t0 * o.ld + row0;
        if (w.swiglu_) {
          fn({w.tile(2 * u), w.dtype_, blocks, w.block_bytes_, &x, t0, nt, out});
          fn({w.tile(2 * u + 1), w.dtype_, blocks, w.block_bytes_, &x, t0, nt, out_up});
          swiglu(out, out_up, nt, rows, y, o.ld);
        } else {
          fn({w.tile(u), w.dtype_, blocks, w.block_bytes_, &x, t0, nt, out});
          store(out, nt, rows, y, o.ld, o.bias != nullptr ? o.bias + row0 : nullptr);
        }
      }
    }
  });
}

}  // namespace inferd
