// DType: the element formats a weight tensor can have, including GGUF's quantized blocks.
// Loaders map file types onto DType; kernels dispatch on it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace inferd {

enum class DType : uint8_t {
  kF32,
  kF16,
  kBF16,
  kQ4_0,
  kQ4_1,
  kQ5_0,
  kQ5_1,
  kQ8_0,
  kQ4_K,
  kQ5_K,
  kQ6_K,
};

struct DTypeInfo {
  std::string_view name;
  int64_t block_values;  // values per block (1 for plain floats)
  int64_t block_bytes;   // bytes per block
  uint32_t ggml_type;    // the type id GGUF files use
};

// Layout facts of `dtype`.
const DTypeInfo& dtype_info(DType dtype);

// The DType of a GGUF (ggml) type id, or nullopt when inferd does not support it.
std::optional<DType> dtype_from_ggml(uint32_t ggml_type);

// Bytes of `num_values` values; num_values must be a multiple of the block size.
inline int64_t dtype_bytes(DType dtype, int64_t num_values) {
  const DTypeInfo& info = dtype_info(dtype);
  return num_values / info.block_values * info.block_bytes;
}

}  // namespace inferd
