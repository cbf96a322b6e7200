// regex_to_gbnf (declared in grammar.h): a regex translated to a GBNF expression, character by
// character, so that GBNF's parser is the one place where text becomes rules.
#include <cstdio>
#include <string>

#include "common/text.h"
#include "grammar/codepoint_set.h"
#include "grammar/grammar.h"

namespace inferd {

namespace {

struct RegexError {
  size_t offset;
  std::string message;
};

std::string class_char(uint32_t c) {
  char buf[16];
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'))
    return std::string(1, static_cast<char>(c));
  if (c <= 0xFF) {
    std::snprintf(buf, sizeof buf, "\\x%02X", c);
  } else if (c <= 0xFFFF) {
    std::snprintf(buf, sizeof buf, "\\u%04X", c);
  } else {
    std::snprintf(buf, sizeof buf, "\\U%08X", c);
  }
  return buf;
}

CodepointSet json_unsafe() {
  CodepointSet s;
  s.add_range(0, 0x1F);
  s.add('"');
  s.add('\\');
  return s;
}

class RegexTranslator final {
 public:
  RegexTranslator(std::string_view re, bool json) : re_(re), json_(json) {}

  std::string translate() {
    if (peek() == '^') ++pos_;
    std::string e = alternatives();
    if (!at_end()) fail(pos_, "unbalanced ')'");
    return e;
  }

 private:
  [[noreturn]] void fail(size_t at, std::string m) const { throw RegexError{at, std::move(m)}; }
  bool at_end() const { return pos_ >= re_.size(); }
  char peek() const { return at_end() ? '\0' : re_[pos_]; }

  std::string alternatives() {
    std::vector<std::string> alts = {sequence()};
    while (peek() == '|') {
      ++pos_;
      alts.push_back(sequence());
    }
    if (alts.size() == 1) return alts[0];
    std::string out = "(";
    for (size_t i = 0; i < alts.size(); ++i) out += (i > 0 ? " | " : "") + alts[i];
    return out + ")";
  }

  std::string sequence() {
    std::string out;
    while (!at_end() && peek() != '|' && peek() != ')') {
      if (peek() == '$' && pos_ + 1 == re_.size()) {
        ++pos_;
        break;
      }
      std::string item = atom();
      item += quantifier();
      out += (out.empty() ? "" : " ") + item;
    }
    return out.empty() ? "\"\"" : out;
  }

  std::string quantifier() {
    std::string q;
    const char c = peek();
    if (c == '*' || c == '+' || c == '?') {
      ++pos_;
      q = std::string(1, c);
    } else if (c == '{') {
      const size_t start = pos_++;
      q.push_back('{');
      append_number(start, &q);
      if (peek() == ',') {
        ++pos_;
        q.push_back(',');
        if (peek() != '}') append_number(start, &q);
      }
      if (peek() != '}') fail(start, "malformed repetition {m,n}");
      ++pos_;
      q.push_back('}');
    } else {
      return q;
    }
    if (peek() == '?') ++pos_;  // lazy: the same language
    if (peek() == '+') fail(pos_, "possessive quantifier is not supported");
    if (peek() == '*' || peek() == '{') fail(pos_, "nested quantifier");
    return q;
  }

  void append_number(size_t start, std::string* out) {
    size_t n = 0;
    while (peek() >= '0' && peek() <= '9') {
      out->push_back(re_[pos_++]);
      ++n;
    }
    if (n == 0 || n > 5) fail(start, "malformed repetition {m,n}");
  }

