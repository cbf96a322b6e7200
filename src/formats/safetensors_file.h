// SafetensorsFile: a parsed .safetensors file (Hugging Face): tensor views into its memory map.
// The model loader opens one per shard of a Hugging Face model directory. Besides F32 / F16 /
// BF16 it reads inferd's quantized checkpoints (docs/formats.md): I8 and F8_E4M3 tensors with a
// per-row "<name>_scale" tensor, and block-quantized tensors (Q4_G128, Q8_0, ...) stored as U8
// [rows, row bytes] and named by the header's metadata entry "inferd.block_type.<name>".
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
  std::vector<std::vector<float>> row_scales_;  // the I8 / F8_E4M3 tensors' scales
};

}  // namespace inferd
