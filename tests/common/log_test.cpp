// The logger: text and JSON lines, fields, level filtering.
#include "common/log.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sstream>

namespace inferd {
namespace {

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::stringstream ss(text);
  for (std::string line; std::getline(ss, line);) lines.push_back(line);
  return lines;
}

class LogTest : public ::testing::Test {
 protected:
  void TearDown() override { configure_logging(LogLevel::kInfo, LogFormat::kText); }
};

TEST_F(LogTest, TextLinesNameTheLevelAndTheFields) {
  configure_logging(LogLevel::kInfo, LogFormat::kText);
  testing::internal::CaptureStderr();
  log_info("request finished",
           {{"id", std::string("cmpl-1")}, {"prompt_tokens", int64_t{12}}, {"ttft_s", 0.25}});
  log_warning("tier down", {{"why", std::string("connection refused")}});
  log_debug("not shown at info");
  const auto lines = lines_of(testing::internal::GetCapturedStderr());
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0], "inferd: request finished id=cmpl-1 prompt_tokens=12 ttft_s=0.25");
  EXPECT_EQ(lines[1], "inferd: warning: tier down why=\"connection refused\"");
}

TEST_F(LogTest, JsonLinesAreObjectsWithTypedFields) {
  configure_logging(LogLevel::kDebug, LogFormat::kJson);
  testing::internal::CaptureStderr();
  log_debug("quote \" and \\ and \n newline", {{"n", int64_t{-3}}, {"x", 1.5}, {"s", std::string("a\"b")}});
  log_error("bad bytes \xff here");
  const auto lines = lines_of(testing::internal::GetCapturedStderr());
  ASSERT_EQ(lines.size(), 2u);
  const auto a = nlohmann::json::parse(lines[0]);
  EXPECT_EQ(a["level"], "debug");
  EXPECT_EQ(a["msg"], "quote \" and \\ and \n newline");
  EXPECT_EQ(a["n"], -3);
  EXPECT_EQ(a["x"], 1.5);
  EXPECT_EQ(a["s"], "a\"b");
  EXPECT_EQ(a["time"].get<std::string>().size(), 29u);  // 2026-12-01T21:15:26.123+00:00
  const auto b = nlohmann::json::parse(lines[1]);       // invalid UTF-8 replaced, still JSON
  EXPECT_EQ(b["level"], "error");
}

TEST_F(LogTest, LevelFiltersAndOffSilences) {
  configure_logging(LogLevel::kWarning, LogFormat::kText);
  testing::internal::CaptureStderr();
  log_info("dropped");
  log_warning("kept");
  configure_logging(LogLevel::kOff, LogFormat::kText);
  log_error("dropped too");
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "inferd: warning: kept\n");
}

}  // namespace
}  // namespace inferd
