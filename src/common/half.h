// IEEE half (f16), bfloat16 and FP8 E4M3 conversions, bit-exact, with no ISA requirement.
// Used by the dequantizers (tensor/) and the KV cache.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>

namespace inferd {

// f16 bits -> f32, exact for every input (normals, subnormals, inf, NaN).
inline float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400u) == 0);
      mant &= 0x3ffu;
      bits = sign | (static_cast<uint32_t>(127 - 15 - e) << 23) | (mant << 13);
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  return std::bit_cast<float>(bits);
}

// f32 -> f16 bits, round to nearest even; overflow gives inf, NaN stays NaN.
inline uint16_t f32_to_f16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t abs = x & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);   // NaN
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to inf
  if (abs < 0x38800000u) {                                               // result is subnormal or zero
    // Shift the full significand (with implicit bit) to the subnormal position.
    const uint32_t exp = abs >> 23;
    if (exp < 102) return sign;  // below half the smallest subnormal
    const uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - exp;  // 14 + (113 - exp)
    uint32_t half = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1);
    const uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (half & 1u))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t r = abs - ((127 - 15) << 23);  // rebias exponent
  const uint32_t rem = r & 0x1fffu;
  uint32_t half = r >> 13;
  if (rem > 0x1000u || (rem == 0x1000u && (half & 1u))) ++half;
  return static_cast<uint16_t>(sign | half);
}

inline float bf16_to_f32(uint16_t b) {
  return std::bit_cast<float>(static_cast<uint32_t>(b) << 16);
}

// f32 -> bf16 bits, round to nearest even; NaN stays NaN.
inline uint16_t f32_to_bf16(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}

// FP8 E4M3 (OCP: 4 exponent bits with bias 7, 3 mantissa bits, no infinities, 0x7f / 0xff NaN,
// largest finite 448) -> f32, exact.
inline float fp8_e4m3_to_f32(uint8_t v) {
  const uint32_t sign = static_cast<uint32_t>(v & 0x80u) << 24;
  const uint32_t exp = (v >> 3) & 0x0fu;
  const uint32_t mant = v & 0x07u;
  if (exp == 0x0f && mant == 0x07) return std::bit_cast<float>(sign | 0x7fc00000u);
  if (exp == 0) {  // subnormal: mant * 2^-9
    const float mag = static_cast<float>(mant) * 0x1p-9f;
    return sign != 0 ? -mag : mag;
  }
  return std::bit_cast<float>(sign | ((exp + 127 - 7) << 23) | (mant << 20));
}

// An FP8 E4M3 byte's bits moved into an f16: the f16 is the E4M3 value times 2^-8, exactly for
// every finite value (subnormals too). The packed FP8 kernels expand weights this way.
inline uint16_t fp8_e4m3_as_f16_bits(uint8_t v) {
  return static_cast<uint16_t>(((v & 0x80u) << 8) | ((v & 0x7fu) << 7));
}

// f32 -> FP8 E4M3, round to nearest even, saturating to +-448 (as FP8 weight quantizers do);
// NaN gives 0x7f.
inline uint8_t f32_to_fp8_e4m3(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const auto sign = static_cast<uint8_t>((x >> 24) & 0x80u);
  const uint32_t abs = x & 0x7fffffffu;
  if (abs > 0x7f800000u) return 0x7f;
  if (abs >= 0x43e00000u) return static_cast<uint8_t>(sign | 0x7e);  // >= 448: saturate
  if (abs < 0x3c800000u) {  // below 2^-6, the smallest normal: a multiple of 2^-9, rounded
    const float scaled = std::bit_cast<float>(abs) * 512.0f;  // exact
    auto q = static_cast<uint32_t>(scaled);
    const float rem = scaled - static_cast<float>(q);
    if (rem > 0.5f || (rem == 0.5f && (q & 1u))) ++q;
    return static_cast<uint8_t>(sign | q);  // q == 8 is the smallest normal's code
  }
  // Normal: keep 3 of the 23 mantissa bits, rounding to nearest even; a carry moves the exponent
  // up, which the code's layout (exponent above mantissa) absorbs.
  uint32_t r = ((abs >> 23) - 127 + 7) << 3 | ((abs >> 20) & 7u);
  const uint32_t rem = abs & 0xfffffu;
  if (rem > 0x80000u || (rem == 0x80000u && (r & 1u))) ++r;
  if (r > 0x7e) r = 0x7e;
  return static_cast<uint8_t>(sign | r);
}

// Unaligned little-endian loads from raw file bytes.
inline uint16_t load_u16(const void* p) {
  uint16_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline uint32_t load_u32(const void* p) {
  uint32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline float load_f16(const void* p) {
  return f16_to_f32(load_u16(p));
}

}  // namespace inferd