  std::string atom() {
    const size_t start = pos_;
    const char c = re_[pos_];
    if (c == '(') {
      ++pos_;
      if (peek() == '?') {
        if (re_.substr(pos_, 2) == "?:") {
          pos_ += 2;
        } else if (re_.substr(pos_, 3) == "?P<" || (re_.substr(pos_, 2) == "?<" && pos_ + 2 < re_.size() &&
                                                    re_[pos_ + 2] != '=' && re_[pos_ + 2] != '!')) {
          while (!at_end() && peek() != '>') ++pos_;
          if (at_end()) fail(start, "unterminated group name");
          ++pos_;
        } else if (re_.substr(pos_, 2) == "?=" || re_.substr(pos_, 2) == "?!" ||
                   re_.substr(pos_, 3) == "?<=" || re_.substr(pos_, 3) == "?<!") {
          fail(start, "lookaround is not supported");
        } else {
          fail(start, "group flags '(?...' are not supported");
        }
      }
      if (++depth_ > kMaxNesting) fail(start, "groups nested deeper than " + std::to_string(kMaxNesting));
      std::string inner = alternatives();
      if (peek() != ')') fail(start, "unbalanced '('");
      ++pos_;
      --depth_;
      return "(" + inner + ")";
    }
    if (c == '[') return klass();
    if (c == '.') {
      ++pos_;
      CodepointSet all = CodepointSet::all();
      CodepointSet nl;
      nl.add('\n');
      return class_text(all.minus(nl), start);
    }
    if (c == '*' || c == '+' || c == '?' || c == '{')
      fail(start, std::string("'") + c + "' with nothing to repeat");
    if (c == '^') fail(start, "anchor '^' inside the pattern is not supported");
    if (c == '$') fail(start, "anchor '$' inside the pattern is not supported");
    if (c == '\\') {
      CodepointSet set;
      if (escape(&set, false)) return class_text(set, start);
      return literal(set.ranges()[0].first);
    }
    return literal(utf8_char());
  }

  uint32_t utf8_char() {
    const auto c = static_cast<unsigned char>(re_[pos_++]);
    if (c < 0x80) return c;
    const int n = c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : c >= 0xC0 ? 1 : -1;
    if (n < 0) fail(pos_ - 1, "invalid UTF-8");
    uint32_t cp = c & (0x3F >> n);
    for (int i = 0; i < n; ++i) {
      if (at_end() || (static_cast<unsigned char>(re_[pos_]) & 0xC0) != 0x80) fail(pos_, "invalid UTF-8");
      cp = (cp << 6) | (static_cast<unsigned char>(re_[pos_++]) & 0x3F);
    }
    return cp;
  }

  uint32_t hex(int digits, size_t start) {
    uint32_t v = 0;
    for (int i = 0; i < digits; ++i) {
      const char h = peek();
      int d = -1;
      if (h >= '0' && h <= '9') d = h - '0';
      if (h >= 'a' && h <= 'f') d = h - 'a' + 10;
      if (h >= 'A' && h <= 'F') d = h - 'A' + 10;
      if (d < 0) fail(start, "malformed hex escape");
      v = v * 16 + static_cast<uint32_t>(d);
      ++pos_;
    }
    return v;
  }

