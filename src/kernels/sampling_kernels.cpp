#include "kernels/sampling_kernels.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/exp_poly.h"
#include "kernels/simd.h"

namespace inferd {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

__attribute__((always_inline)) inline float softmax_weights_body(const float* x, int64_t n, float temperature,
                                                                 float* w, float* block_sums) {
  float top = kNegInf;
  for (int64_t i = 0; i < n; ++i) top = std::max(top, x[i]);
  const float m = top / temperature;  // division keeps the order: the max of x / t
  for (int64_t b0 = 0; b0 < n; b0 += kSoftmaxBlock) {
    const int64_t end = std::min(n, b0 + kSoftmaxBlock);
    float lanes[16] = {};
    for (int64_t i = b0; i < end; ++i) {
      w[i] = x[i] == kNegInf ? 0.0f : exp_poly(x[i] / temperature - m);
      lanes[(i - b0) % 16] += w[i];
    }
    float sum = 0.0f;
    for (float l : lanes) sum += l;
    block_sums[b0 / kSoftmaxBlock] = sum;
  }
  return m;
}

int64_t argmax_scalar(const float* x, int64_t n) {
  int64_t best = 0;
  float top = x[0];
  for (int64_t i = 1; i < n; ++i) {
    if (x[i] > top) {
      top = x[i];
      best = i;
    }
  }
  return best;
}

#if defined(__x86_64__)
// Each lane keeps its largest value and the first index of it (-inf and index 0 to start, so a
// lane of -inf and NaN only is never picked over a real value); then the lanes' largest, the
// smallest index on ties.
INFERD_AVX512 int64_t argmax_avx512(const float* x, int64_t n) {
  if (n < 32 || std::isnan(x[0])) return argmax_scalar(x, n);
  if (n > (int64_t{1} << 31) - 16) return argmax_scalar(x, n);  // lane indices are int32
  __m512 top = _mm512_set1_ps(kNegInf);
  __m512i index = _mm512_setzero_si512();
  __m512i at = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512i step = _mm512_set1_epi32(16);
  for (int64_t i = 0; i < n; i += 16) {
    const int64_t left = std::min<int64_t>(16, n - i);
    const auto mask = static_cast<__mmask16>(left == 16 ? 0xffff : (1u << left) - 1);
    const __m512 v = _mm512_maskz_loadu_ps(mask, x + i);
    const __mmask16 larger = _mm512_mask_cmp_ps_mask(mask, v, top, _CMP_GT_OQ);
    top = _mm512_mask_mov_ps(top, larger, v);
    index = _mm512_mask_mov_epi32(index, larger, at);
    at = _mm512_add_epi32(at, step);
  }
  alignas(64) float values[16];
  alignas(64) int32_t indices[16];
  _mm512_store_ps(values, top);
  _mm512_store_si512(indices, index);
  int64_t best = 0;
  float best_value = x[0];
  for (int l = 0; l < 16; ++l) {
    if (values[l] > best_value || (values[l] == best_value && indices[l] < best)) {
      best_value = values[l];
      best = indices[l];
    }
  }
  return best;
}

// The scalar body with the fma instruction (std::fma is a library call without it).
INFERD_AVX2 float softmax_weights_fma(const float* x, int64_t n, float temperature, float* w,
                                      float* block_sums) {
  return softmax_weights_body(x, n, temperature, w, block_sums);
}

INFERD_AVX512 float softmax_weights_avx512(const float* x, int64_t n, float temperature, float* w,
                                           float* block_sums) {
  __m512 top = _mm512_set1_ps(kNegInf);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) top = _mm512_max_ps(top, _mm512_loadu_ps(x + i));
  if (i < n) {
    const auto mask = static_cast<__mmask16>((1u << (n - i)) - 1);
    top = _mm512_mask_max_ps(top, mask, top, _mm512_maskz_loadu_ps(mask, x + i));
  }
  const float m = _mm512_reduce_max_ps(top) / temperature;  // max is exact in any order
  const __m512 vm = _mm512_set1_ps(m), vt = _mm512_set1_ps(temperature), ninf = _mm512_set1_ps(kNegInf);
  for (int64_t b0 = 0; b0 < n; b0 += kSoftmaxBlock) {
    const int64_t end = std::min(n, b0 + kSoftmaxBlock);
    __m512 lanes = _mm512_setzero_ps();
    for (int64_t j = b0; j < end; j += 16) {
      const int64_t left = std::min<int64_t>(16, end - j);
      const auto mask = static_cast<__mmask16>(left == 16 ? 0xffff : (1u << left) - 1);
      const __m512 v = _mm512_maskz_loadu_ps(mask, x + j);
      const __mmask16 live = _mm512_mask_cmp_ps_mask(mask, v, ninf, _CMP_NEQ_OQ);
      const __m512 e = exp_avx512(_mm512_sub_ps(_mm512_div_ps(v, vt), vm));
      const __m512 weight = _mm512_maskz_mov_ps(live, e);
      _mm512_mask_storeu_ps(w + j, mask, weight);
      lanes = _mm512_add_ps(lanes, weight);  // lanes past the end add +0: unchanged
    }
    alignas(64) float l[16];
    _mm512_store_ps(l, lanes);
    float sum = 0.0f;
    for (float v : l) sum += v;
    block_sums[b0 / kSoftmaxBlock] = sum;
  }
  return m;
}
#endif

}  // namespace

int64_t argmax(const float* x, int64_t n, Isa isa) {
#if defined(__x86_64__)
  if (static_cast<int>(isa) >= static_cast<int>(Isa::kAvx512)) return argmax_avx512(x, n);
#else
  (void)isa;
#endif
  return argmax_scalar(x, n);
}

float softmax_weights(const float* x, int64_t n, float temperature, float* w, float* block_sums, Isa isa) {
#if defined(__x86_64__)
  if (static_cast<int>(isa) >= static_cast<int>(Isa::kAvx512))
    return softmax_weights_avx512(x, n, temperature, w, block_sums);
  if (static_cast<int>(isa) >= static_cast<int>(Isa::kAvx2))
    return softmax_weights_fma(x, n, temperature, w, block_sums);
#else
  (void)isa;
#endif
  return softmax_weights_body(x, n, temperature, w, block_sums);
}

}  // namespace inferd
