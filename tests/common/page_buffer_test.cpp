#include "common/page_buffer.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <utility>

namespace inferd {
namespace {

bool all_zero(const PageBuffer& b) {
  for (size_t i = 0; i < b.size(); ++i)
    if (b.data()[i] != std::byte{0}) return false;
  return true;
}

// This process's resident memory in KiB (VmRSS).
int64_t resident_kib() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6));
  return -1;
}

TEST(PageBufferTest, SmallAndLargeBuffersComeZeroedAndWritable) {
  for (size_t n : {size_t{0}, size_t{1}, size_t{4095}, size_t{100000}, (size_t{4} << 20) - 1, size_t{4} << 20,
                   (size_t{9} << 20) + 12345}) {
    SCOPED_TRACE(n);
    PageBuffer b(n);
    ASSERT_EQ(b.size(), n);
    ASSERT_NE(b.data(), nullptr);
    EXPECT_EQ(b.mapped(), n >= (size_t{4} << 20));
    if (b.mapped()) {
      EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % 4096, 0u);
    }
    EXPECT_TRUE(all_zero(b));
    if (n > 0) {
      std::memset(b.data(), 0x5a, n);
      EXPECT_EQ(b.data()[n - 1], std::byte{0x5a});
    }
  }
}

// A large buffer is resident when constructed (no page faults later, in a serving step), and its
// memory goes back when it is destroyed.
TEST(PageBufferTest, LargeBufferIsFaultedInAtOnceAndGivenBack) {
  const size_t n = size_t{64} << 20;
  const int64_t before = resident_kib();
  ASSERT_GT(before, 0);
  {
    PageBuffer b(n);
    EXPECT_GE(resident_kib() - before, static_cast<int64_t>(n / 1024) * 9 / 10);
  }
  EXPECT_LT(resident_kib() - before, static_cast<int64_t>(n / 1024) / 10);
}

TEST(PageBufferTest, MovesHandTheBytesOver) {
  PageBuffer a(size_t{5} << 20);
  a.data()[7] = std::byte{3};
  std::byte* bytes = a.data();
  PageBuffer b(std::move(a));
  EXPECT_EQ(b.data(), bytes);
  EXPECT_EQ(b.data()[7], std::byte{3});
  EXPECT_EQ(a.size(), 0u);  // NOLINT(bugprone-use-after-move): a moved-from buffer is empty
  PageBuffer c(16);
  c = std::move(b);
  EXPECT_EQ(c.data(), bytes);
  EXPECT_EQ(c.size(), size_t{5} << 20);
  EXPECT_TRUE(c.mapped());
}

}  // namespace
}  // namespace inferd
