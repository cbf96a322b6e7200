// Quantization of f32 rows into the stored formats `inferd quantize` writes: F32, F16, BF16,
// GGUF's Q8_0, Q4_0, Q4_1 with llama.cpp's reference rounding (so files match what its quantizer
// and gguf-py write), and inferd's own I8 (INT8, per-row scale), F8_E4M3 (FP8, per-row scale)
// and Q4_G128 (INT4, asymmetric groups of 128).
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

// The target named on the command line: "f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "int8"
// (I8), "fp8" (F8_E4M3), "int4" (Q4_G128).
std::optional<DType> quantize_target(std::string_view name);

// Writes n values of src as dtype into dst (dtype_bytes(dtype, n) bytes). n must be a multiple
// of the dtype's block. Q8_0: d = max|x| / 127, q = round-half-away(x / d). Q4_0: d = m / -8
// where m is the value of largest magnitude, q = min(15, trunc(x / d + 8.5)). Q4_1: d =
// (max - min) / 15, m = min, q = min(15, trunc((x - min) / d + 0.5)). I8 and F8_E4M3 treat the
// n values as one row: *row_scale = max|x| / 127 (or / 448), q = x / scale rounded to nearest
// even (FP8 saturating). Q4_G128: per group, the f16 (d, m) of smallest squared error among a
// few grids (see quantize.cpp), q = round((x - m) / d) clamped to 0..15.
void quantize_row(DType dtype, const float* src, std::byte* dst, int64_t n, float* row_scale = nullptr);

}  // namespace inferd
