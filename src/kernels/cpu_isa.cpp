#include "kernels/cpu_isa.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "common/log.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace inferd {

std::string_view isa_name(Isa isa) {
  switch (isa) {
    case Isa::kScalar: return "scalar";
    case Isa::kAvx2: return "avx2";
    case Isa::kAvx512: return "avx512";
    case Isa::kVnni: return "vnni";
    case Isa::kAmx: return "amx";
  }
  return "unknown";
}

std::optional<Isa> parse_isa(std::string_view name) {
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512, Isa::kVnni, Isa::kAmx}) {
    if (name == isa_name(isa)) return isa;
  }
  return std::nullopt;
}

namespace {

#if defined(__x86_64__)
// Asks Linux for the AMX tile data state (XFEATURE_XTILEDATA = 18) for this process.
bool request_amx_permission() {
  constexpr long kArchReqXcompPerm = 0x1023;
  constexpr long kXfeatureXtileData = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtileData) == 0;
}
#endif

Isa detect() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  // __builtin_cpu_supports checks that the OS saves the wider registers (XCR0) too.
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  // F16C: CPUID.1:ECX bit 29 (not every compiler's __builtin_cpu_supports knows it).
  const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx >> 29 & 1u);
  if (!(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c)) return Isa::kScalar;
  if (!(__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")))
    return Isa::kAvx2;
  if (!__builtin_cpu_supports("avx512vnni")) return Isa::kAvx512;
  // CPUID.(7,0):EDX bit 24 AMX-TILE, bit 25 AMX-INT8. Tile use also needs the OS's permission
  // (Linux 5.16+: arch_prctl(ARCH_REQ_XCOMP_PERM, XTILEDATA), granted for the whole process);
  // without it the AMX path is not used.
  if (__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) && (edx >> 24 & 1u) && (edx >> 25 & 1u) &&
      request_amx_permission())
    return Isa::kAmx;
  return Isa::kVnni;
#else
  return Isa::kScalar;
#endif
}

Isa choose() {
  const Isa detected = detected_isa();
  const char* env = std::getenv("INFERD_ISA");
  if (env == nullptr || *env == '\0') return detected;
  const std::optional<Isa> wanted = parse_isa(env);
  if (!wanted) {
    log_warning(std::string("INFERD_ISA=") + env + " is not one of scalar|avx2|avx512|vnni|amx; using " +
                std::string(isa_name(detected)));
    return detected;
  }
  if (static_cast<int>(*wanted) > static_cast<int>(detected)) {
    log_warning(std::string("INFERD_ISA=") + env + " is beyond this CPU; using " +
                std::string(isa_name(detected)));
    return detected;
  }
  return *wanted;
}

}  // namespace

Isa detected_isa() {
  static const Isa isa = detect();
  return isa;
}

bool cpu_has_avx512_bf16() {
#if defined(__x86_64__)
  static const bool has = [] {
    __builtin_cpu_init();
    return static_cast<int>(detected_isa()) >= static_cast<int>(Isa::kAvx512) &&
           __builtin_cpu_supports("avx512bf16");
  }();
  return has;
#else
  return false;
#endif
}

bool cpu_splits_512bit_ops() {
#if defined(__x86_64__)
  static const bool splits = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (static_cast<int>(detected_isa()) < static_cast<int>(Isa::kAvx512) ||
        !__get_cpuid(0, &eax, &ebx, &ecx, &edx))
      return false;
    // "AuthenticAMD" in EBX, EDX, ECX; the family is CPUID.1:EAX's base family (bits 8..11)
    // plus its extended family (bits 20..27) where the base is 0xf.
    const bool amd = ebx == 0x68747541u && edx == 0x69746e65u && ecx == 0x444d4163u;
    if (!amd || !__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return false;
    const unsigned base = eax >> 8 & 0xfu;
    const unsigned family = base == 0xfu ? base + (eax >> 20 & 0xffu) : base;
    return family == 0x19u;
  }();
  return splits;
#else
  return false;
#endif
}

bool cpu_has_amx_bf16() {
#if defined(__x86_64__)
  static const bool has = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    // CPUID.(7,0):EDX bit 22 AMX-BF16; the tile permission was asked for with AMX-INT8.
    return detected_isa() == Isa::kAmx && __get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) && (edx >> 22 & 1u);
  }();
  return has;
#else
  return false;
#endif
}

namespace {
std::atomic<bool> g_amx_emulation{false};
}  // namespace

void set_amx_emulation(bool on) {
  g_amx_emulation.store(on, std::memory_order_relaxed);
}

bool amx_emulation() {
  return g_amx_emulation.load(std::memory_order_relaxed);
}

Isa highest_isa() {
  const Isa detected = detected_isa();
  if (amx_emulation() && static_cast<int>(detected) >= static_cast<int>(Isa::kVnni)) return Isa::kAmx;
  return detected;
}

Isa active_isa() {
  static const Isa isa = choose();
  return isa;
}

}  // namespace inferd
