#include "tokenizer/utf8.h"

#include <gtest/gtest.h>

namespace inferd {
namespace {

const std::string kFffd = "\xEF\xBF\xBD";

TEST(Utf8Test, SanitizeReplacesMaximalSubparts) {
  EXPECT_EQ(sanitize_utf8("abc"), "abc");
  EXPECT_EQ(sanitize_utf8("a\xff"
                          "b"),
            "a" + kFffd + "b");
  EXPECT_EQ(sanitize_utf8("\xe4\xbd"), kFffd);  // truncated 3-byte: one replacement
  EXPECT_EQ(sanitize_utf8("\xe4\xbdx"), kFffd + "x");
  EXPECT_EQ(sanitize_utf8("\xed\xa0\x80"), kFffd + kFffd + kFffd);  // surrogate: byte by byte
  EXPECT_EQ(sanitize_utf8("\xc0\xaf"), kFffd + kFffd);              // overlong
  EXPECT_EQ(sanitize_utf8("\xf0\x9f\x98"), kFffd);
  EXPECT_EQ(sanitize_utf8("\xf0\x9f\x98\x80"), "\xf0\x9f\x98\x80");
  EXPECT_TRUE(is_valid_utf8("héllo 😀"));
  EXPECT_FALSE(is_valid_utf8("\x80"));
}

TEST(Utf8Test, CompletePrefixHoldsBackUnfinishedCharacters) {
  const std::string smile = "\xf0\x9f\x98\x80";
  for (size_t cut = 1; cut < 4; ++cut)
    EXPECT_EQ(utf8_complete_prefix("ab" + smile.substr(0, cut)), 2u) << cut;
  EXPECT_EQ(utf8_complete_prefix("ab" + smile), 6u);
  EXPECT_EQ(utf8_complete_prefix("ab\xff"), 3u);    // ill-formed: final, not held
  EXPECT_EQ(utf8_complete_prefix("\xe4\x41"), 2u);  // broken sequence is not unfinished
  EXPECT_EQ(utf8_complete_prefix(""), 0u);
}

TEST(Utf8Test, Nfc) {
  EXPECT_EQ(nfc_normalize("e\xcc\x81"), "\xc3\xa9");
  EXPECT_EQ(nfc_normalize("plain"), "plain");
}

}  // namespace
}  // namespace inferd
