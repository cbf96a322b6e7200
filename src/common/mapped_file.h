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

// Drops this process's resident pages of [p, p + n) when the range lies inside the mapping of a
// live MappedFile: the whole pages inside the range only. Their memory goes back to the system
// (the file's page cache keeps them while it has room), and a later read faults them in again
// from the file, so the bytes read are the same. A weight repacked at load calls it on the
// file's copy it no longer reads. Elsewhere (heap memory) it does nothing. Returns the bytes
// released.
size_t release_mapped_pages(const void* p, size_t n);

}  // namespace inferd
