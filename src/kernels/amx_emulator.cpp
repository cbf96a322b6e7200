#include "kernels/amx_emulator.h"

#include <bit>
#include <cmath>
#include <cstring>

#include "common/check.h"

namespace inferd::amx_emulator {

namespace {

constexpr int kTiles = 8;
constexpr int kMaxRows = 16;
constexpr int kMaxColsb = 64;

struct TileUnit {
  uint8_t rows[kTiles] = {};
  uint16_t colsb[kTiles] = {};
  alignas(64) uint8_t data[kTiles][kMaxRows][kMaxColsb] = {};
};

thread_local TileUnit t_unit;

// A configured tile (the hardware raises #UD for an unconfigured one).
void check_tile(int t) {
  INFERD_CHECK(t >= 0 && t < kTiles);
  INFERD_CHECK(t_unit.rows[t] > 0 && t_unit.colsb[t] > 0);
}

int32_t dword(int t, int row, int col) {
  int32_t v = 0;
  std::memcpy(&v, &t_unit.data[t][row][4 * col], sizeof(v));
  return v;
}

void set_dword(int t, int row, int col, int32_t v) {
  std::memcpy(&t_unit.data[t][row][4 * col], &v, sizeof(v));
}

// A bf16 element as f32, denormals read as zero.
float bf16_daz(int t, int row, int element) {
  uint16_t bits = 0;
  std::memcpy(&bits, &t_unit.data[t][row][2 * element], sizeof(bits));
  if ((bits & 0x7f80u) == 0) bits &= 0x8000u;
  return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16);
}

// A dot product's shape (C m x n dwords, A m x k dwords, B k x n dwords), checked as the
// instructions require it.
struct DotShape {
  int m_rows, n, k;
};
DotShape dot_shape(int c, int a, int b) {
  check_tile(c);
  check_tile(a);
  check_tile(b);
  const DotShape d{t_unit.rows[c], t_unit.colsb[c] / 4, t_unit.colsb[a] / 4};
  INFERD_CHECK(t_unit.rows[a] == d.m_rows && t_unit.rows[b] == d.k && t_unit.colsb[b] == t_unit.colsb[c]);
  return d;
}

float flush_denormal(float v) {
  return std::fpclassify(v) == FP_SUBNORMAL ? std::copysign(0.0f, v) : v;
}

}  // namespace

void configure(const AmxTileConfig& config) {
  INFERD_CHECK(config.palette == 1);
  for (int t = 0; t < kTiles; ++t) {
    INFERD_CHECK(config.rows[t] <= kMaxRows && config.colsb[t] <= kMaxColsb);
    t_unit.rows[t] = config.rows[t];
    t_unit.colsb[t] = config.colsb[t];
  }
  std::memset(t_unit.data, 0, sizeof(t_unit.data));
}

void zero(int t) {
  check_tile(t);
  std::memset(t_unit.data[t], 0, sizeof(t_unit.data[t]));
}

void load(int t, const void* base, long stride) {
  check_tile(t);
  std::memset(t_unit.data[t], 0, sizeof(t_unit.data[t]));
  const auto* src = static_cast<const uint8_t*>(base);
  for (int r = 0; r < t_unit.rows[t]; ++r) std::memcpy(t_unit.data[t][r], src + r * stride, t_unit.colsb[t]);
}

void store(int t, void* base, long stride) {
  check_tile(t);
  auto* dst = static_cast<uint8_t*>(base);
  for (int r = 0; r < t_unit.rows[t]; ++r) std::memcpy(dst + r * stride, t_unit.data[t][r], t_unit.colsb[t]);
}

void dpbssd(int c, int a, int b) {
  const auto [m_rows, n, k] = dot_shape(c, a, b);
  for (int m = 0; m < m_rows; ++m) {
    for (int j = 0; j < n; ++j) {
      // int32 lanes wrap, as the hardware's do (uint32 arithmetic, then back).
      auto sum = static_cast<uint32_t>(dword(c, m, j));
      for (int kk = 0; kk < k; ++kk)
        for (int i = 0; i < 4; ++i)
          sum += static_cast<uint32_t>(static_cast<int8_t>(t_unit.data[a][m][4 * kk + i]) *
                                       static_cast<int8_t>(t_unit.data[b][kk][4 * j + i]));
      set_dword(c, m, j, static_cast<int32_t>(sum));
    }
  }
}

void dpbf16ps(int c, int a, int b) {
  const auto [m_rows, n, k] = dot_shape(c, a, b);
  for (int m = 0; m < m_rows; ++m) {
    for (int j = 0; j < n; ++j) {
      // The even and odd elements of the pairs each summed over k with fmas (the products of two
      // bf16 values are exact in f32), then added to the destination.
      float even = 0.0f, odd = 0.0f;
      for (int kk = 0; kk < k; ++kk) {
        even = flush_denormal(std::fma(bf16_daz(a, m, 2 * kk), bf16_daz(b, kk, 2 * j), even));
        odd = flush_denormal(std::fma(bf16_daz(a, m, 2 * kk + 1), bf16_daz(b, kk, 2 * j + 1), odd));
      }
      const float acc = std::bit_cast<float>(dword(c, m, j));
      set_dword(c, m, j, std::bit_cast<int32_t>(flush_denormal(acc + flush_denormal(even + odd))));
    }
  }
}

}  // namespace inferd::amx_emulator
