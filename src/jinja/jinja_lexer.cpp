#include "jinja/jinja_lexer.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdlib>

#include "jinja/jinja_strings.h"

namespace inferd::jinja {

namespace {

constexpr std::string_view kTwoCharOperators[] = {"//", "**", "==", "!=", ">=", "<="};
constexpr std::string_view kOneCharOperators = "+-/*%~[](){}<>=.:|,;";

bool is_digit(char c) {
  return c >= '0' && c <= '9';
}
bool is_name_start(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}
bool is_name_char(char c) {
  return is_name_start(c) || is_digit(c);
}

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Jinja splits the source on \r\n, \r and \n, rejoins with \n and drops one trailing newline.
std::string normalize_newlines(std::string_view source) {
  std::string out;
  out.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      out += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      out += source[i];
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

// Python's unicode-escape decoding of a string literal's body (non-ASCII text passes through).
Expected<std::string> unescape(std::string_view body, SourcePos pos) {
  std::string out;
  for (size_t i = 0; i < body.size(); ++i) {
    if (body[i] != '\\' || i + 1 >= body.size()) {
      out += body[i];
      continue;
    }
    const char e = body[++i];
    switch (e) {
      case '\n': break;
      case '\\':
      case '\'':
      case '"': out += e; break;
      case 'a': out += '\a'; break;
      case 'b': out += '\b'; break;
      case 'f': out += '\f'; break;
      case 'n': out += '\n'; break;
      case 'r': out += '\r'; break;
      case 't': out += '\t'; break;
      case 'v': out += '\v'; break;
      case 'x':
      case 'u':
      case 'U': {
        const size_t width = e == 'x' ? 2 : e == 'u' ? 4 : 8;
        char32_t c = 0;
        for (size_t k = 1; k <= width; ++k) {
          const int d = i + k < body.size() ? hex_digit(body[i + k]) : -1;
          if (d < 0) return error_at(pos, std::string("truncated \\") + e + " escape in string literal");
          c = c * 16 + static_cast<char32_t>(d);
        }
        if (c > 0x10ffff) return error_at(pos, "\\U escape outside Unicode in string literal");
        append_utf8(c, &out);
        i += width;
        break;
      }
      default:
        if (e >= '0' && e <= '7') {
          char32_t c = static_cast<char32_t>(e - '0');
          for (int k = 0; k < 2 && i + 1 < body.size() && body[i + 1] >= '0' && body[i + 1] <= '7'; ++k) {
            c = c * 8 + static_cast<char32_t>(body[++i] - '0');
          }
          append_utf8(c, &out);
        } else if (e == 'N') {
          return error_at(pos, "\\N{...} escapes are not supported in string literals",
                          StatusCode::kUnsupported);
        } else {
          out += '\\';
          out += e;
        }
    }
  }
  return out;
}

class Lexer final {
 public:
  explicit Lexer(std::string source) : src_(std::move(source)) {
    line_starts_.push_back(0);
    for (size_t i = 0; i < src_.size(); ++i) {
      if (src_[i] == '\n') line_starts_.push_back(i + 1);
    }
  }

  Expected<std::vector<Token>> run() {
    const size_t n = src_.size();
    while (pos_ < n) {
      const size_t tag = find_tag(pos_);
      if (tag == std::string::npos) {
        emit_text(src_.substr(pos_), pos_);
        break;
      }
      const char kind = src_[tag + 1];
      size_t body = tag + 2;
      char sign = 0;
      if (body < n && (src_[body] == '-' || src_[body] == '+')) sign = src_[body++];
      const size_t raw_end = kind == '%' ? match_raw_begin(tag) : 0;
      emit_text(control_text(src_.substr(pos_, tag - pos_), sign, kind == '{'), pos_);
      if (raw_end != 0) {
        INFERD_RETURN_IF_ERROR(lex_raw(tag, raw_end));
      } else if (kind == '#') {
        INFERD_RETURN_IF_ERROR(lex_comment(tag, body));
      } else {
        INFERD_RETURN_IF_ERROR(lex_tag(kind == '%', tag, body));
      }
    }
    tokens_.push_back(Token{TokenKind::kEnd, "", 0, 0.0, pos_of(n)});
    return std::move(tokens_);
  }

 private:
  // Tokens are located in increasing order, so the column is counted on from the last one.
  SourcePos pos_of(size_t offset) const {
    const auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), offset) - 1;
    const int line = static_cast<int>(it - line_starts_.begin()) + 1;
    size_t from = *it;
    int column = 1;
    if (line == cached_.line && offset >= cached_offset_) {
      from = cached_offset_;
      column = cached_.column;
    }
    column += static_cast<int>(count_code_points(std::string_view(src_).substr(from, offset - from)));
    cached_ = SourcePos{line, column};
    cached_offset_ = offset;
    return cached_;
  }

  void emit_text(std::string text, size_t offset) {
    if (!text.empty()) tokens_.push_back(Token{TokenKind::kText, std::move(text), 0, 0.0, pos_of(offset)});
  }

