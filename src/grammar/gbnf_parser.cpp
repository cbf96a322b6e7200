#include "grammar/gbnf_parser.h"

#include <algorithm>
#include <set>
#include <string>

namespace inferd {

namespace {

// Thrown inside this file only; read_gbnf turns it into a Status.
struct GbnfSyntaxError {
  size_t offset;
  std::string message;
};

bool is_word_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

class GbnfReader final {
 public:
  explicit GbnfReader(std::string_view text) : text_(text) {
    for (size_t i = 0; i < text_.size(); ++i) {
      if (text_[i] == '\n') line_starts_.push_back(i + 1);
    }
  }

  std::vector<GbnfRule> read() {
    std::vector<GbnfRule> rules;
    std::set<std::string> defined;
    skip_space(true);
    while (!at_end()) {
      GbnfRule rule;
      const size_t name_at = pos_;
      rule.name = read_name();
      line_column(name_at, &rule.line, &rule.column);
      if (!defined.insert(rule.name).second) fail(name_at, "rule '" + rule.name + "' is defined twice");
      skip_space(false);
      if (text_.substr(pos_, 3) != "::=") fail(pos_, "expected '::=' after rule name '" + rule.name + "'");
      pos_ += 3;
      skip_space(true);
      rule.body = read_alternatives(false);
      if (!at_end() && peek() != '\n' && peek() != '\r')
        fail(pos_, "expected a newline or the end of the grammar");
      skip_space(true);
      rules.push_back(std::move(rule));
    }
    return rules;
  }

  // 1-based; a column counts bytes. A binary search of the line starts: a generated grammar has a
  // reference on every line, and scanning from the start for each made reading it quadratic.
  void line_column(size_t offset, int* line, int* column) const {
    offset = std::min(offset, text_.size());
    const auto after = std::upper_bound(line_starts_.begin(), line_starts_.end(), offset);
    const size_t start = after == line_starts_.begin() ? 0 : *(after - 1);
    *line = static_cast<int>(after - line_starts_.begin()) + 1;
    *column = static_cast<int>(offset - start) + 1;
  }

 private:
  [[noreturn]] void fail(size_t offset, std::string message) const {
    throw GbnfSyntaxError{offset, std::move(message)};
  }
  bool at_end() const { return pos_ >= text_.size(); }
  char peek() const { return at_end() ? '\0' : text_[pos_]; }

  // Spaces, tabs and comments; newlines too when `newline_ok` (inside parentheses, after `|`).
  void skip_space(bool newline_ok) {
    while (!at_end()) {
      const char c = text_[pos_];
      if (c == ' ' || c == '\t') {
        ++pos_;
      } else if (c == '#') {
        while (!at_end() && text_[pos_] != '\n' && text_[pos_] != '\r') ++pos_;
      } else if (newline_ok && (c == '\n' || c == '\r')) {
        ++pos_;
      } else {
        break;
      }
    }
  }

  std::string read_name() {
    const size_t start = pos_;
    while (!at_end() && is_word_char(text_[pos_])) ++pos_;
    if (pos_ == start) fail(start, "expected a rule name");
    return std::string(text_.substr(start, pos_ - start));
  }

  uint32_t read_hex(int digits) {
    uint32_t v = 0;
    for (int i = 0; i < digits; ++i) {
      const char c = peek();
      int d = -1;
      if (c >= '0' && c <= '9') d = c - '0';
      if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
      if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
      if (d < 0) fail(pos_, "expected " + std::to_string(digits) + " hex digits");
      v = v * 16 + static_cast<uint32_t>(d);
      ++pos_;
    }
    return v;
  }

  // One character of a literal or class: a UTF-8 code point or an escape.
  uint32_t read_char() {
    if (at_end()) fail(pos_, "unexpected end of the grammar");
    const size_t start = pos_;
    const auto c = static_cast<unsigned char>(text_[pos_++]);
    if (c == '\\') {
      const char e = peek();
      ++pos_;
      switch (e) {
        case 'x': return read_hex(2);
        case 'u': return read_hex(4);
        case 'U': {
          const uint32_t v = read_hex(8);
          if (v > kMaxCodepoint) fail(start, "escape beyond U+10FFFF");
          return v;
        }
        case 'n': return '\n';
        case 't': return '\t';
        case 'r': return '\r';
        case '\\':
        case '"':
        case '[':
        case ']':
        case '-':
        case '^': return static_cast<unsigned char>(e);
        default: fail(start, std::string("unknown escape '\\") + e + "'");
      }
    }
    if (c < 0x80) return c;
    int n = c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : c >= 0xC0 ? 1 : -1;
    if (n < 0 || c > 0xF4) fail(start, "invalid UTF-8 in the grammar text");
    uint32_t cp = c & (0x3F >> n);
    for (int i = 0; i < n; ++i) {
      const auto d = static_cast<unsigned char>(peek());
      if ((d & 0xC0) != 0x80) fail(start, "invalid UTF-8 in the grammar text");
      cp = (cp << 6) | (d & 0x3F);
      ++pos_;
    }
    return cp;
  }

  GbnfExpr read_alternatives(bool nested) {
    GbnfExpr alts;
    alts.kind = GbnfExpr::Kind::kAlternatives;
    alts.children.push_back(read_sequence(nested));
    while (true) {
      // A rule may go on with `|` at the start of its next line (an extension of llama.cpp's syntax).
      const size_t here = pos_;
      skip_space(true);
      if (peek() != '|') {
        pos_ = here;
        break;
      }
      ++pos_;
      skip_space(true);
      alts.children.push_back(read_sequence(nested));
    }
    return alts;
  }

