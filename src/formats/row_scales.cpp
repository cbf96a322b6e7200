#include "formats/row_scales.h"

#include <cmath>

#include "tensor/dequantize.h"

namespace inferd {

Status attach_row_scales(const std::string& source, std::vector<TensorView>& tensors,
                         const std::function<const TensorView*(const std::string&)>& find,
                         std::vector<std::vector<float>>* owned) {
  for (TensorView& t : tensors) {
    if (!dtype_has_row_scale(t.dtype)) continue;
    const std::string name = row_scale_name(t.name);
    const TensorView* s = find(name);
    if (s == nullptr) {
      return corrupt_file(source + ": tensor '" + t.name + "' (" + std::string(dtype_info(t.dtype).name) +
                          ") has no per-row scale tensor '" + name + "'");
    }
    if (s->dtype != DType::kF32 && s->dtype != DType::kF16 && s->dtype != DType::kBF16) {
      return corrupt_file(source + ": scale tensor '" + name + "' must be F32, F16 or BF16, not " +
                          std::string(dtype_info(s->dtype).name));
    }
    if (s->num_elements() != t.num_rows()) {
      return corrupt_file(source + ": scale tensor '" + name + "' has " + std::to_string(s->num_elements()) +
                          " values for " + std::to_string(t.num_rows()) + " rows of '" + t.name + "'");
    }
    std::vector<float> values(static_cast<size_t>(s->num_elements()));
    dequantize_row(s->dtype, s->data, values.data(), s->num_elements());
    for (float v : values) {
      if (!std::isfinite(v))
        return corrupt_file(source + ": scale tensor '" + name + "' holds a non-finite value");
    }
    if (t.dtype == DType::kF8_E4M3) {
      // E4M3's NaN codes (0x7f, 0xff) are not weights: reject them here, so that every kernel
      // sees only finite values.
      for (size_t i = 0; i < t.num_bytes; ++i) {
        if ((static_cast<uint8_t>(t.data[i]) & 0x7fu) == 0x7fu)
          return corrupt_file(source + ": tensor '" + t.name + "' holds an FP8 NaN code at byte " +
                              std::to_string(i));
      }
    }
    owned->push_back(std::move(values));
    t.row_scale = owned->back().data();
  }
  return Status::ok();
}

}  // namespace inferd