  size_t skip_space(size_t p) const {
    while (p < src_.size()) {
      size_t next = p;
      if (!is_py_space(next_code_point(src_, &next))) break;
      p = next;
    }
    return p;
  }

  bool at(size_t p, std::string_view s) const { return src_.compare(p, s.size(), s) == 0; }

  size_t find_tag(size_t from) const {
    for (size_t i = src_.find('{', from); i != std::string::npos; i = src_.find('{', i + 1)) {
      if (i + 1 < src_.size() && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) return i;
    }
    return std::string::npos;
  }

  // The data before a tag: `-` strips all trailing whitespace; otherwise (lstrip_blocks) block
  // and comment tags remove the spaces between the line start and the tag.
  std::string control_text(std::string_view text, char sign, bool is_variable) const {
    if (sign == '-') return py_strip(text, std::nullopt, false, true);
    if (sign == '+' || is_variable) return std::string(text);
    const size_t newline = text.rfind('\n');
    const size_t line_start = newline == std::string_view::npos ? 0 : newline + 1;
    if (line_start > 0 || line_starting_) {
      const std::string_view tail = text.substr(line_start);
      if (!tail.empty() && py_strip(tail, std::nullopt, true, false).empty()) {
        return std::string(text.substr(0, line_start));
      }
    }
    return std::string(text);
  }

  // End of `{%[-+] raw [-]%}` starting at `tag`, or 0.
  size_t match_raw_begin(size_t tag) const {
    size_t p = tag + 2;
    if (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) ++p;
    p = skip_space(p);
    if (!at(p, "raw")) return 0;
    p = skip_space(p + 3);
    if (at(p, "-%}")) return skip_space(p + 3);
    return at(p, "%}") ? p + 2 : 0;
  }

  void finish_tag(size_t end) {
    pos_ = end;
    line_starting_ = end > 0 && src_[end - 1] == '\n';
  }

  Status lex_raw(size_t tag, size_t body) {
    line_starting_ = src_[body - 1] == '\n';
    if (body == src_.size()) {  // jinja2 accepts a raw block opened at the very end
      finish_tag(body);
      return Status::ok();
    }
    for (size_t r = src_.find("{%", body); r != std::string::npos; r = src_.find("{%", r + 1)) {
      size_t p = r + 2;
      const char sign = p < src_.size() && (src_[p] == '-' || src_[p] == '+') ? src_[p++] : 0;
      p = skip_space(p);
      if (!at(p, "endraw")) continue;
      p = skip_space(p + 6);
      size_t end = 0;
      if (at(p, "+%}")) {
        end = p + 3;
      } else if (at(p, "-%}")) {
        end = skip_space(p + 3);
      } else if (at(p, "%}")) {
        end = p + 2 < src_.size() && src_[p + 2] == '\n' ? p + 3 : p + 2;
      } else {
        continue;
      }
      emit_text(control_text(std::string_view(src_).substr(body, r - body), sign, false), body);
      finish_tag(end);
      return Status::ok();
    }
    return error_at(pos_of(tag), "missing end of raw directive ({% endraw %})");
  }

  Status lex_comment(size_t tag, size_t body) {
    if (body == src_.size()) {  // jinja2 accepts a comment opened at the very end
      finish_tag(body);
      return Status::ok();
    }
    const size_t close = src_.find("#}", body);
    if (close == std::string::npos) return error_at(pos_of(tag), "missing end of comment tag ('#}')");
    const char sign =
        close >= body + 1 && (src_[close - 1] == '-' || src_[close - 1] == '+') ? src_[close - 1] : 0;
    size_t end = close + 2;
    if (sign == '-') {
      end = skip_space(end);
    } else if (sign == 0 && end < src_.size() && src_[end] == '\n') {
      ++end;
    }
    finish_tag(end);
    return Status::ok();
  }

  // End of the tag's closing marker at p (trim_blocks after %}), or 0.
  size_t match_tag_end(bool block, size_t p) const {
    if (block) {
      if (at(p, "+%}")) return p + 3;
      if (at(p, "-%}")) return skip_space(p + 3);
      if (at(p, "%}")) return p + 2 < src_.size() && src_[p + 2] == '\n' ? p + 3 : p + 2;
      return 0;
    }
    if (at(p, "-}}")) return skip_space(p + 3);
    return at(p, "}}") ? p + 2 : 0;
  }

  Status lex_tag(bool block, size_t tag, size_t body) {
    tokens_.push_back(
        Token{block ? TokenKind::kBlockBegin : TokenKind::kVariableBegin, "", 0, 0.0, pos_of(tag)});
    std::vector<char> closers;
    size_t p = body;
    while (true) {
      if (p >= src_.size()) {
        return error_at(pos_of(tag), block ? "'{%' is never closed by '%}'" : "'{{' is never closed by '}}'");
      }
      if (closers.empty()) {
        const size_t end = match_tag_end(block, p);
        if (end != 0) {
          tokens_.push_back(
              Token{block ? TokenKind::kBlockEnd : TokenKind::kVariableEnd, "", 0, 0.0, pos_of(p)});
          finish_tag(end);
          return Status::ok();
        }
      }
      INFERD_RETURN_IF_ERROR(lex_token(&p, &closers));
    }
  }

