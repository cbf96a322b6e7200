// A software model of the AMX tile unit (palette 1: eight tiles of up to 16 rows x 64 bytes) and
// of the instructions inferd's AMX kernels use, as the Intel SDM defines them. The kernels run
// against it when AMX emulation is on (set_amx_emulation, cpu_isa.h): tests then check the AMX
// kernels' data flow (tile shapes, operand layouts, the order of scaling) against the other paths
// on CPUs without AMX. It is a model of the results, not of the speed: no figure comes from it.
// Each thread has its own tile state, as each hardware thread has.
#pragma once

#include <cstdint>

namespace inferd {

// LDTILECFG's 64-byte operand (palette 1).
struct alignas(64) AmxTileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};
static_assert(sizeof(AmxTileConfig) == 64);

namespace amx_emulator {

// LDTILECFG: tiles 0..7 take config's shapes, and every tile is zeroed.
void configure(const AmxTileConfig& config);
// TILEZERO tmm[t].
void zero(int t);
// TILELOADD: row r of tmm[t] = colsb bytes at base + r * stride (the rest of the row zero).
void load(int t, const void* base, long stride);
// TILESTORED: colsb bytes of each of tmm[t]'s rows to base + r * stride.
void store(int t, void* base, long stride);
// TDPBSSD: c[m][n] += sum over k, i < 4 of int8 a[m][4k + i] * int8 b[k][4n + i] (int32 lanes).
void dpbssd(int c, int a, int b);
// TDPBF16PS: c[m][n] += a[m][2k + 1] * b[k][2n + 1], then += a[m][2k] * b[k][2n], for each k in
// turn (bf16 pairs; inputs' denormals read as zero, results' flushed to zero).
void dpbf16ps(int c, int a, int b);

}  // namespace amx_emulator
}  // namespace inferd
