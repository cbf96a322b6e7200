#include "jinja/jinja_strings.h"

#include <utf8proc.h>

#include "common/text.h"

namespace inferd::jinja {

namespace {

bool contains(const std::vector<char32_t>& set, char32_t c) {
  for (char32_t x : set) {
    if (x == c) return true;
  }
  return false;
}

std::vector<char32_t> decode_all(std::string_view s) {
  std::vector<char32_t> out;
  for (size_t i = 0; i < s.size();) out.push_back(next_code_point(s, &i));
  return out;
}

// Units of s as (begin, end) byte ranges.
struct Unit {
  size_t begin;
  size_t end;
  char32_t c;
};

std::vector<Unit> units_of(std::string_view s) {
  std::vector<Unit> out;
  for (size_t i = 0; i < s.size();) {
    const size_t b = i;
    const char32_t c = next_code_point(s, &i);
    out.push_back({b, i, c});
  }
  return out;
}

}  // namespace

char32_t next_code_point(std::string_view s, size_t* i) {
  const auto b0 = static_cast<unsigned char>(s[*i]);
  const int len = b0 < 0x80 ? 1 : (b0 >> 5) == 0x6 ? 2 : (b0 >> 4) == 0xe ? 3 : (b0 >> 3) == 0x1e ? 4 : 0;
  if (len == 1) {
    ++*i;
    return b0;
  }
  if (len == 0 || *i + static_cast<size_t>(len) > s.size()) {
    ++*i;
    return kIllFormedBase + b0;
  }
  char32_t c = b0 & (0xffu >> (len + 1));
  for (int k = 1; k < len; ++k) {
    const auto b = static_cast<unsigned char>(s[*i + static_cast<size_t>(k)]);
    if ((b & 0xc0) != 0x80) {
      ++*i;
      return kIllFormedBase + b0;
    }
    c = (c << 6) | (b & 0x3f);
  }
  *i += static_cast<size_t>(len);
  return c;
}

void append_utf8(char32_t c, std::string* out) {
  if (c >= kIllFormedBase) {
    out->push_back(static_cast<char>(c - kIllFormedBase));
  } else {
    inferd::append_utf8(static_cast<uint32_t>(c), out);
  }
}

size_t count_code_points(std::string_view s) {
  size_t n = 0;
  for (size_t i = 0; i < s.size(); ++n) next_code_point(s, &i);
  return n;
}

std::vector<size_t> code_point_offsets(std::string_view s) {
  std::vector<size_t> out;
  size_t i = 0;
  while (i < s.size()) {
    out.push_back(i);
    next_code_point(s, &i);
  }
  out.push_back(s.size());
  return out;
}

bool is_py_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f ||
         c == 0x3000;
}

std::string py_strip(std::string_view s, const std::optional<std::string>& chars, bool left, bool right) {
  const std::vector<char32_t> set = chars ? decode_all(*chars) : std::vector<char32_t>{};
  auto strippable = [&](char32_t c) { return chars ? contains(set, c) : is_py_space(c); };
  const std::vector<Unit> units = units_of(s);
  size_t first = 0;
  size_t last = units.size();
  if (left) {
    while (first < last && strippable(units[first].c)) ++first;
  }
  if (right) {
    while (last > first && strippable(units[last - 1].c)) --last;
  }
  if (first == last) return "";
  return std::string(s.substr(units[first].begin, units[last - 1].end - units[first].begin));
}

std::vector<std::string> py_split(std::string_view s, const std::optional<std::string>& sep,
                                  int64_t maxsplit) {
  std::vector<std::string> out;
  if (sep) {
    size_t start = 0;
    while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
      const size_t hit = s.find(*sep, start);
      if (hit == std::string_view::npos) break;
      out.emplace_back(s.substr(start, hit - start));
      start = hit + sep->size();
    }
    out.emplace_back(s.substr(start));
    return out;
  }
  const std::vector<Unit> units = units_of(s);
  size_t k = 0;
  while (true) {
    while (k < units.size() && is_py_space(units[k].c)) ++k;
    if (k == units.size()) break;
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
      out.emplace_back(s.substr(units[k].begin));
      break;
    }
    const size_t begin = k;
    while (k < units.size() && !is_py_space(units[k].c)) ++k;
    out.emplace_back(s.substr(units[begin].begin, units[k - 1].end - units[begin].begin));
  }
  return out;
}

std::vector<std::string> py_rsplit(std::string_view s, const std::optional<std::string>& sep,
                                   int64_t maxsplit) {
  std::vector<std::string> out;
  if (sep) {
    size_t end = s.size();
    while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
      if (end < sep->size()) break;
      const size_t hit = s.rfind(*sep, end - sep->size());
      if (hit == std::string_view::npos) break;
      out.emplace_back(s.substr(hit + sep->size(), end - hit - sep->size()));
      end = hit;
    }
    out.emplace_back(s.substr(0, end));
  } else {
    const std::vector<Unit> units = units_of(s);
    size_t k = units.size();
    while (true) {
      while (k > 0 && is_py_space(units[k - 1].c)) --k;
      if (k == 0) break;
      if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
        out.emplace_back(s.substr(0, units[k - 1].end));
        break;
      }
      const size_t end = k;
      while (k > 0 && !is_py_space(units[k - 1].c)) --k;
      out.emplace_back(s.substr(units[k].begin, units[end - 1].end - units[k].begin));
    }
  }
  return {out.rbegin(), out.rend()};
}

