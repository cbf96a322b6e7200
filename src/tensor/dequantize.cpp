#include "tensor/dequantize.h"

#include <cstring>

#include "common/check.h"
#include "common/half.h"
#include "tensor/ggml_blocks.h"

namespace inferd {

namespace {

using u8 = uint8_t;

// Q4_0: { f16 d; u8 qs[16] } -> x[j] = (lo nibble - 8) * d, x[j + 16] = (hi nibble - 8) * d.
void dequant_q4_0(const u8* b, float* y) {
  const float d = load_f16(b);
  const u8* qs = b + 2;
  for (int j = 0; j < 16; ++j) {
    y[j] = static_cast<float>((qs[j] & 0x0f) - 8) * d;
    y[j + 16] = static_cast<float>((qs[j] >> 4) - 8) * d;
  }
}

// Q4_1: { f16 d; f16 m; u8 qs[16] } -> x = nibble * d + m.
void dequant_q4_1(const u8* b, float* y) {
  const float d = load_f16(b);
  const float m = load_f16(b + 2);
  const u8* qs = b + 4;
  for (int j = 0; j < 16; ++j) {
    y[j] = static_cast<float>(qs[j] & 0x0f) * d + m;
    y[j + 16] = static_cast<float>(qs[j] >> 4) * d + m;
  }
}

// Q5_0: { f16 d; u8 qh[4]; u8 qs[16] }; bit j of qh is the 5th bit of value j.
void dequant_q5_0(const u8* b, float* y) {
  const float d = load_f16(b);
  const uint32_t qh = load_u32(b + 2);
  const u8* qs = b + 6;
  for (int j = 0; j < 16; ++j) {
    const int hi0 = static_cast<int>((qh >> j) & 1u) << 4;
    const int hi1 = static_cast<int>((qh >> (j + 16)) & 1u) << 4;
    y[j] = static_cast<float>(((qs[j] & 0x0f) | hi0) - 16) * d;
    y[j + 16] = static_cast<float>(((qs[j] >> 4) | hi1) - 16) * d;
  }
}

// Q5_1: { f16 d; f16 m; u8 qh[4]; u8 qs[16] } -> x = q5 * d + m.
void dequant_q5_1(const u8* b, float* y) {
  const float d = load_f16(b);
  const float m = load_f16(b + 2);
  const uint32_t qh = load_u32(b + 4);
  const u8* qs = b + 8;
  for (int j = 0; j < 16; ++j) {
    const int hi0 = static_cast<int>((qh >> j) & 1u) << 4;
    const int hi1 = static_cast<int>((qh >> (j + 16)) & 1u) << 4;
    y[j] = static_cast<float>((qs[j] & 0x0f) | hi0) * d + m;
    y[j + 16] = static_cast<float>((qs[j] >> 4) | hi1) * d + m;
  }
}

// Q8_0: { f16 d; i8 qs[32] } -> x = q * d.
void dequant_q8_0(const u8* b, float* y) {
  const float d = load_f16(b);
  for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(static_cast<int8_t>(b[2 + j])) * d;
}

// Scale and offset of sub-block j of a Q4_K / Q5_K block: value = scale * q - offset.
struct SubBlock {
  float scale, offset;
};
SubBlock k_sub_block(int j, const u8* scales, float d, float dmin) {
  u8 sc, m;
  k_scale_min(j, scales, &sc, &m);
  return {d * sc, dmin * m};
}

// Q4_K: { f16 d; f16 dmin; u8 scales[12]; u8 qs[128] }, 8 sub-blocks of 32 values.
void dequant_q4_k(const u8* b, float* y) {
  const float d = load_f16(b);
  const float dmin = load_f16(b + 2);
  const u8* scales = b + 4;
  const u8* q = b + 16;
  for (int j = 0, is = 0; j < 256; j += 64, is += 2, q += 32) {
    const SubBlock lo = k_sub_block(is, scales, d, dmin), hi = k_sub_block(is + 1, scales, d, dmin);
    for (int l = 0; l < 32; ++l) *y++ = lo.scale * static_cast<float>(q[l] & 0x0f) - lo.offset;
    for (int l = 0; l < 32; ++l) *y++ = hi.scale * static_cast<float>(q[l] >> 4) - hi.offset;
  }
}

// Q5_K: { f16 d; f16 dmin; u8 scales[12]; u8 qh[32]; u8 qs[128] }.
void dequant_q5_k(const u8* b, float* y) {
  const float d = load_f16(b);
  const float dmin = load_f16(b + 2);
  const u8* scales = b + 4;
  const u8* qh = b + 16;
  const u8* ql = b + 48;
  u8 u1 = 1, u2 = 2;
  for (int j = 0, is = 0; j < 256; j += 64, is += 2, ql += 32) {
    const SubBlock lo = k_sub_block(is, scales, d, dmin), hi = k_sub_block(is + 1, scales, d, dmin);
    for (int l = 0; l < 32; ++l) {
      *y++ = lo.scale * static_cast<float>((ql[l] & 0x0f) + ((qh[l] & u1) ? 16 : 0)) - lo.offset;
    }
    for (int l = 0; l < 32; ++l) {
      *y++ = hi.scale * static_cast<float>((ql[l] >> 4) + ((qh[l] & u2) ? 16 : 0)) - hi.offset;
    }
    u1 = static_cast<u8>(u1 << 2);
    u2 = static_cast<u8>(u2 << 2);
  }
}

// Q6_K: { u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d }, 16 sub-blocks of 16 values.
void dequant_q6_k(const u8* b, float* y) {
  const u8* ql = b;
  const u8* qh = b + 128;
  const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
  const float d = load_f16(b + 208);
  for (int n = 0; n < 256; n += 128) {
    for (int l = 0; l < 32; ++l) {
      const int is = l / 16;
      const int q1 = ((ql[l] & 0x0f) | (((qh[l] >> 0) & 3) << 4)) - 32;
      const int q2 = ((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) - 32;
      const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      y[l] = d * static_cast<float>(sc[is] * q1);
      y[l + 32] = d * static_cast<float>(sc[is + 2] * q2);
      y[l + 64] = d * static_cast<float>(sc[is + 4] * q3);
      y[l + 96] = d * static_cast<float>(sc[is + 6] * q4);
    }
    y += 128;
    ql += 64;
    qh += 32;
    sc += 8;
  }
}

// Q4_G128 / Q4_G64: { f16 d; f16 m; u8 qs[G / 2] } -> x[j] = lo(qs[j]) * d + m,
// x[j + G / 2] = hi(qs[j]) * d + m.
template <int G>
void dequant_q4_group(const u8* b, float* y) {
  const float d = load_f16(b);
  const float m = load_f16(b + 2);
  const u8* qs = b + 4;
  for (int j = 0; j < G / 2; ++j) {
    y[j] = static_cast<float>(qs[j] & 0x0f) * d + m;
    y[j + G / 2] = static_cast<float>(qs[j] >> 4) * d + m;
  }
}

// IQ4_NL: { f16 d; u8 qs[16] } -> y[j] = d * table[lo(qs[j])], y[j + 16] = d * table[hi(qs[j])].
void dequant_iq4_nl(const u8* b, float* y) {
  const float d = load_f16(b);
  for (int j = 0; j < 16; ++j) {
    y[j] = d * static_cast<float>(kIq4Values[b[2 + j] & 0x0f]);
    y[j + 16] = d * static_cast<float>(kIq4Values[b[2 + j] >> 4]);
  }
}

// IQ4_XS: { f16 d; u16 scales_h; u8 scales_l[4]; u8 qs[128] }: block ib of 32 values has the
// 6-bit scale ls = (nibble ib of scales_l) | (bits 2ib, 2ib+1 of scales_h) << 4, and its values
// (d * (ls - 32)) * table[q], its 16 bytes of qs holding values j (low) and j + 16 (high).
void dequant_iq4_xs(const u8* b, float* y) {
  const float d = load_f16(b);
  const uint32_t scales_h = load_u16(b + 2);
  const u8* scales_l = b + 4;
  const u8* qs = b + 8;
  for (int ib = 0; ib < 8; ++ib, qs += 16, y += 32) {
    const int ls = iq4_xs_scale(scales_h, scales_l, ib);
    const float dl = d * static_cast<float>(ls - 32);
    for (int j = 0; j < 16; ++j) {
      y[j] = dl * static_cast<float>(kIq4Values[qs[j] & 0x0f]);
      y[j + 16] = dl * static_cast<float>(kIq4Values[qs[j] >> 4]);
    }
  }
}

// A grid code sign << 3 | level as its signed level.
inline float signed_level(const int8_t* levels, uint8_t code) {
  const auto level = static_cast<float>(levels[code & 7]);
  return (code & 8) != 0 ? -level : level;
}

// IQ3_XXS / IQ3_S: block ib's 32 values are (d * m [/ 4]) * -+level, from iq3_*_block's codes
// (tensor/ggml_blocks.h); the products are exact in f32 up to the last one, as ggml's.
template <bool kXxs>
void dequant_iq3(const u8* b, float* y) {
  const float d = load_f16(b);
  const int8_t* levels = kXxs ? kIq3XxsLevels : kIq3sLevels;
  uint8_t codes[32];
  for (int ib = 0; ib < 8; ++ib, y += 32) {
    const int m = kXxs ? iq3_xxs_block(b, ib, codes) : iq3_s_block(b, ib, codes);
    const float dl = kXxs ? d * static_cast<float>(m) * 0.25f : d * static_cast<float>(m);
    for (int v = 0; v < 32; ++v) y[v] = dl * signed_level(levels, codes[v]);
  }
}

// IQ2_S / IQ2_XS / IQ2_XXS: the 32 values of block ib (each half of 16 with its own m; IQ2_XXS one
// m for the block) are (d * m * 0.125) * -+level (iq2_*_block).
template <DType kType>
void dequant_iq2(const u8* b, float* y) {
  uint8_t codes[32];
  int m[2];
  for (int ib = 0; ib < 8; ++ib, y += 32) {
    const float d = f16_to_f32(low_bit_grid_block(kType, b, ib, codes, m));
    for (int v = 0; v < 32; ++v) {
      const float dl = d * static_cast<float>(m[v / 16]) * 0.125f;
      y[v] = dl * signed_level(kIq2sLevels, codes[v]);
    }
  }
}

// IQ1_S / IQ1_M: the 32 values of block ib (IQ1_M: each half of 16 with its own m) are
// (d * m) * (level -+ 0.125) (iq1_*_block), computed as ggml does, exact in f32.
template <DType kType>
void dequant_iq1(const u8* b, float* y) {
  uint8_t codes[32];
  int m[2];
  for (int ib = 0; ib < 8; ++ib, y += 32) {
    const float d = f16_to_f32(low_bit_grid_block(kType, b, ib, codes, m));
    for (int v = 0; v < 32; ++v) {
      const float dl = d * static_cast<float>(m[v / 16]);
      const float delta = (codes[v] & 8) != 0 ? -0.125f : 0.125f;
      y[v] = dl * (static_cast<float>(kIq1sLevels[codes[v] & 3]) + delta);
    }
  }
}

// TQ1_0 / TQ2_0: value v is d * (q - 1) (tq1_0_q, tq2_0_q).
template <DType kType>
void dequant_tq(const u8* b, float* y) {
  const bool one = kType == DType::kTQ1_0;
  const float d = load_f16(b + (one ? 52 : 64));
  for (int v = 0; v < 256; ++v) y[v] = d * static_cast<float>((one ? tq1_0_q(b, v) : tq2_0_q(b, v)) - 1);
}

// Q2_K: { u8 scales[16]; u8 qs[64]; f16 d; f16 dmin }: sub-block i (values 16i..16i+15) has scale
// d * (scales[i] & 15) and min dmin * (scales[i] >> 4); value v's 2-bit q is bits 2s of
// qs[32h + l] for v = 128h + 32s + l (k_low2).
void dequant_q2_k(const u8* b, float* y) {
  const float d = load_f16(b + 80);
  const float dmin = load_f16(b + 82);
  for (int v = 0; v < 256; ++v) {
    const u8 sc = b[v / 16];
    const int q = k_low2(b + 16, v);
    y[v] = d * static_cast<float>(sc & 0x0f) * static_cast<float>(q) - dmin * static_cast<float>(sc >> 4);
  }
}

// Q3_K: { u8 hmask[32]; u8 qs[64]; u8 scales[12]; f16 d }: value v's low 2 bits as Q2_K's, its
// third bit (v / 32) of hmask[v % 32], q = low + 4 * bit - 4; sub-block i's scale q3_k_scale.
void dequant_q3_k(const u8* b, float* y) {
  const u8* hmask = b;
  const u8* qs = b + 32;
  const u8* scales = b + 96;
  const float d = load_f16(b + 108);
  for (int v = 0; v < 256; ++v) {
    const int sc = q3_k_scale(scales, v / 16);
    const int q = k_low2(qs, v) | (((hmask[v % 32] >> (v / 32)) & 1) << 2);
    y[v] = d * static_cast<float>(sc) * static_cast<float>(q - 4);
  }
}

template <void (*Block)(const u8*, float*)>
void dequant_blocks(const std::byte* src, float* dst, int64_t num_values, DType dtype) {
  const DTypeInfo& info = dtype_info(dtype);
  const int64_t num_blocks = num_values / info.block_values;
  const u8* b = reinterpret_cast<const u8*>(src);
  for (int64_t i = 0; i < num_blocks; ++i) {
    Block(b + i * info.block_bytes, dst + i * info.block_values);
  }
}

}  // namespace

void dequantize_row(DType dtype, const std::byte* src, float* dst, int64_t num_values) {
  INFERD_CHECK(num_values % dtype_info(dtype).block_values == 0);
  switch (dtype) {
    case DType::kF32: std::memcpy(dst, src, static_cast<size_t>(num_values) * sizeof(float)); return;
    case DType::kF16:
      for (int64_t i = 0; i < num_values; ++i) dst[i] = load_f16(src + 2 * i);
      return;
    case DType::kBF16:
      for (int64_t i = 0; i < num_values; ++i) dst[i] = bf16_to_f32(load_u16(src + 2 * i));
      return;
    case DType::kQ4_0: return dequant_blocks<dequant_q4_0>(src, dst, num_values, dtype);
    case DType::kQ4_1: return dequant_blocks<dequant_q4_1>(src, dst, num_values, dtype);
    case DType::kQ5_0: return dequant_blocks<dequant_q5_0>(src, dst, num_values, dtype);
    case DType::kQ5_1: return dequant_blocks<dequant_q5_1>(src, dst, num_values, dtype);
    case DType::kQ8_0: return dequant_blocks<dequant_q8_0>(src, dst, num_values, dtype);
    case DType::kQ4_K: return dequant_blocks<dequant_q4_k>(src, dst, num_values, dtype);
    case DType::kQ5_K: return dequant_blocks<dequant_q5_k>(src, dst, num_values, dtype);
    case DType::kQ6_K: return dequant_blocks<dequant_q6_k>(src, dst, num_values, dtype);
    case DType::kI8:
      for (int64_t i = 0; i < num_values; ++i) dst[i] = static_cast<float>(static_cast<int8_t>(src[i]));
      return;
    case DType::kF8_E4M3:
      for (int64_t i = 0; i < num_values; ++i) dst[i] = fp8_e4m3_to_f32(static_cast<u8>(src[i]));
      return;
    case DType::kQ4_G128: return dequant_blocks<dequant_q4_group<128>>(src, dst, num_values, dtype);
    case DType::kQ4_G64: return dequant_blocks<dequant_q4_group<64>>(src, dst, num_values, dtype);
    case DType::kIQ4_NL: return dequant_blocks<dequant_iq4_nl>(src, dst, num_values, dtype);
    case DType::kIQ4_XS: return dequant_blocks<dequant_iq4_xs>(src, dst, num_values, dtype);
    case DType::kQ2_K: return dequant_blocks<dequant_q2_k>(src, dst, num_values, dtype);
    case DType::kQ3_K: return dequant_blocks<dequant_q3_k>(src, dst, num_values, dtype);
    case DType::kIQ3_XXS: return dequant_blocks<dequant_iq3<true>>(src, dst, num_values, dtype);
    case DType::kIQ3_S: return dequant_blocks<dequant_iq3<false>>(src, dst, num_values, dtype);
    case DType::kIQ2_S: return dequant_blocks<dequant_iq2<DType::kIQ2_S>>(src, dst, num_values, dtype);
    case DType::kIQ2_XXS: return dequant_blocks<dequant_iq2<DType::kIQ2_XXS>>(src, dst, num_values, dtype);
    case DType::kIQ2_XS: return dequant_blocks<dequant_iq2<DType::kIQ2_XS>>(src, dst, num_values, dtype);
    case DType::kIQ1_S: return dequant_blocks<dequant_iq1<DType::kIQ1_S>>(src, dst, num_values, dtype);
    case DType::kIQ1_M: return dequant_blocks<dequant_iq1<DType::kIQ1_M>>(src, dst, num_values, dtype);
    case DType::kTQ1_0: return dequant_blocks<dequant_tq<DType::kTQ1_0>>(src, dst, num_values, dtype);
    case DType::kTQ2_0: return dequant_blocks<dequant_tq<DType::kTQ2_0>>(src, dst, num_values, dtype);
  }
  INFERD_CHECK_MSG(false, "unknown dtype");
}

void dequantize_tensor_row(const TensorView& t, int64_t row, float* dst) {
  const int64_t n = t.row_length();
  dequantize_row(t.dtype, t.row(row), dst, n);
  if (t.row_scale != nullptr) {
    const float s = t.row_scale[row];
    for (int64_t i = 0; i < n; ++i) dst[i] *= s;
  }
}

}  // namespace inferd
