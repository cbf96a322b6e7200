#include "common/page_buffer.h"

#include <sys/mman.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "common/check.h"

namespace inferd {

namespace {

constexpr size_t kMappedFrom = size_t{4} << 20;
constexpr size_t kPage = 4096;

}  // namespace

PageBuffer::PageBuffer(size_t n) : size_(n) {
  if (n < kMappedFrom) {
    data_ = static_cast<std::byte*>(std::calloc(n == 0 ? 1 : n, 1));
    INFERD_CHECK_MSG(data_ != nullptr, "out of memory");
    return;
  }
  // MAP_POPULATE: the kernel faults every page in within this call, zeroed.
  const size_t rounded = (n + kPage - 1) / kPage * kPage;
  void* p =
      ::mmap(nullptr, rounded, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  INFERD_CHECK_MSG(p != MAP_FAILED, "out of memory");
  data_ = static_cast<std::byte*>(p);
  mapped_ = rounded;
}

PageBuffer::PageBuffer(PageBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      mapped_(std::exchange(other.mapped_, 0)) {}

PageBuffer& PageBuffer::operator=(PageBuffer&& other) noexcept {
  if (this != &other) {
    reset();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    mapped_ = std::exchange(other.mapped_, 0);
  }
  return *this;
}

PageBuffer::~PageBuffer() {
  reset();
}

void PageBuffer::reset() {
  if (data_ != nullptr) {
    if (mapped_ != 0) {
      ::munmap(data_, mapped_);
    } else {
      std::free(data_);
    }
  }
  data_ = nullptr;
  size_ = 0;
  mapped_ = 0;
}

}  // namespace inferd
