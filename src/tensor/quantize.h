// Quantization of f32 rows into the stored formats `inferd quantize` writes: F32, F16, BF16 and
// GGUF's Q8_0, Q4_0, Q4_1, with llama.cpp's reference rounding (so files match what its
// quantizer and gguf-py write).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include "common/status.h"
#include "tensor/dtype.h"

namespace inferd {

// Whether quantize_row writes `dtype`.
bool can_quantize_to(DType dtype);

// The target named on the command line ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1").
std::optional<DType> quantize_target(std::string_view name);

// Writes n values of src as dtype into dst (dtype_bytes(dtype, n) bytes). n must be a multiple
// of the dtype's block. Q8_0: d = max|x| / 127, q = round-half-away(x / d). Q4_0: d = m / -8
// where m is the value of largest magnitude, q = min(15, trunc(x / d + 8.5)). Q4_1: d =
// (max - min) / 15, m = min, q = min(15, trunc((x - min) / d + 0.5)).
void quantize_row(DType dtype, const float* src, std::byte* dst, int64_t n);

}  // namespace inferd
