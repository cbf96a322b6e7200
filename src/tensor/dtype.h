// DType: the element formats a weight tensor can have, including GGUF's quantized blocks.
// Loaders map file types onto DType; kernels dispatch on it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace inferd {

enum class DType : uint8_t {
  kF32,
  kF16,
  kBF16,
  kQ4_0,
  kQ4_1,
  kQ5_0,
  kQ5_1,
  kQ8_0,
  kQ4_K,
  kQ5_K,
  kQ6_K,
  // inferd's own formats (docs/formats.md). kI8 and kF8_E4M3 store one value per byte and need a
  // per-row (output channel) f32 scale: value = stored * scale[row] (TensorView::row_scale).
  kI8,       // int8, GGUF's I8 type; INT8 W8A8 weights
  kF8_E4M3,  // FP8 E4M3 (bias 7, no infinities, max 448); custom GGUF type id 200
  kQ4_G128,  // 4-bit asymmetric, groups of 128: { f16 d; f16 m; u8 qs[64] }, value = q * d + m,
             // byte j holds value j (low nibble) and value j + 64 (high); custom GGUF type id 201
  kQ4_G64,   // the same with groups of 64 ({ f16 d; f16 m; u8 qs[32] }); custom GGUF type id 202
  // ggml's non-linear 4-bit types: an index into a fixed table of 16 int8 values (kIq4Values).
  kIQ4_NL,  // { f16 d; u8 qs[16] } per 32 values: d * table[q]
  kIQ4_XS,  // { f16 d; u16 scales_h; u8 scales_l[4]; u8 qs[128] } per 256: 8 blocks of 32 with 6-bit scales
  // ggml's 2- and 3-bit K-quants: 256 values in 16 sub-blocks of 16, each with its own scale.
  kQ2_K,  // { u8 scales[16] (sc | mn << 4); u8 qs[64]; f16 d; f16 dmin }: d * sc * q - dmin * mn
  kQ3_K,  // { u8 hmask[32]; u8 qs[64]; u8 scales[12] (6-bit, - 32); f16 d }: d * sc * (q - 4)
  // ggml's 3-bit grid types: each 4 values are a point of a fixed grid (src/tensor/iq_grids.h),
  // each value with its own sign; 8 blocks of 32 per 256 with a 4-bit block scale s.
  kIQ3_XXS,  // { f16 d; u8 qs[64] (grid indices); u32 signs_scales[8] }: d * (2s + 1) / 4 * ±level
  kIQ3_S,    // { f16 d; u8 qs[64]; u8 qh[8] (9th index bits); u8 signs[32]; u8 scales[4] }:
             // d * (2s + 1) * ±level
  // ggml's 2-bit grid types: each 8 values a point of a grid (1024, 256 or 512 points) with 3
  // levels, each value signed; a 4-bit scale s per 16 values (IQ2_XXS: per 32).
  kIQ2_S,    // { f16 d; u8 qs[32] (grid indices); u8 signs[32]; u8 qh[8] (their bits 8, 9); u8 scales[8] }:
             // d * (2s + 1) / 8 * ±level
  kIQ2_XXS,  // { f16 d; u16 qs[32] }: per 32 values 4 u8 grid indices, then a u32 of four 7-bit
             // sign fields (the 8th sign makes the count of minus signs even) and s in bits 28..31
  kIQ2_XS,   // { f16 d; u16 qs[32] (9-bit grid index | 7-bit signs << 9); u8 scales[8] }
  // ggml's 1-bit grid types: each 8 values a point of a grid of 2048 with the levels -1, 0, 1, each
  // block of 32 (IQ1_M: of 8) shifted by delta = -+1/8; value d * (2s + 1) * (level + delta).
  kIQ1_S,  // { f16 d; u8 qs[32]; u16 qh[8] }: per 32 values 4 u8 index low bits, and a u16 of their
           // 3 high bits each, s in bits 12..14, delta's sign in bit 15
  kIQ1_M,  // { u8 qs[32]; u8 qh[16] (per 8 values a nibble: 3 index bits, delta's sign);
           //   u16 scales[4] (3-bit s per 16 values; d, an f16, in their top nibbles) }
  // ggml's ternary types (value d * (q - 1), q 0..2; TQ2_0's 2-bit q may also be 3), one f16 d per 256.
  kTQ1_0,  // { u8 qs[48]; u8 qh[4]; f16 d }: 5 values per byte of qs, 4 per byte of qh, in base 3
  kTQ2_0,  // { u8 qs[64]; f16 d }: value 128h + 32s + l is bits 2s of qs[32h + l]
  kLast = kTQ2_0,
};

struct DTypeInfo {
  std::string_view name;
  int64_t block_values;  // values per block (1 for plain floats)
  int64_t block_bytes;   // bytes per block
  uint32_t ggml_type;    // the type id GGUF files use
};

// Layout facts of `dtype`.
const DTypeInfo& dtype_info(DType dtype);

// The DType of a GGUF (ggml) type id, or nullopt when inferd does not support it.
std::optional<DType> dtype_from_ggml(uint32_t ggml_type);

// IQ4_NL's and IQ4_XS's 16 values (ggml's kvalues_iq4nl), indexed by a 4-bit code.
inline constexpr int8_t kIq4Values[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                          1,    13,   25,  38,  53,  69,  89,  113};

// Whether values of `dtype` are multiplied by a per-row scale kept beside the tensor.
// Values per group of the 4-bit asymmetric group formats (Q4_G128, Q4_G64), else 0.
constexpr int64_t q4_group_size(DType dtype) {
  return dtype == DType::kQ4_G128 ? 128 : (dtype == DType::kQ4_G64 ? 64 : 0);
}

constexpr bool dtype_has_row_scale(DType dtype) {
  return dtype == DType::kI8 || dtype == DType::kF8_E4M3;
}

// Bytes of `num_values` values; num_values must be a multiple of the block size.
inline int64_t dtype_bytes(DType dtype, int64_t num_values) {
  const DTypeInfo& info = dtype_info(dtype);
  return num_values / info.block_values * info.block_bytes;
}

}  // namespace inferd
