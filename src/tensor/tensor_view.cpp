#include "tensor/tensor_view.h"

namespace inferd {

std::string TensorView::shape_string() const {
  std::string s = "[";
  for (int i = 0; i < num_dims; ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(shape[static_cast<size_t>(i)]);
  }
  return s + "]";
}

}  // namespace inferd
