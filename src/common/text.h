// Small text helpers several modules share: UTF-8 encoding of a code point, the held-back tail of
// streamed text that may be the start of a tag, and the nesting depth of JSON text.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace inferd {

// Appends the UTF-8 bytes of code point `cp` (1-4 bytes; values past U+10FFFF or surrogates are
// encoded as given, the caller decides what is valid).
void append_utf8(uint32_t cp, std::string* out);
inline std::string utf8_encode(uint32_t cp) {
  std::string s;
  append_utf8(cp, &s);
  return s;
}

// The length of the longest suffix of `s` that is a proper prefix of `tag`: how much of streamed
// text to hold back because the next chunk may complete the tag.
size_t partial_tag_suffix(std::string_view s, std::string_view tag);

// How deep JSON text received from outside may nest arrays and objects. nlohmann::json parses any
// depth, but copying, comparing and printing a value recurse once per level: a request body of a
// million nested brackets (2 MB) overflowed the server's stack.
inline constexpr int kMaxJsonDepth = 512;

// Whether `text` nests arrays and objects deeper than `max_depth`, brackets inside strings not
// counted. One pass, no allocation; meant to run before parsing text from outside, so it does not
// validate (invalid JSON is the parser's to refuse).
bool json_nests_deeper_than(std::string_view text, int max_depth = kMaxJsonDepth);

}  // namespace inferd
