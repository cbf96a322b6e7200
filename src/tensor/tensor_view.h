// TensorView: a named, typed, non-owning view of weight bytes (usually inside a memory map).
// Loaders produce them; the model keeps them for its lifetime; kernels read rows from them.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "tensor/dtype.h"

namespace inferd {

struct TensorView {
  std::string name;
  DType dtype = DType::kF32;
  int num_dims = 0;
  // Outermost first, as PyTorch writes shapes: a linear weight is [out_features, in_features].
  std::array<int64_t, 4> shape{1, 1, 1, 1};
  const std::byte* data = nullptr;  // not owned
  size_t num_bytes = 0;
  // For kI8 / kF8_E4M3 (dtype_has_row_scale): [num_rows()] f32, owned by the file object that
  // made the view; value = stored value * row_scale[row]. Null for every other dtype.
  const float* row_scale = nullptr;

  int64_t num_elements() const {
    int64_t n = 1;
    for (int i = 0; i < num_dims; ++i) n *= shape[static_cast<size_t>(i)];
    return n;
  }
  // Length of the innermost dimension (a row).
  int64_t row_length() const { return num_dims == 0 ? 1 : shape[static_cast<size_t>(num_dims - 1)]; }
  int64_t num_rows() const { return num_elements() / row_length(); }
  size_t row_bytes() const { return static_cast<size_t>(dtype_bytes(dtype, row_length())); }
  const std::byte* row(int64_t r) const { return data + static_cast<size_t>(r) * row_bytes(); }

  // "[a, b]" for messages.
  std::string shape_string() const;
};

}  // namespace inferd
