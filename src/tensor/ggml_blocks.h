// Bit fields of ggml's K-quant and IQ4_XS blocks that more than one reader unpacks: the
// reference dequantizer (tensor/dequantize.cpp) and the packer of the integer kernels
// (kernels/packed_matmul.cpp). Layouts as ggml defines them (docs/formats.md).
#pragma once

#include <cstdint>

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

}  // namespace inferd
