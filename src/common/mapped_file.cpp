#include "common/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <utility>
#include <vector>

namespace inferd {

namespace {
// The live mappings, for release_mapped_pages.
struct Mappings {
  std::mutex mutex;
  std::vector<std::pair<const std::byte*, size_t>> ranges;
};
Mappings& mappings() {
  static Mappings m;
  return m;
}
}  // namespace

size_t release_mapped_pages(const void* p, size_t n) {
  const auto* begin = static_cast<const std::byte*>(p);
  Mappings& m = mappings();
  std::lock_guard<std::mutex> lock(m.mutex);
  const bool inside = std::any_of(m.ranges.begin(), m.ranges.end(), [&](const auto& r) {
    return begin >= r.first && n <= r.second && begin - r.first <= static_cast<ptrdiff_t>(r.second - n);
  });
  if (!inside) return 0;
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t first = (reinterpret_cast<uintptr_t>(begin) + page - 1) / page * page;
  const uintptr_t last = (reinterpret_cast<uintptr_t>(begin) + n) / page * page;
  if (last <= first) return 0;
  // Under the lock: the mapping cannot be unmapped (and its range reused) meanwhile.
  if (::madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED) != 0) return 0;
  return last - first;
}

Expected<MappedFile> MappedFile::open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return io_error(path + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    return io_error(path + ": cannot stat: " + std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return io_error(path + ": not a regular file");
  }
  MappedFile file;
  file.path_ = path;
  file.size_ = static_cast<size_t>(st.st_size);
  if (file.size_ > 0) {
    void* p = ::mmap(nullptr, file.size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      int err = errno;
      ::close(fd);
      return io_error(path + ": cannot mmap: " + std::strerror(err));
    }
    file.data_ = static_cast<const std::byte*>(p);
    Mappings& m = mappings();
    std::lock_guard<std::mutex> lock(m.mutex);
    m.ranges.emplace_back(file.data_, file.size_);
  }
  ::close(fd);
  return file;
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : data_(other.data_), size_(other.size_), path_(std::move(other.path_)) {
  other.data_ = nullptr;
  other.size_ = 0;
}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    reset();
    data_ = other.data_;
    size_ = other.size_;
    path_ = std::move(other.path_);
    other.data_ = nullptr;
    other.size_ = 0;
  }
  return *this;
}

MappedFile::~MappedFile() {
  reset();
}

void MappedFile::reset() {
  if (data_ != nullptr) {
    Mappings& m = mappings();
    std::lock_guard<std::mutex> lock(m.mutex);
    std::erase_if(m.ranges, [&](const auto& r) { return r.first == data_; });
    ::munmap(const_cast<std::byte*>(data_), size_);
  }
  data_ = nullptr;
  size_ = 0;
}

}  // namespace inferd