  // At a backslash: fills `set`; true when it is a class (\d ...), false for one character.
  bool escape(CodepointSet* set, bool in_class) {
    const size_t start = pos_++;
    if (at_end()) fail(start, "trailing backslash");
    const char e = re_[pos_++];
    CodepointSet s;
    switch (e) {
      case 'd': s.add_range('0', '9'); break;
      case 'w':
        s.add_range('a', 'z');
        s.add_range('A', 'Z');
        s.add_range('0', '9');
        s.add('_');
        break;
      case 's':
        for (char w : std::string(" \t\n\r\f\v")) s.add(static_cast<unsigned char>(w));
        break;
      case 'D':
      case 'W':
      case 'S': {
        if (in_class) fail(start, std::string("\\") + e + " inside a class is not supported");
        CodepointSet positive;
        if (e == 'D') positive.add_range('0', '9');
        if (e == 'W') {
          positive.add_range('a', 'z');
          positive.add_range('A', 'Z');
          positive.add_range('0', '9');
          positive.add('_');
        }
        if (e == 'S') {
          for (char w : std::string(" \t\n\r\f\v")) positive.add(static_cast<unsigned char>(w));
        }
        *set = positive.complement();
        return true;
      }
      case 'n': s.add('\n'); break;
      case 't': s.add('\t'); break;
      case 'r': s.add('\r'); break;
      case 'f': s.add('\f'); break;
      case 'v': s.add('\v'); break;
      case '0': s.add(0); break;
      case 'x': s.add(hex(2, start)); break;
      case 'u': s.add(hex(4, start)); break;
      case 'b':
      case 'B': fail(start, std::string("\\") + e + " (word boundary) is not supported");
      default:
        if (e >= '1' && e <= '9') fail(start, "backreference is not supported");
        if ((e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z'))
          fail(start, std::string("escape \\") + e + " is not supported");
        s.add(static_cast<unsigned char>(e));
        *set = s;
        return false;
    }
    *set = s;
    return e == 'd' || e == 'w' || e == 's';
  }

  std::string klass() {
    const size_t start = pos_++;
    bool negated = false;
    if (peek() == '^') {
      negated = true;
      ++pos_;
    }
    CodepointSet set;
    bool first = true;
    while (at_end() || peek() != ']' || first) {
      if (at_end()) fail(start, "unterminated character class");
      first = false;
      uint32_t lo;
      if (peek() == '\\') {
        CodepointSet one;
        if (escape(&one, true)) {
          set.add_set(one);
          continue;
        }
        lo = one.ranges()[0].first;
      } else if (peek() == '[' && re_.substr(pos_, 2) == "[:") {
        fail(pos_, "POSIX classes [:name:] are not supported");
      } else {
        lo = utf8_char();
      }
      uint32_t hi = lo;
      if (peek() == '-' && pos_ + 1 < re_.size() && re_[pos_ + 1] != ']') {
        ++pos_;
        if (peek() == '\\') {
          CodepointSet one;
          if (escape(&one, true)) fail(pos_, "a class escape cannot end a range");
          hi = one.ranges()[0].first;
        } else {
          hi = utf8_char();
        }
        if (hi < lo) fail(start, "character range out of order");
      }
      set.add_range(lo, hi);
    }
    ++pos_;
    return class_text(negated ? set.complement() : set, start);
  }

  std::string class_text(CodepointSet set, size_t at) const {
    if (json_) set = set.minus(json_unsafe());
    if (set.empty()) fail(at, "character class matches no character");
    std::string out = "[";
    for (const auto& [lo, hi] : set.ranges()) {
      out += class_char(lo);
      if (hi > lo) {
        out += '-';
        out += class_char(hi);
      }
    }
    return out + "]";
  }

  // One literal character; in a JSON string, as the escape JSON writes it.
  std::string literal(uint32_t c) const {
    if (json_) {
      if (c == '"') return gbnf_literal("\\\"");
      if (c == '\\') return gbnf_literal("\\\\");
      if (c == '\n') return gbnf_literal("\\n");
      if (c == '\t') return gbnf_literal("\\t");
      if (c == '\r') return gbnf_literal("\\r");
      if (c < 0x20) {
        char buf[8];
        std::snprintf(buf, sizeof buf, "\\u%04x", c);
        return gbnf_literal(buf);
      }
    }
    return gbnf_literal(utf8_encode(c));
  }

  // Groups nest at most this deep (the translation recurses once per level, and so do the GBNF
  // reader and compiler after it, whose own limit is 256 with the JSON schema's groups around).
  static constexpr int kMaxNesting = 128;
  std::string_view re_;
  bool json_;
  size_t pos_ = 0;
  int depth_ = 0;
};

}  // namespace

Expected<std::string> regex_to_gbnf(std::string_view regex, bool in_json_string) {
  try {
    RegexTranslator t(regex, in_json_string);
    return t.translate();
  } catch (const RegexError& e) {
    return invalid_argument("regex: " + e.message + " at offset " + std::to_string(e.offset) + " of '" +
                            std::string(regex) + "'");
  }
}

}  // namespace inferd
