#include "jinja/jinja_expr_parser.h"

namespace inferd::jinja {

const Token& TokenStream::look(size_t ahead) const {
  return tokens_[std::min(index_ + ahead, tokens_.size() - 1)];
}

const Token& TokenStream::next() {
  const Token& t = tokens_[index_];
  if (index_ + 1 < tokens_.size()) ++index_;
  return t;
}

bool TokenStream::at_op(std::string_view op) const {
  return current().kind == TokenKind::kOperator && current().text == op;
}
bool TokenStream::at_name(std::string_view name) const {
  return current().kind == TokenKind::kName && current().text == name;
}
bool TokenStream::skip_op(std::string_view op) {
  if (!at_op(op)) return false;
  next();
  return true;
}
bool TokenStream::skip_name(std::string_view name) {
  if (!at_name(name)) return false;
  next();
  return true;
}
Status TokenStream::expect_op(std::string_view op) {
  return skip_op(op) ? Status::ok() : unexpected(std::string("'") + std::string(op) + "'");
}
Status TokenStream::expect_name(std::string_view name) {
  return skip_name(name) ? Status::ok() : unexpected(std::string("'") + std::string(name) + "'");
}
Status TokenStream::expect(TokenKind kind) {
  if (current().kind != kind) return unexpected(describe(Token{kind, "", 0, 0.0, {}}));
  next();
  return Status::ok();
}
Expected<std::string> TokenStream::expect_identifier() {
  if (current().kind != TokenKind::kName) return unexpected("a name");
  return next().text;
}
Status TokenStream::unexpected(std::string_view what) const {
  return error_at(current().pos,
                  std::string("expected ") + std::string(what) + std::string(", got ") + describe(current()));
}

std::string describe(const Token& token) {
  switch (token.kind) {
    case TokenKind::kText: return "template text";
    case TokenKind::kVariableBegin: return "'{{'";
    case TokenKind::kVariableEnd: return "end of print statement ('}}')";
    case TokenKind::kBlockBegin: return "'{%'";
    case TokenKind::kBlockEnd: return "end of statement block ('%}')";
    case TokenKind::kName:
    case TokenKind::kOperator: return "'" + token.text + "'";
    case TokenKind::kString: return "string literal";
    case TokenKind::kInteger:
    case TokenKind::kFloat: return "number " + token.text;
    case TokenKind::kEnd: return "end of template";
  }
  return "token";
}

}  // namespace inferd::jinja