  Status lex_token(size_t* p, std::vector<char>* closers) {
    const size_t start = *p;
    const char c = src_[start];
    const SourcePos pos = pos_of(start);
    size_t next = start;
    if (is_py_space(next_code_point(src_, &next))) {
      *p = skip_space(start);
      return Status::ok();
    }
    if (is_digit(c)) return lex_number(p, pos);
    if (is_name_start(c)) {
      while (*p < src_.size() && is_name_char(src_[*p])) ++*p;
      tokens_.push_back(Token{TokenKind::kName, src_.substr(start, *p - start), 0, 0.0, pos});
      return Status::ok();
    }
    if (c == '\'' || c == '"') {
      size_t q = start + 1;
      while (q < src_.size() && src_[q] != c) q += src_[q] == '\\' ? 2 : 1;
      if (q >= src_.size()) return error_at(pos, "unterminated string literal");
      INFERD_ASSIGN_OR_RETURN(std::string value,
                              unescape(std::string_view(src_).substr(start + 1, q - start - 1), pos));
      tokens_.push_back(Token{TokenKind::kString, std::move(value), 0, 0.0, pos});
      *p = q + 1;
      return Status::ok();
    }
    std::string op;
    for (std::string_view two : kTwoCharOperators) {
      if (at(start, two)) op = two;
    }
    if (op.empty() && kOneCharOperators.find(c) != std::string_view::npos) op = std::string(1, c);
    if (op.empty()) return error_at(pos, std::string("unexpected character '") + c + "'");
    if (op == "(" || op == "[" || op == "{") {
      closers->push_back(op == "(" ? ')' : op == "[" ? ']' : '}');
    } else if (op == ")" || op == "]" || op == "}") {
      if (closers->empty()) return error_at(pos, "unexpected '" + op + "'");
      if (closers->back() != c)
        return error_at(pos, "unexpected '" + op + "', expected '" + closers->back() + "'");
      closers->pop_back();
    }
    tokens_.push_back(Token{TokenKind::kOperator, op, 0, 0.0, pos});
    *p = start + op.size();
    return Status::ok();
  }

  size_t scan_digits(size_t p) const {
    while (p < src_.size() &&
           (is_digit(src_[p]) || (src_[p] == '_' && p + 1 < src_.size() && is_digit(src_[p + 1])))) {
      ++p;
    }
    return p;
  }

  Status lex_number(size_t* p, SourcePos pos) {
    const size_t start = *p;
    size_t q = scan_digits(start);
    bool is_float = false;
    // Like jinja2's float rule (?<!\.): after a dot ("x.1.2") only integers follow.
    const bool after_dot = start > 0 && src_[start - 1] == '.';
    if (!after_dot && q + 1 < src_.size() && src_[q] == '.' && is_digit(src_[q + 1])) {
      q = scan_digits(q + 1);
      is_float = true;
    }
    if (!after_dot && q < src_.size() && (src_[q] == 'e' || src_[q] == 'E')) {
      size_t r = q + 1;
      if (r < src_.size() && (src_[r] == '+' || src_[r] == '-')) ++r;
      if (r < src_.size() && is_digit(src_[r])) {
        q = scan_digits(r);
        is_float = true;
      }
    }
    std::string text;
    for (size_t i = start; i < q; ++i) {
      if (src_[i] != '_') text += src_[i];
    }
    Token token{is_float ? TokenKind::kFloat : TokenKind::kInteger, text, 0, 0.0, pos};
    if (is_float) {
      errno = 0;
      token.float_value = std::strtod(text.c_str(), nullptr);
    } else {
      const auto result = std::from_chars(text.data(), text.data() + text.size(), token.int_value);
      if (result.ec != std::errc()) return error_at(pos, "integer literal " + text + " is too large");
    }
    tokens_.push_back(std::move(token));
    *p = q;
    return Status::ok();
  }

  std::string src_;
  std::vector<size_t> line_starts_;
  std::vector<Token> tokens_;
  size_t pos_ = 0;
  bool line_starting_ = true;
  mutable SourcePos cached_{0, 0};
  mutable size_t cached_offset_ = 0;
};

}  // namespace

Status error_at(SourcePos pos, const std::string& message, StatusCode code) {
  return Status(code, std::string("chat template line ") + std::to_string(pos.line) + std::string(":") +
                          std::to_string(pos.column) + ": " + message);
}

Expected<std::vector<Token>> tokenize(std::string_view source) {
  return Lexer(normalize_newlines(source)).run();
}

}  // namespace inferd::jinja
