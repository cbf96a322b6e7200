// GPT-2's byte-level alphabet: each byte maps to one printable Unicode character, so BPE vocabs
// store arbitrary bytes as text ("Ġ" is the space byte). Used by the tokenizer both ways.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace inferd {

// UTF-8 of the character that stands for byte b.
const std::string& byte_to_unicode(uint8_t b);

// Appends the bytes a byte-level token string stands for; false when it holds a character that
// is not in the alphabet (then nothing sensible can be decoded).
bool byte_level_decode(std::string_view token, std::string* out);

// The byte-level string of raw bytes.
std::string byte_level_encode(std::string_view bytes);

}  // namespace inferd
