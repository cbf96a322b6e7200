// Jinja lexer: splits a chat template into text and tag tokens, applying the whitespace control
// of transformers' environment (trim_blocks, lstrip_blocks, `-`/`+` markers). First stage of
// ChatTemplate::compile; the parser consumes its tokens.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace inferd::jinja {

// 1-based line and column (in code points) of the template text.
struct SourcePos {
  int line = 1;
  int column = 1;
};

// "chat template line L:C: <message>" with the given code.
Status error_at(SourcePos pos, const std::string& message, StatusCode code = StatusCode::kInvalidArgument);

enum class TokenKind {
  kText,           // template data, already whitespace-controlled
  kVariableBegin,  // {{
  kVariableEnd,    // }}
  kBlockBegin,     // {%
  kBlockEnd,       // %}
  kName,           // identifier or keyword (if, for, and, true, ...)
  kString,         // string literal, escapes resolved
  kInteger,
  kFloat,
  kOperator,  // + - * / // % ** ~ == != < <= > >= = . : | , ( ) [ ] { }
  kEnd,       // end of the template
};

struct Token {
  TokenKind kind = TokenKind::kEnd;
  std::string text;  // data, name, literal value or operator
  int64_t int_value = 0;
  double float_value = 0.0;
  SourcePos pos;
};

// Tokens of `source` (newlines normalized to \n, one trailing newline dropped, as Jinja does),
// ending with kEnd. An unterminated tag, comment, string or raw block, or a character no token
// starts with, is an error naming its line:column.
Expected<std::vector<Token>> tokenize(std::string_view source);

}  // namespace inferd::jinja
