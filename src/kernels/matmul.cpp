#include "kernels/matmul.h"

#include <vector>

#include "tensor/dequantize.h"

namespace inferd {

#if defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__)
#define INFERD_CLONES __attribute__((target_clones("arch=skylake-avx512", "arch=haswell", "default")))
#else
#define INFERD_CLONES
#endif

INFERD_CLONES float dot_f32(const float* a, const float* b, int64_t n) {
  constexpr int kLanes = 16;
  float acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) acc[j] += a[i + j] * b[i + j];
  }
  for (int j = 0; i < n; ++i, ++j) acc[j] += a[i] * b[i];
  // Fixed pairwise tree over the lanes.
  for (int width = kLanes / 2; width > 0; width /= 2) {
    for (int j = 0; j < width; ++j) acc[j] += acc[j + width];
  }
  return acc[0];
}

void matmul(const float* x, int64_t num_tokens, const TensorView& w, const float* bias, float* y,
            ThreadPool& pool) {
  const int64_t n_out = w.num_rows();
  const int64_t k = w.row_length();
  const bool direct = w.dtype == DType::kF32 && reinterpret_cast<uintptr_t>(w.data) % alignof(float) == 0;
  pool.parallel_for(n_out, [&](int64_t begin, int64_t end) {
    thread_local std::vector<float> row_buffer;
    if (!direct && static_cast<int64_t>(row_buffer.size()) < k) row_buffer.resize(static_cast<size_t>(k));
    for (int64_t n = begin; n < end; ++n) {
      const float* row;
      if (direct) {
        row = reinterpret_cast<const float*>(w.row(n));
      } else {
        dequantize_row(w.dtype, w.row(n), row_buffer.data(), k);
        row = row_buffer.data();
      }
      const float b = bias != nullptr ? bias[n] : 0.0f;
      for (int64_t t = 0; t < num_tokens; ++t) y[t * n_out + n] = dot_f32(x + t * k, row, k) + b;
    }
  });
}

void matmul_reference(const float* x, int64_t num_tokens, const TensorView& w, const float* bias, float* y) {
  const int64_t n_out = w.num_rows();
  const int64_t k = w.row_length();
  std::vector<float> row(static_cast<size_t>(k));
  for (int64_t n = 0; n < n_out; ++n) {
    dequantize_row(w.dtype, w.row(n), row.data(), k);
    for (int64_t t = 0; t < num_tokens; ++t) {
      double acc = bias != nullptr ? bias[n] : 0.0;
      for (int64_t i = 0; i < k; ++i) acc += static_cast<double>(x[t * k + i]) * row[static_cast<size_t>(i)];
      y[t * n_out + n] = static_cast<float>(acc);
    }
  }
}

}  // namespace inferd
