// SafetensorsFile: a parsed .safetensors file (Hugging Face): tensor views into its memory map.
// The model loader opens one per shard of a Hugging Face model directory.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "common/mapped_file.h"
#include "common/status.h"
#include "tensor/tensor_view.h"

namespace inferd {

class SafetensorsFile final {
 public:
  // Maps and parses `path`; every offset and size is checked against the file.
  static Expected<SafetensorsFile> open(const std::string& path);
  // Parses caller-owned bytes (tests, fuzzing); `name` stands for the file in messages.
  static Expected<SafetensorsFile> parse(const std::string& name, const std::byte* data, size_t size);

  const std::string& path() const { return name_; }
  const std::vector<TensorView>& tensors() const { return tensors_; }
  const TensorView* find_tensor(const std::string& name) const;

 private:
  MappedFile file_;
  std::string name_;
  std::vector<TensorView> tensors_;
  std::map<std::string, size_t> index_;
};

}  // namespace inferd
