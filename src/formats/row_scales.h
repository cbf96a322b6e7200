// Per-row scales of the row-scaled weight formats (I8, F8_E4M3): a tensor "W" of such a type comes
// with a tensor "W_scale" of one value per row (as compressed-tensors names its "weight_scale").
// GGUF and safetensors files attach them to their views when they open.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "common/status.h"
#include "tensor/tensor_view.h"

namespace inferd {

// The companion tensor's name for `name`.
inline std::string row_scale_name(const std::string& name) {
  return name + "_scale";
}

// For each view of a row-scaled dtype in `tensors`: finds its "_scale" tensor through `find`,
// checks it holds one finite value per row (F32, F16 or BF16, any shape of that many values),
// copies it as f32 into `owned` and points the view's row_scale at it. F8_E4M3 tensors must hold
// no NaN code. Errors name `source`, the tensor and the problem (missing, wrong count or type,
// not finite).
Status attach_row_scales(const std::string& source, std::vector<TensorView>& tensors,
                         const std::function<const TensorView*(const std::string&)>& find,
                         std::vector<std::vector<float>>* owned);

}  // namespace inferd
