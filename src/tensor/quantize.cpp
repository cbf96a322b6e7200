#include "tensor/quantize.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "common/check.h"
#include "common/half.h"

namespace inferd {

namespace {

void put_u16(std::byte* p, uint16_t v) {
  std::memcpy(p, &v, 2);
}

void quantize_q8_0(const float* x, std::byte* y) {
  float amax = 0.0f;
  for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  put_u16(y, f32_to_f16(d));
  for (int j = 0; j < 32; ++j) y[2 + j] = static_cast<std::byte>(static_cast<int8_t>(std::round(x[j] * id)));
}

void quantize_q4_0(const float* x, std::byte* y) {
  float amax = 0.0f, max = 0.0f;
  for (int j = 0; j < 32; ++j) {
    if (std::fabs(x[j]) > amax) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  const float d = max / -8.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  put_u16(y, f32_to_f16(d));
  for (int j = 0; j < 16; ++j) {
    const auto lo =
        static_cast<uint8_t>(std::min(15, static_cast<int>(static_cast<int8_t>(x[j] * id + 8.5f))));
    const auto hi =
        static_cast<uint8_t>(std::min(15, static_cast<int>(static_cast<int8_t>(x[j + 16] * id + 8.5f))));
    y[2 + j] = static_cast<std::byte>(lo | (hi << 4));
  }
}

void quantize_q4_1(const float* x, std::byte* y) {
  float min = x[0], max = x[0];
  for (int j = 1; j < 32; ++j) {
    min = std::min(min, x[j]);
    max = std::max(max, x[j]);
  }
  const float d = (max - min) / 15.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  put_u16(y, f32_to_f16(d));
  put_u16(y + 2, f32_to_f16(min));
  for (int j = 0; j < 16; ++j) {
    const auto lo =
        static_cast<uint8_t>(std::min(15, static_cast<int>(static_cast<int8_t>((x[j] - min) * id + 0.5f))));
    const auto hi = static_cast<uint8_t>(
        std::min(15, static_cast<int>(static_cast<int8_t>((x[j + 16] - min) * id + 0.5f))));
    y[4 + j] = static_cast<std::byte>(lo | (hi << 4));
  }
}

// Q4_G128 / Q4_G64: the (d, m) of a group minimising the squared error of the stored values, with
// d and m as their f16 values. Candidates: the group's plain [min, max] grid (d = range / 15,
// m = min), and 21 least-squares fits: codes rounded on a grid of inverse step (14 + 0.1 i) /
// range (i = 0..20: shrunk to stretched), then the (d, m) minimising the error for those codes.
// Each candidate's (d, m) is rounded to f16 and the codes re-rounded for it; the smallest error
// wins (so never worse than the plain min / max grid).
template <int n>
void quantize_q4_group(const float* x, std::byte* y) {
  float lo = x[0], hi = x[0];
  for (int j = 1; j < n; ++j) {
    lo = std::min(lo, x[j]);
    hi = std::max(hi, x[j]);
  }
  uint8_t best_q[n] = {};
  uint16_t best_d = 0, best_m = f32_to_f16(lo);
  float best_err = std::numeric_limits<float>::infinity();
  uint8_t q[n];
  // Codes for (d16, m16) and their squared error; keeps them when best so far.
  auto try_candidate = [&](double d, double m) {
    const uint16_t d16 = f32_to_f16(static_cast<float>(d)), m16 = f32_to_f16(static_cast<float>(m));
    const float df = f16_to_f32(d16), mf = f16_to_f32(m16);
    if (!(df > 0) || !std::isfinite(df) || !std::isfinite(mf)) return;
    float err = 0;
    for (int j = 0; j < n; ++j) {
      const float v = std::nearbyint((x[j] - mf) / df);
      const auto l = static_cast<uint8_t>(std::min(15.0f, std::max(0.0f, v)));
      q[j] = l;
      const float e = static_cast<float>(l) * df + mf - x[j];
      err += e * e;
    }
    if (err < best_err) {
      best_err = err;
      best_d = d16;
      best_m = m16;
      std::memcpy(best_q, q, n);
    }
  };
  if (hi > lo) {
    try_candidate((static_cast<double>(hi) - lo) / 15.0, lo);
    for (int step = 0; step <= 20; ++step) {
      const float iscale = (14.0f + 0.1f * static_cast<float>(step)) / (hi - lo);
      double sl = 0, sl2 = 0, sx = 0, sxl = 0;
      for (int j = 0; j < n; ++j) {
        const float v = std::nearbyint(iscale * (x[j] - lo));
        const int l = static_cast<int>(std::min(15.0f, std::max(0.0f, v)));
        sl += l;
        sl2 += l * l;
        sx += x[j];
        sxl += static_cast<double>(x[j]) * l;
      }
      const double det = n * sl2 - sl * sl;
      if (det <= 0) continue;
      const double d = (n * sxl - sl * sx) / det;
      if (d > 0) try_candidate(d, (sl2 * sx - sl * sxl) / det);
    }
  }
  put_u16(y, best_d);
  put_u16(y + 2, best_m);
  for (int j = 0; j < n / 2; ++j) y[4 + j] = static_cast<std::byte>(best_q[j] | (best_q[j + n / 2] << 4));
}

}  // namespace

bool can_quantize_to(DType dtype) {
  switch (dtype) {
    case DType::kF32:
    case DType::kF16:
    case DType::kBF16:
    case DType::kQ8_0:
    case DType::kQ4_0:
    case DType::kQ4_1:
    case DType::kI8:
    case DType::kF8_E4M3:
    case DType::kQ4_G128:
    case DType::kQ4_G64: return true;
    default: return false;
  }
}

std::optional<DType> quantize_target(std::string_view name) {
  if (name == "f32") return DType::kF32;
  if (name == "f16") return DType::kF16;
  if (name == "bf16") return DType::kBF16;
  if (name == "q8_0") return DType::kQ8_0;
  if (name == "q4_0") return DType::kQ4_0;
  if (name == "q4_1") return DType::kQ4_1;
  if (name == "int8") return DType::kI8;
  if (name == "fp8") return DType::kF8_E4M3;
  if (name == "int4") return DType::kQ4_G128;
  return std::nullopt;
}

void quantize_row(DType dtype, const float* src, std::byte* dst, int64_t n, float* row_scale) {
  INFERD_CHECK(can_quantize_to(dtype) && n % dtype_info(dtype).block_values == 0);
  INFERD_CHECK(!dtype_has_row_scale(dtype) || row_scale != nullptr);
  switch (dtype) {
    case DType::kI8:
    case DType::kF8_E4M3: {
      const bool fp8 = dtype == DType::kF8_E4M3;
      float amax = 0.0f;
      for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(src[i]));
      const float s = amax / (fp8 ? 448.0f : 127.0f);
      *row_scale = s;
      for (int64_t i = 0; i < n; ++i) {
        const float v = s != 0.0f ? src[i] / s : 0.0f;
        dst[i] = static_cast<std::byte>(fp8 ? f32_to_fp8_e4m3(v)
                                            : static_cast<uint8_t>(static_cast<int8_t>(std::nearbyint(v))));
      }
      return;
    }
    case DType::kQ4_G128:
      for (int64_t b = 0; b < n / 128; ++b) quantize_q4_group<128>(src + 128 * b, dst + 68 * b);
      return;
    case DType::kQ4_G64:
      for (int64_t b = 0; b < n / 64; ++b) quantize_q4_group<64>(src + 64 * b, dst + 36 * b);
      return;
    case DType::kF32: std::memcpy(dst, src, static_cast<size_t>(n) * 4); return;
    case DType::kF16:
      for (int64_t i = 0; i < n; ++i) put_u16(dst + 2 * i, f32_to_f16(src[i]));
      return;
    case DType::kBF16:
      for (int64_t i = 0; i < n; ++i) put_u16(dst + 2 * i, f32_to_bf16(src[i]));
      return;
    case DType::kQ8_0:
      for (int64_t b = 0; b < n / 32; ++b) quantize_q8_0(src + 32 * b, dst + 34 * b);
      return;
    case DType::kQ4_0:
      for (int64_t b = 0; b < n / 32; ++b) quantize_q4_0(src + 32 * b, dst + 18 * b);
      return;
    case DType::kQ4_1:
      for (int64_t b = 0; b < n / 32; ++b) quantize_q4_1(src + 32 * b, dst + 20 * b);
      return;
    default: return;
  }
}

}  // namespace inferd