std::string py_replace(std::string_view s, std::string_view old, std::string_view replacement,
                       int64_t count) {
  std::string out;
  int64_t done = 0;
  if (old.empty()) {
    const std::vector<size_t> offsets = code_point_offsets(s);
    for (size_t k = 0; k < offsets.size(); ++k) {
      if (count < 0 || done < count) {
        out += replacement;
        ++done;
      }
      if (k + 1 < offsets.size()) out += s.substr(offsets[k], offsets[k + 1] - offsets[k]);
    }
    return out;
  }
  size_t start = 0;
  while (count < 0 || done < count) {
    const size_t hit = s.find(old, start);
    if (hit == std::string_view::npos) break;
    out += s.substr(start, hit - start);
    out += replacement;
    start = hit + old.size();
    ++done;
  }
  out += s.substr(start);
  return out;
}

int64_t py_find(std::string_view s, std::string_view sub) {
  const size_t hit = s.find(sub);
  if (hit == std::string_view::npos) return -1;
  return static_cast<int64_t>(count_code_points(s.substr(0, hit)));
}

int64_t py_count(std::string_view s, std::string_view sub) {
  if (sub.empty()) return static_cast<int64_t>(count_code_points(s)) + 1;
  int64_t n = 0;
  for (size_t at = s.find(sub); at != std::string_view::npos; at = s.find(sub, at + sub.size())) ++n;
  return n;
}

namespace {

// Applies `map` to every code point (ill-formed bytes pass through).
template <typename Map>
std::string map_code_points(std::string_view s, Map map) {
  std::string out;
  out.reserve(s.size());
  size_t index = 0;
  for (size_t i = 0; i < s.size(); ++index) {
    const char32_t c = next_code_point(s, &i);
    if (c >= kIllFormedBase) {
      append_utf8(c, &out);
    } else {
      map(c, index, &out);
    }
  }
  return out;
}

void append_upper(char32_t c, std::string* out) {
  if (c == 0xdf) {
    *out += "SS";
    return;
  }
  append_utf8(static_cast<char32_t>(utf8proc_toupper(static_cast<utf8proc_int32_t>(c))), out);
}

void append_lower(char32_t c, std::string* out) {
  append_utf8(static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(c))), out);
}

void append_title(char32_t c, std::string* out) {
  if (c == 0xdf) {
    *out += "Ss";
    return;
  }
  append_utf8(static_cast<char32_t>(utf8proc_totitle(static_cast<utf8proc_int32_t>(c))), out);
}

utf8proc_category_t category(char32_t c) {
  return c >= kIllFormedBase ? UTF8PROC_CATEGORY_CN : utf8proc_category(static_cast<utf8proc_int32_t>(c));
}

}  // namespace

bool is_py_alpha(char32_t c) {
  const auto k = category(c);
  return k == UTF8PROC_CATEGORY_LU || k == UTF8PROC_CATEGORY_LL || k == UTF8PROC_CATEGORY_LT ||
         k == UTF8PROC_CATEGORY_LM || k == UTF8PROC_CATEGORY_LO;
}
bool is_py_digit(char32_t c) {
  return category(c) == UTF8PROC_CATEGORY_ND;
}
bool is_py_lower(char32_t c) {
  return category(c) == UTF8PROC_CATEGORY_LL;
}
bool is_py_upper(char32_t c) {
  return category(c) == UTF8PROC_CATEGORY_LU || category(c) == UTF8PROC_CATEGORY_LT;
}
bool is_py_cased(char32_t c) {
  return is_py_lower(c) || is_py_upper(c);
}

std::string py_upper(std::string_view s) {
  return map_code_points(s, [](char32_t c, size_t, std::string* out) { append_upper(c, out); });
}

std::string py_lower(std::string_view s) {
  return map_code_points(s, [](char32_t c, size_t, std::string* out) { append_lower(c, out); });
}

std::string py_capitalize(std::string_view s) {
  return map_code_points(s, [](char32_t c, size_t index, std::string* out) {
    if (index == 0) {
      append_title(c, out);
    } else {
      append_lower(c, out);
    }
  });
}

std::string py_title(std::string_view s) {
  bool previous_cased = false;
  return map_code_points(s, [&](char32_t c, size_t, std::string* out) {
    if (previous_cased) {
      append_lower(c, out);
    } else {
      append_title(c, out);
    }
    previous_cased = is_py_cased(c);
  });
}

std::string jinja_title(std::string_view s) {
  bool word_start = true;
  return map_code_points(s, [&](char32_t c, size_t, std::string* out) {
    const bool separator = is_py_space(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
    if (separator) {
      append_utf8(c, out);
    } else if (word_start) {
      append_upper(c, out);
    } else {
      append_lower(c, out);
    }
    word_start = separator;
  });
}

}  // namespace inferd::jinja
