#include "common/status.h"

#include <gtest/gtest.h>

namespace inferd {
namespace {

Expected<int> parse_positive(int v) {
  if (v <= 0) return invalid_argument("value " + std::to_string(v) + " is not positive");
  return v;
}

Expected<int> doubled(int v) {
  INFERD_ASSIGN_OR_RETURN(int x, parse_positive(v));
  return 2 * x;
}

TEST(StatusTest, OkAndError) {
  EXPECT_TRUE(Status::ok().is_ok());
  Status s = not_found("tensor 'x'");
  EXPECT_FALSE(s.is_ok());
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_EQ(s.with_context("file.gguf").message(), "file.gguf: tensor 'x'");
}

TEST(StatusTest, ExpectedPropagates) {
  auto good = doubled(21);
  ASSERT_TRUE(good.has_value());
  EXPECT_EQ(*good, 42);
  auto bad = doubled(-1);
  ASSERT_FALSE(bad.has_value());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("-1"), std::string::npos);
}

}  // namespace
}  // namespace inferd
