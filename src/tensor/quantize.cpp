#include "tensor/quantize.h"

#include <algorithm>
#include <cmath>
#include <cstring>

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

}  // namespace

bool can_quantize_to(DType dtype) {
  switch (dtype) {
    case DType::kF32:
    case DType::kF16:
    case DType::kBF16:
    case DType::kQ8_0:
    case DType::kQ4_0:
    case DType::kQ4_1: return true;
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
  return std::nullopt;
}

void quantize_row(DType dtype, const float* src, std::byte* dst, int64_t n) {
  INFERD_CHECK(can_quantize_to(dtype) && n % dtype_info(dtype).block_values == 0);
  switch (dtype) {
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
