// Token stream and expression parser of the Jinja parser: jinja2's expression grammar
// (conditional > or > and > not > compare > +,- > ~ > *,/,//,% > ** > unary > filters, tests and
// postfix). The statement parser (jinja_parser.cpp) drives it.
#pragma once

#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "jinja/jinja_ast.h"
#include "jinja/jinja_lexer.h"

namespace inferd::jinja {

class TokenStream final {
 public:
  explicit TokenStream(std::vector<Token> tokens) : tokens_(std::move(tokens)) {}

  const Token& current() const { return tokens_[index_]; }
  // The token `ahead` places after the current one (the end token past the end).
  const Token& look(size_t ahead = 1) const;
  // Consumes and returns the current token (the end token is never consumed).
  const Token& next();
  bool at_op(std::string_view op) const;
  bool at_name(std::string_view name) const;
  bool skip_op(std::string_view op);
  bool skip_name(std::string_view name);
  Status expect_op(std::string_view op);
  Status expect_name(std::string_view name);
  Status expect(TokenKind kind);
  Expected<std::string> expect_identifier();
  // "expected <what>, got <current token>" at the current token.
  Status unexpected(std::string_view what) const;

 private:
  std::vector<Token> tokens_;
  size_t index_ = 0;
};

// Human-readable token for messages: 'name', "end of statement block", "end of template".
std::string describe(const Token& token);

class ExpressionParser final {
 public:
  explicit ExpressionParser(TokenStream* stream) : stream_(stream) {}

  // jinja2's parse_tuple: one expression, or a tuple when commas follow. `extra_end` names
  // keywords that end the tuple (e.g. "in" after for targets).
  Expected<ExprPtr> parse_tuple(bool with_condexpr = true,
                                std::initializer_list<std::string_view> extra_end = {},
                                bool explicit_parentheses = false);
  Expected<ExprPtr> parse_expression(bool with_condexpr = true);
  // `| name(args) | ...`; with start_inline the first `|` is implied (filter blocks). `input`
  // may be null (the body of a filter or set block).
  Expected<ExprPtr> parse_filter(ExprPtr input, bool start_inline);

  // Counts nesting shared with the statement parser; an error once past kMaxParseNesting.
  Status enter(SourcePos pos);
  void leave() { --nesting_; }

 private:
  Expected<ExprPtr> parse_condexpr();
  Expected<ExprPtr> parse_or();
  Expected<ExprPtr> parse_and();
  Expected<ExprPtr> parse_not();
  Expected<ExprPtr> parse_compare();
  Expected<ExprPtr> parse_math1();
  Expected<ExprPtr> parse_concat();
  Expected<ExprPtr> parse_math2();
  Expected<ExprPtr> parse_pow();
  Expected<ExprPtr> parse_unary(bool with_filter);
  Expected<ExprPtr> parse_unary_nested(bool with_filter);
  Expected<ExprPtr> parse_primary();
  Expected<ExprPtr> parse_list_or_dict(bool dict);
  Expected<ExprPtr> parse_postfix(ExprPtr node);
  Expected<ExprPtr> parse_filter_expr(ExprPtr node);
  Expected<ExprPtr> parse_subscript(ExprPtr node);
  Expected<ExprPtr> parse_call(ExprPtr node);
  Status parse_call_args(Expr* call);
  Expected<ExprPtr> parse_test(ExprPtr node);

  // Sets the node's depth from its children; an error past kMaxExprDepth.
  Expected<ExprPtr> finish(ExprPtr node);

  TokenStream* stream_;
  int nesting_ = 0;
};

// A new node of `kind` at `pos` with the given children.
ExprPtr make_expr(ExprKind kind, SourcePos pos, std::vector<ExprPtr> args = {});

}  // namespace inferd::jinja
