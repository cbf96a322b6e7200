// Matrix multiplication of activations by a weight matrix of any DType (f32 math).
// The transformer's linear layers call it; the thread split is over output rows, so each output
// value is computed in one fixed order whatever the batch: results are batch-invariant.
#pragma once

#include <cstdint>

#include "common/thread_pool.h"
#include "kernels/cpu_isa.h"
#include "tensor/tensor_view.h"

namespace inferd {

// y[t, n] = sum_k x[t, k] * w[n, k] (+ bias[n]) for t < num_tokens.
// x: [num_tokens, K] f32; w: [N, K] any DType; bias: [N] or null; y: [num_tokens, N].
void matmul(const float* x, int64_t num_tokens, const TensorView& w, const float* bias, float* y,
            ThreadPool& pool, Isa isa = active_isa());

// Scalar reference of matmul (double accumulation), for tests.
void matmul_reference(const float* x, int64_t num_tokens, const TensorView& w, const float* bias, float* y);

// Dot product of two f32 vectors in the fixed summation order of the active ISA path.
float dot_f32(const float* a, const float* b, int64_t n);

}  // namespace inferd
