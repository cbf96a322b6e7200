// Dequantization of one row of any DType to f32: the scalar reference of every weight format.
// Kernels use it to expand weight rows; tests check it against gguf-py's reference.
#pragma once

#include <cstddef>
#include <cstdint>

#include "tensor/dtype.h"

namespace inferd {

// Writes `num_values` floats decoded from `src` (raw, possibly unaligned file bytes) to `dst`.
// num_values must be a multiple of dtype_info(dtype).block_values. Thread-safe.
void dequantize_row(DType dtype, const std::byte* src, float* dst, int64_t num_values);

}  // namespace inferd
