#include "kernels/ops.h"

#include <cmath>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace inferd {

namespace {

// The sum of squares' partial sums: value i goes to lane i % kNormLanes, then a pairwise tree.
// A float's square is exact in double, so each lane's sums are the same in any instruction set.
constexpr int kNormLanes = 16;

double norm_tree(double (&lanes)[kNormLanes]) {
  for (int width = kNormLanes / 2; width > 0; width /= 2)
    for (int j = 0; j < width; ++j) lanes[j] += lanes[j + width];
  return lanes[0];
}

double sum_squares_scalar(const float* x, int64_t n) {
  double lanes[kNormLanes] = {};
  for (int64_t i = 0; i < n; ++i) lanes[i % kNormLanes] += static_cast<double>(x[i]) * x[i];
  return norm_tree(lanes);
}

#if defined(__x86_64__)
// Lanes 0-7 in lo, 8-15 in hi; the tree's first step (lane j + 8 into lane j) is lo + hi.
// (maskz_cvtps_pd: GCC 12 warns that the unmasked form's undefined source is used uninitialized.)
__attribute__((target("avx512f"))) double sum_squares_avx512(const float* x, int64_t n) {
  __m512d lo = _mm512_setzero_pd(), hi = _mm512_setzero_pd();
  int64_t i = 0;
  for (; i + kNormLanes <= n; i += kNormLanes) {
    const __m512d a = _mm512_maskz_cvtps_pd(0xff, _mm256_loadu_ps(x + i));
    const __m512d b = _mm512_maskz_cvtps_pd(0xff, _mm256_loadu_ps(x + i + 8));
    lo = _mm512_add_pd(lo, _mm512_mul_pd(a, a));
    hi = _mm512_add_pd(hi, _mm512_mul_pd(b, b));
  }
  alignas(64) double lanes[kNormLanes];
  _mm512_store_pd(lanes, lo);
  _mm512_store_pd(lanes + 8, hi);
  for (int j = 0; i < n; ++i, ++j) lanes[j] += static_cast<double>(x[i]) * x[i];
  return norm_tree(lanes);
}
#endif

float norm_scale(double sum_sq, int64_t n, float eps) {
  return static_cast<float>(1.0 / std::sqrt(sum_sq / static_cast<double>(n) + eps));
}

void scale_row_scalar(const float* x, float scale, const float* weight, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * scale * weight[i];
}

#if defined(__x86_64__)
// (x * scale) * weight, two roundings per value as in the scalar loop.
__attribute__((target("avx512f"))) void scale_row_avx512(const float* x, float scale, const float* weight,
                                                         float* y, int64_t n) {
  const __m512 s = _mm512_set1_ps(scale);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(y + i,
                     _mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(x + i), s), _mm512_loadu_ps(weight + i)));
  scale_row_scalar(x + i, scale, weight + i, y + i, n - i);
}
#endif

}  // namespace

void rms_norm(const float* x, const float* weight, float* y, int64_t n, float eps, Isa isa) {
#if defined(__x86_64__)
  if (static_cast<int>(isa) >= static_cast<int>(Isa::kAvx512))
    return scale_row_avx512(x, norm_scale(sum_squares_avx512(x, n), n, eps), weight, y, n);
#else
  (void)isa;
#endif
  scale_row_scalar(x, norm_scale(sum_squares_scalar(x, n), n, eps), weight, y, n);
}

void rms_norm(const float* x, const float* weight, float* y, int64_t n, float eps) {
  static const Isa isa = active_isa();
  rms_norm(x, weight, y, n, eps, isa);
}

std::vector<float> rope_inverse_frequencies(int64_t head_dim, double theta) {
  std::vector<float> inv(static_cast<size_t>(head_dim / 2));
  const float base = static_cast<float>(theta);
  for (int64_t i = 0; i < head_dim / 2; ++i) {
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(head_dim);
    inv[static_cast<size_t>(i)] = 1.0f / std::pow(base, exponent);
  }
  return inv;
}

