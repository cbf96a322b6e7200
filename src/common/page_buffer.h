// PageBuffer: zeroed memory for a large buffer that lives as long as the server (the KV cache).
// Buffers of 4 MiB and more are anonymous pages mapped with MAP_POPULATE: the kernel faults them
// all in within the one call, zeroed, so there is neither a fault per page nor a memset pass after
// it (std::vector's value-initialisation takes both), and no page faults later, in a serving step.
// Small ones come from the heap, zeroed. 4 KiB pages, not huge ones: on the project's VMs a huge
// page costs a fresh allocation on the host at first touch (free page reporting), which made a
// 1.1 GiB KV cache take 2.7-3.0 s to set up instead of about 0.4 s (BENCHMARKS.md, start-up).
#pragma once

#include <cstddef>

namespace inferd {

class PageBuffer final {
 public:
  PageBuffer() = default;
  // n zero bytes (n may be 0). Aborts when the system has no memory for them, as std::vector would.
  explicit PageBuffer(size_t n);
  PageBuffer(PageBuffer&& other) noexcept;
  PageBuffer& operator=(PageBuffer&& other) noexcept;
  PageBuffer(const PageBuffer&) = delete;
  PageBuffer& operator=(const PageBuffer&) = delete;
  ~PageBuffer();

  std::byte* data() { return data_; }
  const std::byte* data() const { return data_; }
  size_t size() const { return size_; }
  // Whether the bytes are mapped pages (large buffers) rather than heap memory.
  bool mapped() const { return mapped_ != 0; }

 private:
  void reset();

  std::byte* data_ = nullptr;
  size_t size_ = 0;
  size_t mapped_ = 0;  // bytes of the mapping data_ starts (0: heap memory)
};

}  // namespace inferd
