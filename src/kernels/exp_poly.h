// exp_poly: the scalar mirror of exp_avx512 (kernels/simd.h). Every operation is one the vector
// version performs the same way (fma, round to nearest even, exact scaling by 2^n), so both give
// the same bits: a kernel's scalar path and its vector path agree exactly.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace inferd {

// e^x, x clamped to [-87, 88]; about 2 ulp.
__attribute__((always_inline)) inline float exp_poly(float x) {
  x = std::min(std::max(x, -87.0f), 88.0f);
  const float n = std::nearbyint(x * 1.44269504088896341f);
  float r = std::fma(-n, 0.693359375f, x);
  r = std::fma(-n, -2.12194440e-4f, r);
  float p = 1.9875691500e-4f;
  p = std::fma(p, r, 1.3981999507e-3f);
  p = std::fma(p, r, 8.3333519073e-3f);
  p = std::fma(p, r, 4.1665795894e-2f);
  p = std::fma(p, r, 1.6666665459e-1f);
  p = std::fma(p, r, 5.0000001201e-1f);
  p = std::fma(p, r * r, r + 1.0f);
  // p * 2^n, exact: n is in [-126, 127] after the clamp, so 2^n is a normal float.
  const uint32_t bits = static_cast<uint32_t>(static_cast<int32_t>(n) + 127) << 23;
  float pow2;
  std::memcpy(&pow2, &bits, 4);
  return p * pow2;
}

}  // namespace inferd
