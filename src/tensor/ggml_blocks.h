// Bit fields of ggml's K-quant, IQ4_XS, IQ3, IQ2, IQ1 and TQ blocks that more than one reader unpacks: the
// reference dequantizer (tensor/dequantize.cpp) and the packer of the integer kernels
// (kernels/packed_matmul.cpp). Layouts as ggml defines them (docs/formats.md).
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>

#include "tensor/dtype.h"
#include "tensor/iq_grids.h"

namespace inferd {

// Q4_K / Q5_K: the 6-bit scale and min of sub-block j (0..7), packed into 12 bytes.
inline void k_scale_min(int j, const uint8_t* scales, uint8_t* scale, uint8_t* min) {
  if (j < 4) {
    *scale = scales[j] & 63;
    *min = scales[j + 4] & 63;
  } else {
    *scale = static_cast<uint8_t>((scales[j + 4] & 0x0f) | ((scales[j - 4] >> 6) << 4));
    *min = static_cast<uint8_t>((scales[j + 4] >> 4) | ((scales[j] >> 6) << 4));
  }
}

// Q2_K / Q3_K: the low 2 bits of value v (0..255) from the block's qs[64]: bits 2s of
// qs[32h + l] for v = 128h + 32s + l.
inline int k_low2(const uint8_t* qs, int v) {
  return (qs[32 * (v / 128) + v % 32] >> (2 * ((v % 128) / 32))) & 3;
}

// The same for the 32 values 32j.. (j 0..7) of a block at once: one byte run and one shift.
inline void k_low2_block(const uint8_t* qs, int j, uint8_t* q) {
  const uint8_t* low = qs + 32 * (j / 4);
  const int shift = 2 * (j % 4);
  for (int l = 0; l < 32; ++l) q[l] = static_cast<uint8_t>((low[l] >> shift) & 3);
}

// Q3_K: the scale of sub-block i (0..15) from the block's 12 scale bytes, -32..31: the nibble
// i % 8 of bytes 0..7 (low for i < 8), with bits 2 (i / 4) of byte 8 + i % 4 above it, minus 32.
inline int q3_k_scale(const uint8_t* scales, int i) {
  const int low = (scales[i % 8] >> (i < 8 ? 0 : 4)) & 0x0f;
  return (low | (((scales[8 + i % 4] >> (2 * (i / 4))) & 3) << 4)) - 32;
}

// IQ4_XS: the 6-bit scale ls (0..63) of block ib (0..7), from the block's u16 scales_h and
// u8 scales_l[4]; the block's scale is d * (ls - 32).
inline int iq4_xs_scale(uint32_t scales_h, const uint8_t* scales_l, int ib) {
  return ((scales_l[ib / 2] >> (4 * (ib % 2))) & 0x0f) | (((scales_h >> (2 * ib)) & 3) << 4);
}

// IQ3_XXS, IQ2_XXS, IQ2_XS: the 8 signs of 8 values (bit j set: value j negative) from a 7-bit
// field (its low 7 bits), the eighth sign making the count of minus signs even.
inline uint32_t even_signs(uint32_t field) {
  const uint32_t seven = field & 127;
  // The parity by folding: std::popcount is a library call where the baseline ISA has no popcnt,
  // and the packer takes this for every 8 values of a model.
  uint32_t parity = seven ^ (seven >> 4);
  parity ^= parity >> 2;
  parity ^= parity >> 1;
  return seven | ((parity & 1) << 7);
}

// Byte j (0..7) of the result: the 2-bit field j of `crumbs` (bits 2j, 2j + 1). Bit moves
// within one word (the packer takes this for every 8 values of a model).
inline uint64_t spread_crumbs(uint32_t crumbs) {
  uint64_t t = (crumbs & 0xffu) | (static_cast<uint64_t>(crumbs & 0xff00u) << 24);  // 4 to each half
  t = (t & 0x0000000f0000000full) | ((t & 0x000000f0000000f0ull) << 12);            // 2 to each quarter
  return (t & 0x0003000300030003ull) | ((t & 0x000c000c000c000cull) << 6);          // 1 to each byte
}

// Byte j (0..7) of the result: bit j of `bits` (0 or 1).
inline uint64_t spread_bits(uint32_t bits) {
  const uint64_t t = ((bits & 0xffu) * 0x0101010101010101ull) & 0x8040201008040201ull;  // bit j in byte j
  return ((t + 0x7f7f7f7f7f7f7f7full) >> 7) & 0x0101010101010101ull;                    // a byte != 0 to 1
}

// The word helpers above give byte j as the j-th byte in memory.
static_assert(std::endian::native == std::endian::little);

// Bytes 0..3 of the result: the 3-bit levels of an IQ3 grid point (bits 4j..4j+2 of `point`).
inline uint32_t spread_levels3(uint16_t point) {
  const uint32_t t = (point & 0xffu) | (static_cast<uint32_t>(point & 0xff00u) << 8);  // 2 to each half
  return ((t & 0x000f000fu) | ((t & 0x00f000f0u) << 4)) & 0x07070707u;                 // 1 to each byte
}

// The 8 codes sign << 3 | level of two IQ3 grid points (4 values each) and their 8 signs.
inline void iq3_points_codes(uint16_t first, uint16_t second, uint32_t signs, uint8_t* codes) {
  const uint64_t c = (spread_levels3(first) | static_cast<uint64_t>(spread_levels3(second)) << 32) |
                     (spread_bits(signs) << 3);
  std::memcpy(codes, &c, 8);
}

// IQ3_XXS and IQ3_S: block ib (0..7) of a superblock, its 32 values as 4-bit codes
// code = sign << 3 | level (value = -+Levels[level], kIq3XxsLevels or kIq3sLevels), and the
// block's odd scale multiplier m = 2s + 1 (1..31): the block's scale is d * m / 4 (IQ3_XXS) or
// d * m (IQ3_S).
//
// IQ3_XXS { f16 d; u8 qs[64]; u32 aux[8] }: the block's points are qs[8ib..8ib+7]; aux[ib] holds
// four 7-bit sign fields (one per 8 values, low first; the eighth sign makes the count of minus
// signs even) and s in its top 4 bits.
inline int iq3_xxs_block(const uint8_t* b, int ib, uint8_t* codes) {
  uint32_t aux;
  std::memcpy(&aux, b + 2 + 64 + 4 * ib, 4);
  for (int l = 0; l < 4; ++l) {
    iq3_points_codes(kIq3XxsGrid[b[2 + 8 * ib + 2 * l]], kIq3XxsGrid[b[2 + 8 * ib + 2 * l + 1]],
                     even_signs(aux >> (7 * l)), codes + 8 * l);
  }
  return 2 * static_cast<int>(aux >> 28) + 1;
}

// IQ3_S { f16 d; u8 qs[64]; u8 qh[8]; u8 signs[32]; u8 scales[4] }: point i (of 64) has the
// 9-bit index qs[i] | bit i % 8 of qh[i / 8] << 8; value v's sign is bit v % 8 of signs[v / 8];
// block ib's s is nibble ib % 2 of scales[ib / 2].
inline int iq3_s_block(const uint8_t* b, int ib, uint8_t* codes) {
  const uint8_t* qs = b + 2;
  const uint8_t* qh = b + 66;
  const uint8_t* signs = b + 74;
  auto point = [&](int i) { return kIq3sGrid[qs[8 * ib + i] | (((qh[ib] >> i) & 1) << 8)]; };
  for (int k = 0; k < 4; ++k)  // points 2k, 2k + 1: values 8k..8k+7 of the block
    iq3_points_codes(point(2 * k), point(2 * k + 1), signs[4 * ib + k], codes + 8 * k);
  return 2 * ((b[106 + ib / 2] >> (4 * (ib % 2))) & 0x0f) + 1;
}

// The 8 codes sign << 3 | level of an IQ2 grid point and its 8 signs (bit j: value j).
inline void iq2_point_codes(uint16_t point, uint32_t signs, uint8_t* codes) {
  const uint64_t c = spread_crumbs(point) | (spread_bits(signs) << 3);
  std::memcpy(codes, &c, 8);
}

// IQ2_S { f16 d; u8 qs[32]; u8 signs[32]; u8 qh[8]; u8 scales[8] }: block ib (0..7) of 32 values
// as codes sign << 3 | level (value = -+kIq2sLevels[level]), and the odd multipliers m = 2s + 1
// of its two halves of 16 (scale d * m / 8). Point l (0..3) of the block, values 8l..8l+7, has
// the 10-bit index qs[4ib + l] | bits 2l, 2l + 1 of qh[ib] << 8; value v's sign is bit v % 8 of
// signs[4ib + v / 8]; the halves' s are the nibbles of scales[ib], low first.
inline void iq2_s_block(const uint8_t* b, int ib, uint8_t* codes, int* m) {
  const uint8_t* qs = b + 2;
  const uint8_t* signs = b + 34;
  const uint8_t* qh = b + 66;
  for (int l = 0; l < 4; ++l) {
    const uint16_t point = kIq2sGrid[qs[4 * ib + l] | (((qh[ib] >> (2 * l)) & 3) << 8)];
    iq2_point_codes(point, signs[4 * ib + l], codes + 8 * l);
  }
  m[0] = 2 * (b[74 + ib] & 0x0f) + 1;
  m[1] = 2 * (b[74 + ib] >> 4) + 1;
}

// The three IQ2 grids share their levels: their codes all index kIq2sLevels.
static_assert(kIq2XxsLevels[0] == kIq2sLevels[0] && kIq2XxsLevels[1] == kIq2sLevels[1] &&
              kIq2XxsLevels[2] == kIq2sLevels[2] && kIq2XsLevels[0] == kIq2sLevels[0] &&
              kIq2XsLevels[1] == kIq2sLevels[1] && kIq2XsLevels[2] == kIq2sLevels[2]);

// IQ2_XXS { f16 d; u16 qs[32] }: block ib (0..7) of 32 values as the codes of iq2_s_block and
// the block's m = 2s + 1 (scale d * m / 8). Its 8 bytes at 2 + 8ib are 4 u8 indices into
// kIq2XxsGrid (values 8l..8l+7) and a u32 of four 7-bit sign fields (even_signs), s in its top 4 bits.
inline int iq2_xxs_block(const uint8_t* b, int ib, uint8_t* codes) {
  const uint8_t* q = b + 2 + 8 * ib;
  uint32_t aux;
  std::memcpy(&aux, q + 4, 4);
  for (int l = 0; l < 4; ++l) iq2_point_codes(kIq2XxsGrid[q[l]], even_signs(aux >> (7 * l)), codes + 8 * l);
  return 2 * static_cast<int>(aux >> 28) + 1;
}

// IQ2_XS { f16 d; u16 qs[32]; u8 scales[8] }: block ib (0..7) as iq2_s_block's codes and halves'
// multipliers. qs[4ib + l] (values 8l..8l+7) is a 9-bit index into kIq2XsGrid with a 7-bit sign
// field above it (even_signs); the halves' s are the nibbles of scales[ib], low first.
inline void iq2_xs_block(const uint8_t* b, int ib, uint8_t* codes, int* m) {
  for (int l = 0; l < 4; ++l) {
    uint16_t q;
    std::memcpy(&q, b + 2 + 2 * (4 * ib + l), 2);
    iq2_point_codes(kIq2XsGrid[q & 511], even_signs(q >> 9u), codes + 8 * l);
  }
  m[0] = 2 * (b[66 + ib] & 0x0f) + 1;
  m[1] = 2 * (b[66 + ib] >> 4) + 1;
}

// IQ1_S and IQ1_M: block ib (0..7) of 32 values as codes minus << 3 | level, value
// d * m * (kIq1sLevels[level] -+ 1/8) (minus: the delta is -1/8), and the block's m = 2s + 1
// (IQ1_M: its halves' two). A point's 8 codes share the point's delta.
inline void iq1_point_codes(uint16_t point, bool minus, uint8_t* codes) {
  const uint64_t c = spread_crumbs(point) | (minus ? 0x0808080808080808ull : 0);
  std::memcpy(codes, &c, 8);
}

// IQ1_S { f16 d; u8 qs[32]; u16 qh[8] }: point l (0..3) of block ib has the 11-bit index
// qs[4ib + l] | bits 3l..3l+2 of qh[ib] << 8; qh[ib] holds s in bits 12..14, the delta's sign in 15.
inline int iq1_s_block(const uint8_t* b, int ib, uint8_t* codes) {
  uint16_t qh;
  std::memcpy(&qh, b + 34 + 2 * ib, 2);
  const bool minus = (qh & 0x8000) != 0;
  for (int l = 0; l < 4; ++l)
    iq1_point_codes(kIq1sGrid[b[2 + 4 * ib + l] | (((qh >> (3 * l)) & 7) << 8)], minus, codes + 8 * l);
  return 2 * ((qh >> 12) & 7) + 1;
}

// IQ1_M { u8 qs[32]; u8 qh[16]; u16 scales[4] }: point p (0..31) has the 11-bit index
// qs[p] | (nibble p % 2 of qh[p / 2] & 7) << 8, the nibble's bit 3 its delta's sign; the 3-bit s
// of half h (0..15) is bits 3(h % 4).. of scales[h / 4].
inline void iq1_m_block(const uint8_t* b, int ib, uint8_t* codes, int* m) {
  for (int l = 0; l < 4; ++l) {
    const int p = 4 * ib + l;
    const int nibble = (b[32 + p / 2] >> (4 * (p % 2))) & 0x0f;
    iq1_point_codes(kIq1sGrid[b[p] | ((nibble & 7) << 8)], (nibble & 8) != 0, codes + 8 * l);
  }
  for (int half = 0; half < 2; ++half) {
    const int h = 2 * ib + half;
    uint16_t sc;
    std::memcpy(&sc, b + 48 + 2 * (h / 4), 2);
    m[half] = 2 * ((sc >> (3 * (h % 4))) & 7) + 1;
  }
}

// IQ1_M's f16 d: the top nibbles of its four u16 scales, the first one lowest.
inline uint16_t iq1_m_d16(const uint8_t* b) {
  uint16_t d = 0;
  for (int i = 0; i < 4; ++i) {
    uint16_t sc;
    std::memcpy(&sc, b + 48 + 2 * i, 2);
    d = static_cast<uint16_t>(d | ((sc >> 12) << (4 * i)));
  }
  return d;
}

// The 3-bit-code grid types (IQ2_S, IQ2_XS, IQ2_XXS, IQ1_S, IQ1_M): block ib (0..7) of the
// superblock at b as codes minus << 3 | level (the value's sign; IQ1: its delta's) and the
// multipliers m of its two halves of 16 (equal where the type has one per block); returns the
// superblock's f16 d.
inline uint16_t low_bit_grid_block(DType dtype, const uint8_t* b, int ib, uint8_t* codes, int* m) {
  switch (dtype) {
    case DType::kIQ2_XXS: m[0] = m[1] = iq2_xxs_block(b, ib, codes); break;
    case DType::kIQ1_S: m[0] = m[1] = iq1_s_block(b, ib, codes); break;
    case DType::kIQ2_S: iq2_s_block(b, ib, codes, m); break;
    case DType::kIQ2_XS: iq2_xs_block(b, ib, codes, m); break;
    default: iq1_m_block(b, ib, codes, m); return iq1_m_d16(b);
  }
  uint16_t d;
  std::memcpy(&d, b, 2);
  return d;
}

// TQ1_0 { u8 qs[48]; u8 qh[4]; f16 d }: the q (0..2) of value v (0..255). A byte holds 5 (qh: 4)
// base-3 digits as a fixed-point fraction: digit k is the top of (byte * 3^k mod 256) * 3, i.e.
// ((u8)(byte * 3^k) * 3) >> 8. Values 32k + l (v < 160) are digit k of qs[l]; 160 + 16k + l
// digit k of qs[32 + l]; 240 + 4k + l digit k of qh[l].
inline int tq1_0_digit(uint8_t byte, int k) {
  static constexpr uint8_t kPow3[5] = {1, 3, 9, 27, 81};
  return (static_cast<uint8_t>(byte * kPow3[k]) * 3) >> 8;
}
inline int tq1_0_q(const uint8_t* b, int v) {
  uint8_t byte;
  int k;
  if (v < 160) {
    byte = b[v % 32];
    k = v / 32;
  } else if (v < 240) {
    byte = b[32 + (v - 160) % 16];
    k = (v - 160) / 16;
  } else {
    byte = b[48 + (v - 240) % 4];
    k = (v - 240) / 4;
  }
  return tq1_0_digit(byte, k);
}

// TQ2_0 { u8 qs[64]; f16 d }: the 2-bit q of value v (0..255), as Q2_K's (k_low2).
inline int tq2_0_q(const uint8_t* b, int v) {
  return k_low2(b, v);
}

}  // namespace inferd
