#include "tokenizer/byte_level.h"

#include <vector>

#include "common/text.h"

namespace inferd {

namespace {

struct Tables {
  std::array<std::string, 256> to_unicode;
  std::vector<int> from_codepoint;  // codepoint -> byte, -1 when none (codepoints < 512)

  Tables() : from_codepoint(512, -1) {
    // Printable Latin-1 bytes stand for themselves; the rest map to 256, 257, ... in order.
    uint32_t next = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      const uint32_t cp = printable ? b : next++;
      to_unicode[b] = utf8_encode(cp);
      from_codepoint[cp] = static_cast<int>(b);
    }
  }
};

const Tables& tables() {
  static const Tables t;
  return t;
}

}  // namespace

const std::string& byte_to_unicode(uint8_t b) {
  return tables().to_unicode[b];
}

bool byte_level_decode(std::string_view token, std::string* out) {
  const Tables& t = tables();
  size_t i = 0;
  while (i < token.size()) {
    const auto b0 = static_cast<unsigned char>(token[i]);
    uint32_t cp;
    if (b0 < 0x80) {
      cp = b0;
      i += 1;
    } else if ((b0 & 0xE0) == 0xC0 && i + 1 < token.size()) {
      cp = ((b0 & 0x1Fu) << 6) | (static_cast<unsigned char>(token[i + 1]) & 0x3Fu);
      i += 2;
    } else {
      return false;
    }
    if (cp >= t.from_codepoint.size() || t.from_codepoint[cp] < 0) return false;
    *out += static_cast<char>(t.from_codepoint[cp]);
  }
  return true;
}

std::string byte_level_encode(std::string_view bytes) {
  std::string s;
  s.reserve(bytes.size() * 2);
  for (char c : bytes) s += byte_to_unicode(static_cast<uint8_t>(c));
  return s;
}

}  // namespace inferd
