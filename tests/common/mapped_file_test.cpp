#include "common/mapped_file.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

namespace inferd {
namespace {

// This process's resident pages (the second field of /proc/self/statm).
long resident_pages() {
  std::ifstream statm("/proc/self/statm");
  long size = 0, resident = 0;
  statm >> size >> resident;
  return resident;
}

// A temporary file of n bytes, byte i = i * 7 (mod 256); removed with the object.
struct TempFile {
  std::string path;
  explicit TempFile(size_t n) {
    char name[] = "/tmp/inferd_mapped_XXXXXX";
    const int fd = ::mkstemp(name);
    EXPECT_GE(fd, 0);
    path = name;
    std::vector<char> bytes(n);
    for (size_t i = 0; i < n; ++i) bytes[i] = static_cast<char>(i * 7);
    EXPECT_EQ(::write(fd, bytes.data(), n), static_cast<ssize_t>(n));
    ::close(fd);
  }
  ~TempFile() { std::remove(path.c_str()); }
};

// Released pages leave the process (its resident set shrinks by them) and read back the same.
TEST(MappedFileTest, ReleasedPagesLeaveTheResidentSetAndReadBackTheSame) {
  const size_t n = size_t{32} << 20;
  TempFile tmp(n);
  auto file = MappedFile::open(tmp.path);
  ASSERT_TRUE(file.has_value());
  const long page = ::sysconf(_SC_PAGESIZE);
  unsigned sum = 0;
  for (size_t i = 0; i < n; i += static_cast<size_t>(page)) sum += static_cast<unsigned>(file->data()[i]);
  const long before = resident_pages();
  // An unaligned range: only the whole pages inside it go.
  const size_t released = release_mapped_pages(file->data() + 100, n - 200);
  EXPECT_EQ(released, n - static_cast<size_t>(page) * 2);
  const long after = resident_pages();
  EXPECT_LE(after, before - static_cast<long>(n / static_cast<size_t>(page)) * 9 / 10)
      << "resident pages before " << before << ", after " << after;
  unsigned again = 0;
  for (size_t i = 0; i < n; i += static_cast<size_t>(page)) again += static_cast<unsigned>(file->data()[i]);
  EXPECT_EQ(again, sum);
  for (size_t i : {size_t{0}, size_t{99}, size_t{4096}, n / 2 + 3, n - 1})
    EXPECT_EQ(file->data()[i], static_cast<std::byte>(static_cast<unsigned char>(i * 7))) << i;
}

// Memory that is not a live mapping, or a range past the mapping's end, is left alone.
TEST(MappedFileTest, OtherMemoryIsLeftAlone) {
  std::vector<std::byte> heap(size_t{1} << 20, std::byte{5});
  EXPECT_EQ(release_mapped_pages(heap.data(), heap.size()), 0u);
  EXPECT_EQ(heap[12345], std::byte{5});
  TempFile tmp(1 << 16);
  const std::byte* data = nullptr;
  {
    auto file = MappedFile::open(tmp.path);
    ASSERT_TRUE(file.has_value());
    data = file->data();
    EXPECT_EQ(release_mapped_pages(data, (1 << 16) + 1), 0u);  // one byte past the end
    EXPECT_EQ(release_mapped_pages(data, 1 << 16), size_t{1} << 16);
    MappedFile moved = std::move(file).value();  // the mapping stays registered once moved
    EXPECT_EQ(release_mapped_pages(data, 1 << 16), size_t{1} << 16);
  }
  EXPECT_EQ(release_mapped_pages(data, 1 << 16), 0u);  // unmapped
}

}  // namespace
}  // namespace inferd
