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

// Whether the AMX path may use AMX-BF16 tiles (the CPU has them; implies detected_isa() == kAmx).
bool cpu_has_amx_bf16();

// The path kernels use: detected_isa(), lowered by INFERD_ISA when set (read once, at first use).
// A value above what the CPU has, or an unknown name, is reported once on stderr and ignored.
Isa active_isa();

}  // namespace inferd
