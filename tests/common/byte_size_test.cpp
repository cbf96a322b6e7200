#include "common/byte_size.h"

#include <gtest/gtest.h>

namespace inferd {
namespace {

TEST(ByteSizeTest, UnitsAndFractions) {
  EXPECT_EQ(*parse_byte_size("2GiB", 0), int64_t{2} << 30);
  EXPECT_EQ(*parse_byte_size("512MB", 0), 512000000);
  EXPECT_EQ(*parse_byte_size("1.5mib", 0), 1572864);
  EXPECT_EQ(*parse_byte_size("4096", 0), 4096);
  EXPECT_EQ(*parse_byte_size("0.25", 1000), 250);
  EXPECT_FALSE(parse_byte_size("0.5", 0).has_value());  // fraction of unknown memory
  for (const char* bad : {"", "abc", "-1", "2XB", "0", "nan", "1e30"}) {
    EXPECT_FALSE(parse_byte_size(bad, 1000).has_value()) << bad;
  }
  EXPECT_GT(available_memory_bytes(), 0);
}

}  // namespace
}  // namespace inferd
