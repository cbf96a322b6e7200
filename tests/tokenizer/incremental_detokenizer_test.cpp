#include "tokenizer/incremental_detokenizer.h"

#include <gtest/gtest.h>

#include "test_support.h"
#include "tokenizer/utf8.h"

namespace inferd {
namespace {

std::unique_ptr<Tokenizer> tiny() {
  return test::tiny_qwen_style_tokenizer();
}

// Byte-level ids of `text`: one token per byte, so multi-byte characters split across tokens.
std::vector<int32_t> byte_ids(const Tokenizer& tok, const std::string& text) {
  std::vector<int32_t> ids;
  for (char c : text) {
    auto one = tok.encode(std::string(1, c), false);
    if (one.size() == 1) {
      ids.push_back(one[0]);
    } else {
      // A lone byte of a multi-byte character: find the token of that byte directly.
      for (int32_t id = 0; id < tok.vocab_size(); ++id) {
        if (tok.token_bytes(id) == std::string(1, c)) {
          ids.push_back(id);
          break;
        }
      }
    }
  }
  return ids;
}

TEST(IncrementalDetokenizerTest, EmitsOnlyCompleteUtf8) {
  auto tok = tiny();
  const std::string text = "héllo 😀 世界 👨‍👩‍👧 done";
  const auto ids = byte_ids(*tok, text);
  ASSERT_EQ(tok->decode(ids), text);
  IncrementalDetokenizer d(*tok, {});
  std::string all;
  for (int32_t id : ids) {
    auto out = d.push(id);
    EXPECT_TRUE(is_valid_utf8(out.text)) << out.text;
    all += out.text;
  }
  all += d.finish().text;
  EXPECT_EQ(all, text);
  EXPECT_EQ(d.emitted(), text);
}

TEST(IncrementalDetokenizerTest, StopStringAcrossTokensNeverLeaks) {
  auto tok = tiny();
  const std::string text = "The answer is 42. STOP here and more";
  const auto ids = byte_ids(*tok, text);
  for (const std::string stop : {"STOP", ". ST", "42", "e"}) {
    IncrementalDetokenizer d(*tok, {"never", stop});
    std::string all;
    bool stopped = false;
    for (int32_t id : ids) {
      auto out = d.push(id);
      all += out.text;
      EXPECT_EQ(all.find(stop), std::string::npos) << "emitted past the stop '" << stop << "'";
      if (out.stopped) {
        stopped = true;
        EXPECT_EQ(out.matched_stop, stop);
        break;
      }
    }
    EXPECT_TRUE(stopped) << stop;
    EXPECT_EQ(all, text.substr(0, text.find(stop))) << stop;
    EXPECT_TRUE(d.push(ids[0]).text.empty());  // nothing after a stop
  }
}

TEST(IncrementalDetokenizerTest, HeldBackPrefixIsReleasedWhenItDiverges) {
  auto tok = tiny();
  const auto ids = byte_ids(*tok, "ab abc");
  IncrementalDetokenizer d(*tok, {"abd"});
  std::string all;
  for (size_t i = 0; i + 1 < ids.size(); ++i) all += d.push(ids[i]).text;
  EXPECT_EQ(all, "ab ");  // the second "ab" may still become "abd": held back
  all += d.push(ids.back()).text;
  EXPECT_EQ(all, "ab abc");  // 'c' shows it does not
  EXPECT_TRUE(d.finish().text.empty());
}

TEST(IncrementalDetokenizerTest, SpecialTokensSkippedUnlessKept) {
  auto tok = tiny();
  const auto ids = tok->encode("<|im_start|>hi<|im_end|>", true);
  IncrementalDetokenizer plain(*tok, {});
  IncrementalDetokenizer keep(*tok, {}, /*keep_special=*/true);
  std::string a, b;
  for (int32_t id : ids) {
    a += plain.push(id).text;
    b += keep.push(id).text;
  }
  a += plain.finish().text;
  b += keep.finish().text;
  EXPECT_EQ(a, "hi");
  EXPECT_EQ(b, "<|im_start|>hi<|im_end|>");
}

}  // namespace
}  // namespace inferd
