#include "jinja/jinja_expr_parser.h"

#include <algorithm>

#include "jinja/jinja_builtins.h"
#include "jinja/jinja_parser.h"

namespace inferd::jinja {

namespace {

// Holds one level of parser nesting; enter() must have succeeded.
class NestingLevel final {
 public:
  explicit NestingLevel(ExpressionParser* parser) : parser_(parser) {}
  ~NestingLevel() { parser_->leave(); }
  NestingLevel(const NestingLevel&) = delete;
  NestingLevel& operator=(const NestingLevel&) = delete;

 private:
  ExpressionParser* parser_;
};

Op compare_op(const Token& t) {
  if (t.kind != TokenKind::kOperator) return Op::kNone;
  if (t.text == "==") return Op::kEq;
  if (t.text == "!=") return Op::kNe;
  if (t.text == "<") return Op::kLt;
  if (t.text == "<=") return Op::kLe;
  if (t.text == ">") return Op::kGt;
  if (t.text == ">=") return Op::kGe;
  return Op::kNone;
}

ExprPtr binary(Op op, SourcePos pos, ExprPtr left, ExprPtr right) {
  std::vector<ExprPtr> args;
  args.push_back(std::move(left));
  args.push_back(std::move(right));
  ExprPtr node = make_expr(ExprKind::kBinary, pos, std::move(args));
  node->op = op;
  return node;
}

ExprPtr literal(Value v, SourcePos pos) {
  ExprPtr e = make_expr(ExprKind::kLiteral, pos);
  e->constant = std::move(v);
  return e;
}

}  // namespace

ExprPtr make_expr(ExprKind kind, SourcePos pos, std::vector<ExprPtr> args) {
  auto e = std::make_unique<Expr>();
  e->kind = kind;
  e->pos = pos;
  e->args = std::move(args);
  return e;
}

Status ExpressionParser::enter(SourcePos pos) {
  if (nesting_ >= kMaxParseNesting) {
    return error_at(
        pos, std::string("template nested deeper than ") + std::to_string(kMaxParseNesting) + " levels");
  }
  ++nesting_;
  return Status::ok();
}

Expected<ExprPtr> ExpressionParser::finish(ExprPtr node) {
  int depth = 0;
  for (const ExprPtr& a : node->args) depth = std::max(depth, a ? a->depth : 0);
  for (const auto& [key, a] : node->kwargs) depth = std::max(depth, a->depth);
  node->depth = depth + 1;
  if (node->depth > kMaxExprDepth) {
    return error_at(
        node->pos, std::string("expression nested deeper than ") + std::to_string(kMaxExprDepth) + " levels");
  }
  return node;
}

Expected<ExprPtr> ExpressionParser::parse_tuple(bool with_condexpr,
                                                std::initializer_list<std::string_view> extra_end,
                                                bool explicit_parentheses) {
  const SourcePos pos = stream_->current().pos;
  std::vector<ExprPtr> items;
  bool is_tuple = false;
  while (true) {
    if (!items.empty()) INFERD_RETURN_IF_ERROR(stream_->expect_op(","));
    const Token& t = stream_->current();
    const bool at_end =
        t.kind == TokenKind::kVariableEnd || t.kind == TokenKind::kBlockEnd || stream_->at_op(")") ||
        (t.kind == TokenKind::kName &&
         std::find(extra_end.begin(), extra_end.end(), std::string_view(t.text)) != extra_end.end());
    if (at_end) break;
    INFERD_ASSIGN_OR_RETURN(ExprPtr item, parse_expression(with_condexpr));
    items.push_back(std::move(item));
    if (!stream_->at_op(",")) break;
    is_tuple = true;
  }
  if (!is_tuple) {
    if (!items.empty()) return std::move(items[0]);
    if (!explicit_parentheses) return stream_->unexpected("an expression");
  }
  ExprPtr tuple = make_expr(ExprKind::kList, pos, std::move(items));
  tuple->is_tuple = true;
  return finish(std::move(tuple));
}

Expected<ExprPtr> ExpressionParser::parse_expression(bool with_condexpr) {
  return with_condexpr ? parse_condexpr() : parse_or();
}

Expected<ExprPtr> ExpressionParser::parse_condexpr() {
  INFERD_ASSIGN_OR_RETURN(ExprPtr expr, parse_or());
  while (stream_->at_name("if")) {
    const SourcePos pos = stream_->next().pos;
    INFERD_ASSIGN_OR_RETURN(ExprPtr condition, parse_or());
    ExprPtr otherwise;
    if (stream_->skip_name("else")) {
      INFERD_ASSIGN_OR_RETURN(otherwise, parse_condexpr());
    }
    std::vector<ExprPtr> args;
    args.push_back(std::move(condition));
    args.push_back(std::move(expr));
    args.push_back(std::move(otherwise));
    INFERD_ASSIGN_OR_RETURN(expr, finish(make_expr(ExprKind::kCondition, pos, std::move(args))));
  }
  return expr;
}

Expected<ExprPtr> ExpressionParser::parse_or() {
  INFERD_ASSIGN_OR_RETURN(ExprPtr left, parse_and());
  while (stream_->at_name("or")) {
    const SourcePos pos = stream_->next().pos;
    INFERD_ASSIGN_OR_RETURN(ExprPtr right, parse_and());
    INFERD_ASSIGN_OR_RETURN(left, finish(binary(Op::kOr, pos, std::move(left), std::move(right))));
  }
  return left;
}

Expected<ExprPtr> ExpressionParser::parse_and() {
  INFERD_ASSIGN_OR_RETURN(ExprPtr left, parse_not());
  while (stream_->at_name("and")) {
    const SourcePos pos = stream_->next().pos;
    INFERD_ASSIGN_OR_RETURN(ExprPtr right, parse_not());
    INFERD_ASSIGN_OR_RETURN(left, finish(binary(Op::kAnd, pos, std::move(left), std::move(right))));
  }
  return left;
}

Expected<ExprPtr> ExpressionParser::parse_not() {
  if (!stream_->at_name("not")) return parse_compare();
  const SourcePos pos = stream_->next().pos;
  INFERD_RETURN_IF_ERROR(enter(pos));
  NestingLevel level(this);
  INFERD_ASSIGN_OR_RETURN(ExprPtr operand, parse_not());
  std::vector<ExprPtr> args;
  args.push_back(std::move(operand));
  ExprPtr node = make_expr(ExprKind::kUnary, pos, std::move(args));
  node->op = Op::kNot;
  return finish(std::move(node));
}

Expected<ExprPtr> ExpressionParser::parse_compare() {
  const SourcePos pos = stream_->current().pos;
  INFERD_ASSIGN_OR_RETURN(ExprPtr first, parse_math1());
  std::vector<ExprPtr> operands;
  std::vector<Op> ops;
  while (true) {
    Op op = compare_op(stream_->current());
    if (op != Op::kNone) {
      stream_->next();
    } else if (stream_->skip_name("in")) {
      op = Op::kIn;
    } else if (stream_->at_name("not") && stream_->look().kind == TokenKind::kName &&
               stream_->look().text == "in") {
      stream_->next();
      stream_->next();
      op = Op::kNotIn;
    } else {
      break;
    }
    INFERD_ASSIGN_OR_RETURN(ExprPtr operand, parse_math1());
    ops.push_back(op);
    operands.push_back(std::move(operand));
  }
  if (ops.empty()) return first;
  operands.insert(operands.begin(), std::move(first));
  ExprPtr node = make_expr(ExprKind::kCompare, pos, std::move(operands));
  node->compare_ops = std::move(ops);
  return finish(std::move(node));
}

Expected<ExprPtr> ExpressionParser::parse_math1() {
  INFERD_ASSIGN_OR_RETURN(ExprPtr left, parse_concat());
  while (stream_->at_op("+") || stream_->at_op("-")) {
    const Token& t = stream_->next();
    const Op op = t.text == "+" ? Op::kAdd : Op::kSub;
    const SourcePos pos = t.pos;
    INFERD_ASSIGN_OR_RETURN(ExprPtr right, parse_concat());
    INFERD_ASSIGN_OR_RETURN(left, finish(binary(op, pos, std::move(left), std::move(right))));
  }
  return left;
}

Expected<ExprPtr> ExpressionParser::parse_concat() {
  const SourcePos pos = stream_->current().pos;
  INFERD_ASSIGN_OR_RETURN(ExprPtr first, parse_math2());
  if (!stream_->at_op("~")) return first;
  std::vector<ExprPtr> args;
  args.push_back(std::move(first));
  while (stream_->skip_op("~")) {
    INFERD_ASSIGN_OR_RETURN(ExprPtr next, parse_math2());
    args.push_back(std::move(next));
  }
  return finish(make_expr(ExprKind::kConcat, pos, std::move(args)));
}

Expected<ExprPtr> ExpressionParser::parse_math2() {
  INFERD_ASSIGN_OR_RETURN(ExprPtr left, parse_pow());
  while (stream_->at_op("*") || stream_->at_op("/") || stream_->at_op("//") || stream_->at_op("%")) {
    const Token& t = stream_->next();
    const Op op = t.text == "*"    ? Op::kMul
                  : t.text == "/"  ? Op::kDiv
                  : t.text == "//" ? Op::kFloorDiv
                                   : Op::kMod;
    const SourcePos pos = t.pos;
    INFERD_ASSIGN_OR_RETURN(ExprPtr right, parse_pow());
    INFERD_ASSIGN_OR_RETURN(left, finish(binary(op, pos, std::move(left), std::move(right))));
  }
  return left;
}

Expected<ExprPtr> ExpressionParser::parse_pow() {
  INFERD_ASSIGN_OR_RETURN(ExprPtr left, parse_unary(true));
  while (stream_->at_op("**")) {
    const SourcePos pos = stream_->next().pos;
    INFERD_ASSIGN_OR_RETURN(ExprPtr right, parse_unary(true));
    INFERD_ASSIGN_OR_RETURN(left, finish(binary(Op::kPow, pos, std::move(left), std::move(right))));
  }
  return left;
}

Expected<ExprPtr> ExpressionParser::parse_unary(bool with_filter) {
  INFERD_RETURN_IF_ERROR(enter(stream_->current().pos));
  NestingLevel level(this);
  return parse_unary_nested(with_filter);
}

Expected<ExprPtr> ExpressionParser::parse_unary_nested(bool with_filter) {
  ExprPtr node;
  if (stream_->at_op("-") || stream_->at_op("+")) {
    const Token& t = stream_->next();
    const Op op = t.text == "-" ? Op::kNeg : Op::kPos;
    const SourcePos pos = t.pos;
    INFERD_ASSIGN_OR_RETURN(ExprPtr operand, parse_unary(false));
    std::vector<ExprPtr> args;
    args.push_back(std::move(operand));
    node = make_expr(ExprKind::kUnary, pos, std::move(args));
    node->op = op;
    INFERD_ASSIGN_OR_RETURN(node, finish(std::move(node)));
  } else {
    INFERD_ASSIGN_OR_RETURN(node, parse_primary());
  }
  INFERD_ASSIGN_OR_RETURN(node, parse_postfix(std::move(node)));
  if (with_filter) return parse_filter_expr(std::move(node));
  return node;
}

Expected<ExprPtr> ExpressionParser::parse_primary() {
  const Token& t = stream_->current();
  const SourcePos pos = t.pos;
  switch (t.kind) {
    case TokenKind::kName: {
      const std::string name = stream_->next().text;
      if (name == "true" || name == "True") return literal(Value::from_bool(true), pos);
      if (name == "false" || name == "False") return literal(Value::from_bool(false), pos);
      if (name == "none" || name == "None") return literal(Value::none(), pos);
      ExprPtr e = make_expr(ExprKind::kName, pos);
      e->name = name;
      return e;
    }
    case TokenKind::kString: {
      std::string text;
      while (stream_->current().kind == TokenKind::kString) text += stream_->next().text;
      return literal(Value::from_string(std::move(text)), pos);
    }
    case TokenKind::kInteger: return literal(Value::from_int(stream_->next().int_value), pos);
    case TokenKind::kFloat: return literal(Value::from_float(stream_->next().float_value), pos);
    default: break;
  }
  if (stream_->skip_op("(")) {
    INFERD_ASSIGN_OR_RETURN(ExprPtr inner, parse_tuple(true, {}, true));
    INFERD_RETURN_IF_ERROR(stream_->expect_op(")"));
    return inner;
  }
  if (stream_->at_op("[")) return parse_list_or_dict(false);
  if (stream_->at_op("{")) return parse_list_or_dict(true);
  return stream_->unexpected("an expression");
}

Expected<ExprPtr> ExpressionParser::parse_list_or_dict(bool dict) {
  const SourcePos pos = stream_->next().pos;
  const std::string_view close = dict ? "}" : "]";
  ExprPtr node = make_expr(dict ? ExprKind::kDict : ExprKind::kList, pos);
  while (!stream_->at_op(close)) {
    if (!node->args.empty()) INFERD_RETURN_IF_ERROR(stream_->expect_op(","));
    if (stream_->at_op(close)) break;
    INFERD_ASSIGN_OR_RETURN(ExprPtr item, parse_expression());
    node->args.push_back(std::move(item));
    if (dict) {
      INFERD_RETURN_IF_ERROR(stream_->expect_op(":"));
      INFERD_ASSIGN_OR_RETURN(ExprPtr value, parse_expression());
      node->args.push_back(std::move(value));
    }
  }
  INFERD_RETURN_IF_ERROR(stream_->expect_op(close));
  return finish(std::move(node));
}

Expected<ExprPtr> ExpressionParser::parse_postfix(ExprPtr node) {
  while (true) {
    if (stream_->at_op(".") || stream_->at_op("[")) {
      INFERD_ASSIGN_OR_RETURN(node, parse_subscript(std::move(node)));
    } else if (stream_->at_op("(")) {
      INFERD_ASSIGN_OR_RETURN(node, parse_call(std::move(node)));
    } else {
      return node;
    }
  }
}

Expected<ExprPtr> ExpressionParser::parse_filter_expr(ExprPtr node) {
  while (true) {
    if (stream_->at_op("|")) {
      INFERD_ASSIGN_OR_RETURN(node, parse_filter(std::move(node), false));
    } else if (stream_->at_name("is")) {
      INFERD_ASSIGN_OR_RETURN(node, parse_test(std::move(node)));
    } else if (stream_->at_op("(")) {
      INFERD_ASSIGN_OR_RETURN(node, parse_call(std::move(node)));
    } else {
      return node;
    }
  }
}

}  // namespace inferd::jinja
