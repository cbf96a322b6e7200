// GgufFile: a parsed GGUF (v2/v3) model file: metadata key/values and tensor views into the map.
// The model loader reads config and weights from it; tensors stay memory-mapped, never copied.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/mapped_file.h"
#include "common/status.h"
#include "tensor/tensor_view.h"

namespace inferd {

enum class GgufType : uint32_t {
  kU8 = 0,
  kI8 = 1,
  kU16 = 2,
  kI16 = 3,
  kU32 = 4,
  kI32 = 5,
  kF32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kU64 = 10,
  kI64 = 11,
  kF64 = 12,
};

// One metadata value. Scalars use the field of their kind; arrays hold their elements in the
// vector of the element kind (bools and all integers in `ints`, u64 values above 2^63 wrap).
struct GgufValue {
  GgufType type = GgufType::kU8;
  int64_t int_value = 0;
  double float_value = 0;
  std::string string_value;
  GgufType array_type = GgufType::kU8;
  std::vector<int64_t> array_ints;
  std::vector<double> array_floats;
  std::vector<std::string> array_strings;
  std::vector<GgufValue> array_nested;

  bool is_integer() const;
  bool is_float() const { return type == GgufType::kF32 || type == GgufType::kF64; }
};

const char* gguf_type_name(GgufType type);

class GgufFile final {
 public:
  // Maps and parses `path`. Every count, length, offset and size is checked against the file;
  // a malformed file gives a kCorruptFile / kUnsupported Status naming the file and the fault.
  static Expected<GgufFile> open(const std::string& path);

  // Parses GGUF bytes that the caller keeps alive for the GgufFile's lifetime (tests, fuzzing).
  // `name` stands for the file in error messages.
  static Expected<GgufFile> parse(const std::string& name, const std::byte* data, size_t size);

  uint32_t version() const { return version_; }
  const std::string& path() const { return name_; }
  const std::map<std::string, GgufValue>& metadata() const { return metadata_; }
  const std::vector<TensorView>& tensors() const { return tensors_; }

  const GgufValue* find(const std::string& key) const;
  const TensorView* find_tensor(const std::string& name) const;

  // Typed metadata access. nullopt when absent; an error when present with the wrong type.
  Expected<std::optional<int64_t>> get_int(const std::string& key) const;
  Expected<std::optional<double>> get_float(const std::string& key) const;
  Expected<std::optional<std::string>> get_string(const std::string& key) const;

 private:
  friend class GgufParser;
  MappedFile file_;  // empty when parsed from caller-owned memory
  std::string name_;
  uint32_t version_ = 0;
  size_t alignment_ = 32;
  std::map<std::string, GgufValue> metadata_;
  std::vector<TensorView> tensors_;
  std::map<std::string, size_t> tensor_index_;
  std::vector<std::vector<float>> row_scales_;  // the I8 / F8_E4M3 tensors' scales
};

}  // namespace inferd
