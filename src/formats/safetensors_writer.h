// SafetensorsWriter: writes a .safetensors file, for `inferd quantize` on a Hugging Face
// directory. Plain dtypes keep their safetensors names (F32, F16, BF16, I8, F8_E4M3); a
// block-quantized tensor (Q8_0, Q4_G128, ...) is written as U8 [rows, row bytes] with the header
// metadata entry "inferd.block_type.<name>" = its dtype name, which SafetensorsFile reads back.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/status.h"
#include "tensor/dtype.h"

namespace inferd {

class SafetensorsWriter final {
 public:
  void set_metadata(const std::string& key, const std::string& value);
  // shape outermost first, in values (as TensorView); data = the stored bytes.
  void add_tensor(const std::string& name, DType dtype, std::vector<int64_t> shape,
                  std::vector<std::byte> data);
  // Writes the file (to a temporary name, then renamed); tensors in name order.
  Status write(const std::string& path) const;

 private:
  struct Tensor {
    DType dtype;
    std::vector<int64_t> shape;
    std::vector<std::byte> data;
  };
  std::map<std::string, std::string> metadata_;
  std::map<std::string, Tensor> tensors_;
};

}  // namespace inferd
