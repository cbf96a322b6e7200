#include "tensor/dtype.h"

#include <array>

namespace inferd {

namespace {
// One type per line:
// clang-format off
// Indexed by DType. Block layouts follow ggml's definitions (see docs/formats.md).
constexpr std::array<DTypeInfo, 28> kInfos = {{
    {"F32", 1, 4, 0},
    {"F16", 1, 2, 1},
    {"BF16", 1, 2, 30},
    {"Q4_0", 32, 18, 2},
    {"Q4_1", 32, 20, 3},
    {"Q5_0", 32, 22, 6},
    {"Q5_1", 32, 24, 7},
    {"Q8_0", 32, 34, 8},
    {"Q4_K", 256, 144, 12},
    {"Q5_K", 256, 176, 13},
    {"Q6_K", 256, 210, 14},
    {"I8", 1, 1, 24},
    {"F8_E4M3", 1, 1, 200},
    {"Q4_G128", 128, 68, 201},
    {"Q4_G64", 64, 36, 202},
    {"IQ4_NL", 32, 18, 20},
    {"IQ4_XS", 256, 136, 23},
    {"Q2_K", 256, 84, 10},
    {"Q3_K", 256, 110, 11},
    {"IQ3_XXS", 256, 98, 18},
    {"IQ3_S", 256, 110, 21},
    {"IQ2_S", 256, 82, 22},
    {"IQ2_XXS", 256, 66, 16},
    {"IQ2_XS", 256, 74, 17},
    {"IQ1_S", 256, 50, 19},
    {"IQ1_M", 256, 56, 29},
    {"TQ1_0", 256, 54, 34},
    {"TQ2_0", 256, 66, 35},
}};
// clang-format on
static_assert(kInfos.size() == static_cast<size_t>(DType::kLast) + 1);
}  // namespace

const DTypeInfo& dtype_info(DType dtype) {
  return kInfos[static_cast<size_t>(dtype)];
}

std::optional<DType> dtype_from_ggml(uint32_t ggml_type) {
  for (size_t i = 0; i < kInfos.size(); ++i) {
    if (kInfos[i].ggml_type == ggml_type) return static_cast<DType>(i);
  }
  return std::nullopt;
}

}  // namespace inferd