void rope(float* x, int64_t num_heads, int64_t head_dim, int64_t pos, const float* inv_freq,
          RopePairing pairing, float scale) {
  const int64_t half = head_dim / 2;
  for (int64_t i = 0; i < half; ++i) {
    const float angle = static_cast<float>(pos) * inv_freq[i];
    const float c = static_cast<float>(std::cos(static_cast<double>(angle))) * scale;
    const float s = static_cast<float>(std::sin(static_cast<double>(angle))) * scale;
    for (int64_t h = 0; h < num_heads; ++h) {
      float* v = x + h * head_dim;
      const int64_t i0 = pairing == RopePairing::kNeox ? i : 2 * i;
      const int64_t i1 = pairing == RopePairing::kNeox ? i + half : 2 * i + 1;
      const float a = v[i0], b = v[i1];
      v[i0] = a * c - b * s;
      v[i1] = b * c + a * s;
    }
  }
}

void rope_qk(float* q, int64_t num_q_heads, float* k, int64_t num_kv_heads, int64_t head_dim, int64_t pos,
             const float* inv_freq, RopePairing pairing, float scale) {
  const int64_t half = head_dim / 2;
  for (int64_t i = 0; i < half; ++i) {
    const float angle = static_cast<float>(pos) * inv_freq[i];
    const float c = static_cast<float>(std::cos(static_cast<double>(angle))) * scale;
    const float s = static_cast<float>(std::sin(static_cast<double>(angle))) * scale;
    const int64_t i0 = pairing == RopePairing::kNeox ? i : 2 * i;
    const int64_t i1 = pairing == RopePairing::kNeox ? i + half : 2 * i + 1;
    for (float* x : {q, k}) {
      const int64_t heads = x == q ? num_q_heads : num_kv_heads;
      for (int64_t h = 0; h < heads; ++h) {
        float* v = x + h * head_dim;
        const float a = v[i0], b = v[i1];
        v[i0] = a * c - b * s;
        v[i1] = b * c + a * s;
      }
    }
  }
}

void rope_cos_sin(int64_t pos, const float* inv_freq, int64_t head_dim, float scale, float* cos_sin) {
  const int64_t half = head_dim / 2;
  for (int64_t i = 0; i < half; ++i) {
    const float angle = static_cast<float>(pos) * inv_freq[i];
    cos_sin[i] = static_cast<float>(std::cos(static_cast<double>(angle))) * scale;
    cos_sin[half + i] = static_cast<float>(std::sin(static_cast<double>(angle))) * scale;
  }
}

void rope_qk_table(float* q, int64_t num_q_heads, float* k, int64_t num_kv_heads, int64_t head_dim,
                   const float* cos_sin, RopePairing pairing) {
  const int64_t half = head_dim / 2;
  const float* cs = cos_sin;
  const float* sn = cos_sin + half;
  // Head by head, pair by pair: NeoX pairs (i, i + half) are two contiguous runs, which the
  // compiler vectorises.
  auto rotate = [&](float* v) {
    if (pairing == RopePairing::kNeox) {
      for (int64_t i = 0; i < half; ++i) {
        const float a = v[i], b = v[i + half];
        v[i] = a * cs[i] - b * sn[i];
        v[i + half] = b * cs[i] + a * sn[i];
      }
    } else {
      for (int64_t i = 0; i < half; ++i) {
        const float a = v[2 * i], b = v[2 * i + 1];
        v[2 * i] = a * cs[i] - b * sn[i];
        v[2 * i + 1] = b * cs[i] + a * sn[i];
      }
    }
  };
  for (int64_t h = 0; h < num_q_heads; ++h) rotate(q + h * head_dim);
  for (int64_t h = 0; h < num_kv_heads; ++h) rotate(k + h * head_dim);
}

void silu_mul(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

}  // namespace inferd
