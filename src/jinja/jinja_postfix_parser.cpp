// The postfix half of ExpressionParser: subscripts and slices, calls, filters and tests.
#include "jinja/jinja_builtins.h"
#include "jinja/jinja_expr_parser.h"

namespace inferd::jinja {

namespace {

// One `[...]` argument: an expression, or start:stop:step with absent parts null.
struct Subscribed {
  ExprPtr key;
  bool is_slice = false;
  ExprPtr start, stop, step;
};

}  // namespace

Expected<ExprPtr> ExpressionParser::parse_subscript(ExprPtr node) {
  const Token& opener = stream_->next();
  const SourcePos pos = opener.pos;
  if (opener.text == ".") {
    const Token& t = stream_->current();
    if (t.kind == TokenKind::kName) {
      ExprPtr e = make_expr(ExprKind::kGetAttr, pos);
      e->args.push_back(std::move(node));
      e->name = stream_->next().text;
      return finish(std::move(e));
    }
    if (t.kind != TokenKind::kInteger) return stream_->unexpected("a name or number after '.'");
    ExprPtr key = make_expr(ExprKind::kLiteral, t.pos);
    key->constant = Value::from_int(stream_->next().int_value);
    std::vector<ExprPtr> args;
    args.push_back(std::move(node));
    args.push_back(std::move(key));
    return finish(make_expr(ExprKind::kGetItem, pos, std::move(args)));
  }
  std::vector<Subscribed> parts;
  while (!stream_->at_op("]")) {
    if (!parts.empty()) INFERD_RETURN_IF_ERROR(stream_->expect_op(","));
    Subscribed part;
    if (!stream_->at_op(":")) {
      INFERD_ASSIGN_OR_RETURN(part.key, parse_expression());
    }
    if (stream_->skip_op(":")) {
      part.is_slice = true;
      part.start = std::move(part.key);
      if (!stream_->at_op(":") && !stream_->at_op("]") && !stream_->at_op(",")) {
        INFERD_ASSIGN_OR_RETURN(part.stop, parse_expression());
      }
      if (stream_->skip_op(":") && !stream_->at_op("]") && !stream_->at_op(",")) {
        INFERD_ASSIGN_OR_RETURN(part.step, parse_expression());
      }
    }
    parts.push_back(std::move(part));
  }
  INFERD_RETURN_IF_ERROR(stream_->expect_op("]"));
  if (parts.empty()) return error_at(pos, "expected a subscript inside '[]'");
  std::vector<ExprPtr> args;
  args.push_back(std::move(node));
  if (parts.size() == 1 && parts[0].is_slice) {
    args.push_back(std::move(parts[0].start));
    args.push_back(std::move(parts[0].stop));
    args.push_back(std::move(parts[0].step));
    return finish(make_expr(ExprKind::kSlice, pos, std::move(args)));
  }
  if (parts.size() == 1) {
    args.push_back(std::move(parts[0].key));
    return finish(make_expr(ExprKind::kGetItem, pos, std::move(args)));
  }
  ExprPtr tuple = make_expr(ExprKind::kList, pos);
  tuple->is_tuple = true;
  for (Subscribed& part : parts) {
    if (part.is_slice)
      return error_at(pos, "slices inside a tuple subscript are not supported", StatusCode::kUnsupported);
    tuple->args.push_back(std::move(part.key));
  }
  INFERD_ASSIGN_OR_RETURN(ExprPtr key, finish(std::move(tuple)));
  args.push_back(std::move(key));
  return finish(make_expr(ExprKind::kGetItem, pos, std::move(args)));
}

Expected<ExprPtr> ExpressionParser::parse_call(ExprPtr node) {
  ExprPtr call = make_expr(ExprKind::kCall, stream_->current().pos);
  call->args.push_back(std::move(node));
  INFERD_RETURN_IF_ERROR(parse_call_args(call.get()));
  return finish(std::move(call));
}

// `(a, b, key=value)` appended to call->args (after its first child) and call->kwargs.
Status ExpressionParser::parse_call_args(Expr* call) {
  const SourcePos pos = stream_->current().pos;
  INFERD_RETURN_IF_ERROR(stream_->expect_op("("));
  bool require_comma = false;
  while (!stream_->at_op(")")) {
    if (require_comma) {
      INFERD_RETURN_IF_ERROR(stream_->expect_op(","));
      if (stream_->at_op(")")) break;
    }
    if (stream_->at_op("*") || stream_->at_op("**")) {
      return error_at(stream_->current().pos, "*args and **kwargs in calls are not supported",
                      StatusCode::kUnsupported);
    }
    if (stream_->current().kind == TokenKind::kName && stream_->look().kind == TokenKind::kOperator &&
        stream_->look().text == "=") {
      std::string key = stream_->next().text;
      stream_->next();
      INFERD_ASSIGN_OR_RETURN(ExprPtr value, parse_expression());
      call->kwargs.emplace_back(std::move(key), std::move(value));
    } else {
      if (!call->kwargs.empty()) return error_at(pos, "positional argument follows keyword argument");
      INFERD_ASSIGN_OR_RETURN(ExprPtr value, parse_expression());
      call->args.push_back(std::move(value));
    }
    require_comma = true;
  }
  return stream_->expect_op(")");
}

Expected<ExprPtr> ExpressionParser::parse_filter(ExprPtr input, bool start_inline) {
  while (stream_->at_op("|") || start_inline) {
    if (!start_inline) stream_->next();
    start_inline = false;
    const SourcePos pos = stream_->current().pos;
    INFERD_ASSIGN_OR_RETURN(std::string name, stream_->expect_identifier());
    while (stream_->skip_op(".")) {
      INFERD_ASSIGN_OR_RETURN(std::string part, stream_->expect_identifier());
      name += "." + part;
    }
    if (!is_filter_name(name))
      return error_at(pos, "unknown filter '" + name + "'", StatusCode::kUnsupported);
    ExprPtr filter = make_expr(ExprKind::kFilter, pos);
    filter->args.push_back(std::move(input));
    filter->name = std::move(name);
    if (stream_->at_op("(")) INFERD_RETURN_IF_ERROR(parse_call_args(filter.get()));
    INFERD_ASSIGN_OR_RETURN(input, finish(std::move(filter)));
  }
  return input;
}

Expected<ExprPtr> ExpressionParser::parse_test(ExprPtr node) {
  const SourcePos pos = stream_->next().pos;  // "is"
  const bool negated = stream_->skip_name("not");
  const SourcePos name_pos = stream_->current().pos;
  INFERD_ASSIGN_OR_RETURN(std::string name, stream_->expect_identifier());
  while (stream_->skip_op(".")) {
    INFERD_ASSIGN_OR_RETURN(std::string part, stream_->expect_identifier());
    name += "." + part;
  }
  if (!is_test_name(name)) return error_at(name_pos, "unknown test '" + name + "'", StatusCode::kUnsupported);
  ExprPtr test = make_expr(ExprKind::kTest, pos);
  test->args.push_back(std::move(node));
  test->name = std::move(name);
  const Token& t = stream_->current();
  const bool argument_follows = t.kind == TokenKind::kName || t.kind == TokenKind::kString ||
                                t.kind == TokenKind::kInteger || t.kind == TokenKind::kFloat ||
                                stream_->at_op("[") || stream_->at_op("{");
  if (stream_->at_op("(")) {
    INFERD_RETURN_IF_ERROR(parse_call_args(test.get()));
  } else if (argument_follows && !stream_->at_name("else") && !stream_->at_name("or") &&
             !stream_->at_name("and")) {
    if (stream_->at_name("is")) return error_at(t.pos, "tests cannot be chained with 'is'");
    INFERD_ASSIGN_OR_RETURN(ExprPtr argument, parse_primary());
    INFERD_ASSIGN_OR_RETURN(argument, parse_postfix(std::move(argument)));
    test->args.push_back(std::move(argument));
  }
  INFERD_ASSIGN_OR_RETURN(test, finish(std::move(test)));
  if (!negated) return test;
  ExprPtr inverted = make_expr(ExprKind::kUnary, pos);
  inverted->op = Op::kNot;
  inverted->args.push_back(std::move(test));
  return finish(std::move(inverted));
}

}  // namespace inferd::jinja
