#include "kernels/matmul.h"

#include <vector>

#include "kernels/f32_kernels.h"
#include "tensor/dequantize.h"

namespace inferd {

float dot_f32(const float* a, const float* b, int64_t n) {
  return f32_kernels().dot(a, b, n);
}

void matmul(const float* x, int64_t num_tokens, const TensorView& w, const float* bias, float* y,
            ThreadPool& pool, Isa isa) {
  const int64_t n_out = w.num_rows();
  const int64_t k = w.row_length();
  const bool direct = w.dtype == DType::kF32 && reinterpret_cast<uintptr_t>(w.data) % alignof(float) == 0;
  const F32Kernels& kernels = f32_kernels(isa);
  thread_local PerThread<std::vector<float>> row_buffers;  // the caller's; workers reach it by reference
  PerThread<std::vector<float>>& buffers = row_buffers;
  if (!direct) {
    buffers.prepare(pool, [&](std::vector<float>& b) {
      if (static_cast<int64_t>(b.size()) < k) b.resize(static_cast<size_t>(k));
    });
  }
  pool.parallel_for(n_out, [&](int64_t begin, int64_t end) {
    float* row_buffer = direct ? nullptr : buffers.mine().data();
    for (int64_t n = begin; n < end; ++n) {
      const float* row;
      if (direct) {
        row = reinterpret_cast<const float*>(w.row(n));
      } else {
        kernels.dequantize_row(w.dtype, w.row(n), row_buffer, k);
        if (w.row_scale != nullptr) {
          for (int64_t i = 0; i < k; ++i) row_buffer[i] *= w.row_scale[n];
        }
        row = row_buffer;
      }
      const float b = bias != nullptr ? bias[n] : 0.0f;
      // Four tokens per pass share each load of the weight row; dot4 gives each token exactly
      // what dot gives it alone, so the split of tokens into groups never changes a result.
      int64_t t = 0;
      for (; t + 4 <= num_tokens; t += 4) {
        float out[4];
        kernels.dot4(x + t * k, k, row, k, out);
        for (int r = 0; r < 4; ++r) y[(t + r) * n_out + n] = out[r] + b;
      }
      for (; t < num_tokens; ++t) y[t * n_out + n] = kernels.dot(x + t * k, row, k) + b;
    }
  });
}

void matmul_reference(const float* x, int64_t num_tokens, const TensorView& w, const float* bias, float* y) {
  const int64_t n_out = w.num_rows();
  const int64_t k = w.row_length();
  std::vector<float> row(static_cast<size_t>(k));
  for (int64_t n = 0; n < n_out; ++n) {
    dequantize_tensor_row(w, n, row.data());
    for (int64_t t = 0; t < num_tokens; ++t) {
      double acc = bias != nullptr ? bias[n] : 0.0;
      for (int64_t i = 0; i < k; ++i) acc += static_cast<double>(x[t * k + i]) * row[static_cast<size_t>(i)];
      y[t * n_out + n] = static_cast<float>(acc);
    }
  }
}

}  // namespace inferd
