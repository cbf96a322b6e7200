// MappedFile: a read-only memory map of a whole file (model weights are used in place from it).
// Loaders (model/) open one per weight file; tensors point into it for the model's lifetime.
#pragma once

#include <cstddef>
#include <string>

#include "common/status.h"

namespace inferd {

class MappedFile final {
 public:
  // Maps `path` read-only. Thread-safe reads afterwards; the mapping lives until destruction.
  static Expected<MappedFile> open(const std::string& path);

  MappedFile() = default;
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  const std::byte* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  void reset();

  const std::byte* data_ = nullptr;
  size_t size_ = 0;
  std::string path_;
};

}  // namespace inferd
