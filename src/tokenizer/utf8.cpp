#include "tokenizer/utf8.h"

#include <utf8proc.h>

#include <algorithm>
#include <cstdlib>

namespace inferd {

namespace {

constexpr const char* kReplacement = "\xEF\xBF\xBD";

// Length of the well-formed sequence starting at text[i], or 0 when ill-formed; *subpart gets
// the length of the maximal subpart to replace when ill-formed (>= 1).
size_t sequence_length(std::string_view t, size_t i, size_t* subpart) {
  const auto b0 = static_cast<unsigned char>(t[i]);
  *subpart = 1;
  if (b0 < 0x80) return 1;
  size_t need;
  unsigned char lo = 0x80, hi = 0xBF;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 3;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  for (size_t k = 1; k < need; ++k) {
    if (i + k >= t.size()) return 0;  // truncated: the bytes so far are one maximal subpart
    const auto b = static_cast<unsigned char>(t[i + k]);
    const unsigned char l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
    if (b < l || b > h) return 0;
    *subpart = k + 1;
  }
  return need;
}

}  // namespace

std::string sanitize_utf8(std::string_view t) {
  std::string out;
  out.reserve(t.size());
  size_t i = 0;
  while (i < t.size()) {
    size_t subpart = 1;
    const size_t n = sequence_length(t, i, &subpart);
    if (n > 0) {
      out.append(t.substr(i, n));
      i += n;
    } else {
      out += kReplacement;
      i += subpart;  // the lead byte and the continuation bytes that were valid so far
    }
  }
  return out;
}

bool is_valid_utf8(std::string_view t) {
  size_t i = 0;
  while (i < t.size()) {
    size_t subpart = 1;
    const size_t n = sequence_length(t, i, &subpart);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

size_t utf8_complete_prefix(std::string_view t) {
  // Look back at most 3 bytes for a lead byte whose sequence is unfinished.
  const size_t n = t.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const auto b = static_cast<unsigned char>(t[n - back]);
    if ((b & 0xC0) == 0x80) continue;  // continuation byte: keep looking for the lead
    size_t need = 0;
    if (b >= 0xC2 && b <= 0xDF)
      need = 2;
    else if (b >= 0xE0 && b <= 0xEF)
      need = 3;
    else if (b >= 0xF0 && b <= 0xF4)
      need = 4;
    if (need > back) {
      size_t subpart = 1;
      (void)sequence_length(t, n - back, &subpart);
      // Unfinished only if every byte present so far is still valid.
      if (subpart == back) return n - back;
    }
    return n;
  }
  return n;
}

std::string nfc_normalize(std::string_view text) {
  utf8proc_uint8_t* out = nullptr;
  const auto len = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                                static_cast<utf8proc_ssize_t>(text.size()), &out,
                                static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (len < 0 || out == nullptr) return std::string(text);
  std::string result(reinterpret_cast<const char*>(out), static_cast<size_t>(len));
  std::free(out);
  return result;
}

}  // namespace inferd
