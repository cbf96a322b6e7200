// Parsing of memory sizes given by operators ("2GiB", "512MB", "1e9", or "0.25" of free RAM).
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"

namespace inferd {

// Bytes meant by `text`: an integer or decimal with an optional unit (B, KB, MB, GB, KiB, MiB,
// GiB, case-insensitive), or a fraction in (0, 1] of `available_bytes`.
Expected<int64_t> parse_byte_size(const std::string& text, int64_t available_bytes);

// MemAvailable from /proc/meminfo, in bytes (0 when unknown).
int64_t available_memory_bytes();

}  // namespace inferd
