// UTF-8 helpers of the tokenizer: validation with replacement, complete-prefix detection (for
// streaming), NFC normalization (through utf8proc).
#pragma once

#include <string>
#include <string_view>

namespace inferd {

// Copies `text`, replacing every ill-formed sequence by U+FFFD, one per maximal subpart (the
// Unicode recommendation, which Python's bytes.decode('utf-8', errors='replace') follows).
std::string sanitize_utf8(std::string_view text);

// True when `text` is well-formed UTF-8.
bool is_valid_utf8(std::string_view text);

// Length of the longest prefix of `text` that does not end inside a multi-byte character that
// could still be completed by more bytes. Ill-formed bytes count as complete (they are final).
size_t utf8_complete_prefix(std::string_view text);

// Unicode NFC of well-formed UTF-8 text.
std::string nfc_normalize(std::string_view text);

}  // namespace inferd
