// The f32 building blocks of the linear layers and attention, one implementation per ISA path:
// dot products in a fixed summation order and weight-row expansion to f32.
//
// Batch invariance: for one ISA, dot4's result for each row is bit-identical to dot's for that
// row, so a token's output never depends on how many other tokens share the step. Paths differ
// from each other only in summation order (checked against the scalar reference in tests).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cpu_isa.h"
#include "tensor/dtype.h"

namespace inferd {

struct F32Kernels {
  // sum_i a[i] * b[i].
  float (*dot)(const float* a, const float* b, int64_t n);
  // out[r] = dot(x + r * x_stride, w, n) for r < 4, bit-identical to four dot calls; reads w once.
  void (*dot4)(const float* x, int64_t x_stride, const float* w, int64_t n, float* out);
  // Expands a row of any DType to f32, bit-identical to dequantize_row (vectorised for F16,
  // BF16, Q4_0, Q4_1 and Q8_0; other types use the scalar decoder).
  void (*dequantize_row)(DType dtype, const std::byte* src, float* dst, int64_t num_values);
  // dst[i] = f16 src[i] as f32 (exact).
  void (*f16_to_f32)(const uint16_t* src, float* dst, int64_t n);
  // The f16 bits of src[i] (f32_to_f16: nearest, ties to even; a NaN as its quiet NaN) at
  // dst + i * stride: the KV cache's rows (stride 2) and its keys in groups of 16 slots.
  void (*f32_to_f16)(const float* src, int64_t n, std::byte* dst, size_t stride);
};

// The kernels of one path; a path above detected_isa() must not be called.
const F32Kernels& f32_kernels(Isa isa);
// The kernels of active_isa().
const F32Kernels& f32_kernels();

}  // namespace inferd
