// Dequantization of one row of any DType to f32: the scalar reference of every weight format.
// Kernels use it to expand weight rows; tests check it against gguf-py's reference.
#pragma once

#include <cstddef>
#include <cstdint>

#include "tensor/dtype.h"
#include "tensor/tensor_view.h"

namespace inferd {

// Writes `num_values` floats decoded from `src` (raw, possibly unaligned file bytes) to `dst`.
// num_values must be a multiple of dtype_info(dtype).block_values. Thread-safe. kI8 and kF8_E4M3
// give the stored values, without their row's scale.
void dequantize_row(DType dtype, const std::byte* src, float* dst, int64_t num_values);

// Row `row` of `t` as f32 (t.row_length() values), with its row scale applied where t has one.
void dequantize_tensor_row(const TensorView& t, int64_t row, float* dst);

}  // namespace inferd
