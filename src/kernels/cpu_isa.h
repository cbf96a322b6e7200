// Run-time CPU dispatch: which instruction-set path the kernels take on this machine.
// Kernels are compiled for every path (function-level target attributes) and chosen at run time,
// so one binary runs on any x86-64 and uses AVX-512 / VNNI / AMX where the CPU has them.
// INFERD_ISA=scalar|avx2|avx512|vnni|amx lowers the path for testing (never above what the CPU has).
#pragma once

#include <optional>
#include <string_view>

namespace inferd {

// Ordered: each level implies the ones below it.
enum class Isa : int { kScalar = 0, kAvx2 = 1, kAvx512 = 2, kVnni = 3, kAmx = 4 };

std::string_view isa_name(Isa isa);
std::optional<Isa> parse_isa(std::string_view name);

// The best path this CPU (and OS) supports.
Isa detected_isa();

// Whether the CPU has AVX512-BF16 (vdpbf16ps): the BF16 float kernels use it on the vnni path
// and above, and compute the same sums with fmas elsewhere.
bool cpu_has_avx512_bf16();

// Whether the CPU runs a 512-bit vector instruction as two 256-bit halves, so that it retires
// one 512-bit fma per cycle where Zen 5 and the Xeons retire two: AMD's family 0x19 (Zen 4, the
// only one of that family with AVX-512). The float prefill kernels pick their register blocking
// by it (packed_matmul.h, FloatBlocking).
bool cpu_splits_512bit_ops();
// Whether the AMX path may use AMX-BF16 tiles (the CPU has them; implies detected_isa() == kAmx).
bool cpu_has_amx_bf16();

// Tests only (off by default, never set by the product): while on, the AMX path (Isa::kAmx
// passed to the matmuls or to make_backend) runs its tile instructions on a software model of
// the tile unit (kernels/amx_emulator.h) instead of the CPU's, so the AMX kernels' data flow is
// checked on CPUs without AMX. The path is then offered where the CPU has the VNNI path (the
// kernels' scaling is AVX-512 code), AMX-BF16 included. Set it from one thread, with no matmul
// running.
void set_amx_emulation(bool on);
bool amx_emulation();

// The highest path a backend may be asked for: detected_isa(), or kAmx while AMX is emulated on a
// CPU with the VNNI path.
Isa highest_isa();

// The path kernels use: detected_isa(), lowered by INFERD_ISA when set (read once, at first use).
// A value above what the CPU has, or an unknown name, is reported once on stderr and ignored.
Isa active_isa();

}  // namespace inferd
