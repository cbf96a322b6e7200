// Small text helpers several modules share: UTF-8 encoding of a code point, and the held-back
// tail of streamed text that may be the start of a tag.
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

}  // namespace inferd