  static GbnfExpr codepoints(CodepointSet set) {
    GbnfExpr e;
    e.kind = GbnfExpr::Kind::kCodepoints;
    e.codepoints = std::move(set);
    return e;
  }

  GbnfExpr read_sequence(bool nested) {
    GbnfExpr seq;
    seq.kind = GbnfExpr::Kind::kSequence;
    while (!at_end()) {
      const char c = peek();
      if (c == '"') {
        const size_t open = pos_++;
        GbnfExpr lit;
        lit.kind = GbnfExpr::Kind::kSequence;
        while (peek() != '"') {
          if (at_end()) fail(open, "unterminated string literal");
          CodepointSet one;
          one.add(read_char());
          lit.children.push_back(codepoints(std::move(one)));
        }
        ++pos_;
        seq.children.push_back(std::move(lit));
      } else if (c == '[') {
        ++pos_;
        seq.children.push_back(read_class());
      } else if (c == '.') {
        ++pos_;
        seq.children.push_back(codepoints(CodepointSet::all()));
      } else if (is_word_char(c)) {
        GbnfExpr ref;
        ref.kind = GbnfExpr::Kind::kRuleRef;
        line_column(pos_, &ref.line, &ref.column);
        ref.name = read_name();
        seq.children.push_back(std::move(ref));
      } else if (c == '(') {
        if (++depth_ > kMaxNesting) fail(pos_, "groups nested deeper than " + std::to_string(kMaxNesting));
        ++pos_;
        skip_space(true);
        GbnfExpr group = read_alternatives(true);
        if (peek() != ')') fail(pos_, "expected ')'");
        ++pos_;
        --depth_;
        seq.children.push_back(std::move(group));
      } else if (c == '*' || c == '+' || c == '?' || c == '{') {
        if (seq.children.empty()) fail(pos_, std::string("'") + c + "' with nothing before it to repeat");
        read_repetition(&seq.children.back());
      } else {
        break;
      }
      skip_space(nested);
    }
    return seq;
  }

  GbnfExpr read_class() {
    const size_t open = pos_ - 1;
    CodepointSet set;
    bool negated = false;
    if (peek() == '^') {
      negated = true;
      ++pos_;
    }
    while (peek() != ']') {
      if (at_end()) fail(open, "unterminated character class");
      const uint32_t lo = read_char();
      uint32_t hi = lo;
      if (peek() == '-' && pos_ + 1 < text_.size() && text_[pos_ + 1] != ']') {
        const size_t at = pos_;
        ++pos_;
        hi = read_char();
        if (hi < lo) fail(at, "character range out of order");
      }
      set.add_range(lo, hi);
    }
    ++pos_;
    return codepoints(negated ? set.complement() : set);
  }

  int read_count() {
    const size_t start = pos_;
    long v = 0;
    while (peek() >= '0' && peek() <= '9') {
      v = v * 10 + (peek() - '0');
      if (v > kMaxRepeat) fail(start, "repetition count above " + std::to_string(kMaxRepeat));
      ++pos_;
    }
    if (pos_ == start) fail(start, "expected a repetition count");
    return static_cast<int>(v);
  }

  void read_repetition(GbnfExpr* last) {
    // A repetition of a repetition nests like a group ("a"**** ...).
    int stacked = 1;
    for (const GbnfExpr* e = last; e->kind == GbnfExpr::Kind::kRepeat; e = &e->children[0]) {
      if (++stacked + depth_ > kMaxNesting)
        fail(pos_, "groups and repetitions nested deeper than " + std::to_string(kMaxNesting));
    }
    GbnfExpr rep;
    rep.kind = GbnfExpr::Kind::kRepeat;
    const char c = text_[pos_++];
    if (c == '*') {
      rep.min = 0;
    } else if (c == '+') {
      rep.min = 1;
    } else if (c == '?') {
      rep.min = 0;
      rep.max = 1;
    } else {
      skip_space(true);
      rep.min = read_count();
      skip_space(true);
      if (peek() == ',') {
        ++pos_;
        skip_space(true);
        if (peek() != '}') {
          const size_t at = pos_;
          rep.max = read_count();
          if (*rep.max < rep.min) fail(at, "repetition maximum below its minimum");
        }
      } else {
        rep.max = rep.min;
      }
      skip_space(true);
      if (peek() != '}') fail(pos_, "expected '}'");
      ++pos_;
    }
    rep.children.push_back(std::move(*last));
    *last = std::move(rep);
  }

  static constexpr long kMaxRepeat = 100000;
  // Groups (and stacked repetitions) nest at most this deep: reading, compiling and freeing a
  // grammar recurse once per level, and a request must not overflow the server's stack.
  static constexpr int kMaxNesting = 256;
  std::string_view text_;
  std::vector<size_t> line_starts_;  // offsets just after each newline
  size_t pos_ = 0;
  int depth_ = 0;  // groups open around pos_
};

}  // namespace

Expected<std::vector<GbnfRule>> read_gbnf(std::string_view text) {
  GbnfReader reader(text);
  try {
    return reader.read();
  } catch (const GbnfSyntaxError& e) {
    int line = 0, column = 0;
    reader.line_column(e.offset, &line, &column);
    return invalid_argument("gbnf: line " + std::to_string(line) + ", column " + std::to_string(column) +
                            ": " + e.message);
  }
}

}  // namespace inferd
