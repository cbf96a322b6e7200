#include "kernels/ops.h"

#include <cmath>

namespace inferd {

void rms_norm(const float* x, const float* weight, float* y, int64_t n, float eps) {
  double sum_sq = 0;
  for (int64_t i = 0; i < n; ++i) sum_sq += static_cast<double>(x[i]) * x[i];
  const float scale = static_cast<float>(1.0 / std::sqrt(sum_sq / static_cast<double>(n) + eps));
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * scale * weight[i];
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
