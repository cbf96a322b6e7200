// GgufFileWriter: writes a GGUF v3 file (metadata key/values and tensors), for `inferd quantize`.
// Values come as GgufFile parses them, so a file's metadata can be copied through unchanged.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/status.h"
#include "formats/gguf_file.h"
#include "tensor/dtype.h"

namespace inferd {

class GgufFileWriter final {
 public:
  // Sets (or replaces) a metadata value.
  void set(const std::string& key, GgufValue value);
  void set_u32(const std::string& key, uint32_t v);
  void erase(const std::string& key) { metadata_.erase(key); }
  // Adds a tensor: shape outermost first (as TensorView), data = its stored bytes.
  void add_tensor(const std::string& name, DType dtype, std::vector<int64_t> shape,
                  std::vector<std::byte> data);

  // Writes the file (to a temporary name, then renamed). Data aligned to general.alignment (32
  // unless set).
  Status write(const std::string& path) const;

 private:
  struct Tensor {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    std::vector<std::byte> data;
  };
  std::map<std::string, GgufValue> metadata_;
  std::vector<Tensor> tensors_;
};

}  // namespace inferd
