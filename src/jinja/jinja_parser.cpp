#include "jinja/jinja_parser.h"

#include <algorithm>
#include <initializer_list>

#include "jinja/jinja_expr_parser.h"

namespace inferd::jinja {

namespace {

constexpr std::string_view kUnsupportedTags[] = {"extends", "include", "import",     "from", "block",
                                                 "call",    "with",    "autoescape", "do",   "print"};
constexpr std::string_view kEndTags[] = {"elif",     "else",      "endif",         "endfor", "endset",
                                         "endmacro", "endfilter", "endgeneration", "endraw"};

bool contains(std::initializer_list<std::string_view> names, std::string_view name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

template <typename Range>
bool contains(const Range& names, std::string_view name) {
  return std::find(std::begin(names), std::end(names), name) != std::end(names);
}

StmtPtr make_stmt(StmtKind kind, SourcePos pos) {
  auto s = std::make_unique<Stmt>();
  s->kind = kind;
  s->pos = pos;
  return s;
}

class Parser final {
 public:
  explicit Parser(std::vector<Token> tokens) : stream_(std::move(tokens)), expr_(&stream_) {}

  Expected<Program> run() {
    Program program;
    INFERD_ASSIGN_OR_RETURN(program.body, parse_body({}));
    return program;
  }

 private:
  // Statements up to (not including) a `{% tag %}` whose tag is in end_tags, or the end.
  Expected<std::vector<StmtPtr>> parse_body(std::initializer_list<std::string_view> end_tags) {
    std::vector<StmtPtr> body;
    while (true) {
      const Token& t = stream_.current();
      if (t.kind == TokenKind::kEnd) return body;
      if (t.kind == TokenKind::kText) {
        StmtPtr s = make_stmt(StmtKind::kText, t.pos);
        s->text = stream_.next().text;
        body.push_back(std::move(s));
      } else if (t.kind == TokenKind::kVariableBegin) {
        StmtPtr s = make_stmt(StmtKind::kOutput, stream_.next().pos);
        INFERD_ASSIGN_OR_RETURN(s->expr, expr_.parse_tuple());
        INFERD_RETURN_IF_ERROR(stream_.expect(TokenKind::kVariableEnd));
        body.push_back(std::move(s));
      } else if (t.kind == TokenKind::kBlockBegin) {
        const Token& name = stream_.look();
        if (name.kind == TokenKind::kName && contains(end_tags, name.text)) return body;
        INFERD_ASSIGN_OR_RETURN(StmtPtr s, parse_statement());
        body.push_back(std::move(s));
      } else {
        return stream_.unexpected("template text or a tag");
      }
    }
  }

  // The body of the `opener` tag at `pos`: it must end at one of end_tags, not the template end.
  Expected<std::vector<StmtPtr>> parse_inner(std::initializer_list<std::string_view> end_tags,
                                             std::string_view opener, SourcePos pos) {
    INFERD_ASSIGN_OR_RETURN(std::vector<StmtPtr> body, parse_body(end_tags));
    if (stream_.current().kind == TokenKind::kEnd) {
      std::string expected;
      for (std::string_view tag : end_tags)
        expected += (expected.empty() ? "'" : " or '") + std::string(tag) + "'";
      return error_at(stream_.current().pos, "unexpected end of template: expected " + expected +
                                                 std::string(" to close '") + std::string(opener) +
                                                 std::string("' from line ") + std::to_string(pos.line) +
                                                 std::string(":") + std::to_string(pos.column));
    }
    return body;
  }

  // The end of a header that opens a body (jinja2 accepts a colon before it).
  Status end_of_header() {
    stream_.skip_op(":");
    return stream_.expect(TokenKind::kBlockEnd);
  }

  // Consumes `{% tag` where parse_inner stopped and returns the tag name.
  std::string take_end_tag() {
    stream_.next();
    return stream_.next().text;
  }

  Expected<StmtPtr> parse_statement() {
    stream_.next();  // {%
    const Token& t = stream_.current();
    if (t.kind != TokenKind::kName) return stream_.unexpected("a tag name");
    INFERD_RETURN_IF_ERROR(expr_.enter(t.pos));
    struct Leave {
      ExpressionParser* p;
      ~Leave() { p->leave(); }
    } leave{&expr_};
    const std::string name = t.text;
    const SourcePos pos = t.pos;
    if (name == "if") return parse_if(pos);
    if (name == "for") return parse_for(pos);
    if (name == "set") return parse_set(pos);
    if (name == "macro") return parse_macro(pos);
    if (name == "filter" || name == "generation") return parse_filter_or_scope(pos, name);
    if (name == "break" || name == "continue") {
      if (loop_depth_ == 0) return error_at(pos, "'" + name + "' outside of a for loop");
      stream_.next();
      INFERD_RETURN_IF_ERROR(stream_.expect(TokenKind::kBlockEnd));
      return make_stmt(name == "break" ? StmtKind::kBreak : StmtKind::kContinue, pos);
    }
    if (contains(kUnsupportedTags, name)) {
      return error_at(pos, "the '" + name + "' tag is not supported in chat templates",
                      StatusCode::kUnsupported);
    }
    if (contains(kEndTags, name))
      return error_at(pos, "unexpected '" + name + "' (no open tag it could close)");
    return error_at(pos, "unknown tag '" + name + "'");
  }

  Expected<StmtPtr> parse_if(SourcePos pos) {
    StmtPtr s = make_stmt(StmtKind::kIf, pos);
    stream_.next();
    while (true) {
      IfBranch branch;
      INFERD_ASSIGN_OR_RETURN(branch.condition, expr_.parse_tuple(false));
      INFERD_RETURN_IF_ERROR(end_of_header());
      INFERD_ASSIGN_OR_RETURN(branch.body, parse_inner({"elif", "else", "endif"}, "if", pos));
      s->branches.push_back(std::move(branch));
      const std::string tag = take_end_tag();
      if (tag == "elif") continue;
      if (tag == "else") {
        INFERD_RETURN_IF_ERROR(end_of_header());
        INFERD_ASSIGN_OR_RETURN(s->else_body, parse_inner({"endif"}, "if", pos));
        take_end_tag();
      }
      INFERD_RETURN_IF_ERROR(stream_.expect(TokenKind::kBlockEnd));
      return s;
    }
  }

  Expected<StmtPtr> parse_for(SourcePos pos) {
    StmtPtr s = make_stmt(StmtKind::kFor, pos);
    stream_.next();
    do {
      INFERD_ASSIGN_OR_RETURN(std::string target, stream_.expect_identifier());
      s->targets.push_back(std::move(target));
    } while (stream_.skip_op(",") && !stream_.at_name("in"));
    INFERD_RETURN_IF_ERROR(stream_.expect_name("in"));
    INFERD_ASSIGN_OR_RETURN(s->expr, expr_.parse_tuple(false, {"recursive"}));
    if (stream_.skip_name("if")) {
      INFERD_ASSIGN_OR_RETURN(s->loop_filter, expr_.parse_expression());
    }
    if (stream_.at_name("recursive")) {
      return error_at(stream_.current().pos, "recursive for loops are not supported",
                      StatusCode::kUnsupported);
    }
    INFERD_RETURN_IF_ERROR(end_of_header());
    ++loop_depth_;
    auto body = parse_inner({"endfor", "else"}, "for", pos);
    --loop_depth_;
    if (!body.has_value()) return body.status();
    s->body = std::move(body).value();
    if (take_end_tag() == "else") {
      INFERD_RETURN_IF_ERROR(end_of_header());
      INFERD_ASSIGN_OR_RETURN(s->else_body, parse_inner({"endfor"}, "for", pos));
      take_end_tag();
    }
    INFERD_RETURN_IF_ERROR(stream_.expect(TokenKind::kBlockEnd));
    return s;
  }

  Expected<StmtPtr> parse_set(SourcePos pos) {
    StmtPtr s = make_stmt(StmtKind::kSet, pos);
    stream_.next();
    INFERD_ASSIGN_OR_RETURN(std::string first, stream_.expect_identifier());
    s->targets.push_back(std::move(first));
    if (stream_.skip_op(".")) {
      INFERD_ASSIGN_OR_RETURN(s->attribute, stream_.expect_identifier());
    } else {
      while (stream_.skip_op(",") && !stream_.at_op("=")) {
        INFERD_ASSIGN_OR_RETURN(std::string target, stream_.expect_identifier());
        s->targets.push_back(std::move(target));
      }
    }
    if (stream_.skip_op("=")) {
      INFERD_ASSIGN_OR_RETURN(s->expr, expr_.parse_tuple());
      INFERD_RETURN_IF_ERROR(stream_.expect(TokenKind::kBlockEnd));
      return s;
    }
    if (s->targets.size() > 1) return stream_.unexpected("'='");
    s->kind = StmtKind::kSetBlock;
    if (stream_.at_op("|")) {
      INFERD_ASSIGN_OR_RETURN(s->expr, expr_.parse_filter(nullptr, false));
    }
    INFERD_RETURN_IF_ERROR(end_of_header());
    INFERD_ASSIGN_OR_RETURN(s->body, parse_inner({"endset"}, "set", pos));
    take_end_tag();
    INFERD_RETURN_IF_ERROR(stream_.expect(TokenKind::kBlockEnd));
    return s;
  }

  Expected<StmtPtr> parse_macro(SourcePos pos) {
    StmtPtr s = make_stmt(StmtKind::kMacro, pos);
    stream_.next();
    INFERD_ASSIGN_OR_RETURN(s->name, stream_.expect_identifier());
    INFERD_RETURN_IF_ERROR(stream_.expect_op("("));
    while (!stream_.at_op(")")) {
      if (!s->targets.empty()) INFERD_RETURN_IF_ERROR(stream_.expect_op(","));
      const SourcePos param_pos = stream_.current().pos;
      INFERD_ASSIGN_OR_RETURN(std::string param, stream_.expect_identifier());
      ExprPtr fallback;
      if (stream_.skip_op("=")) {
        INFERD_ASSIGN_OR_RETURN(fallback, expr_.parse_expression());
      } else if (!s->defaults.empty() && s->defaults.back() != nullptr) {
        return error_at(param_pos, "non-default argument follows default argument");
      }
      s->targets.push_back(std::move(param));
      s->defaults.push_back(std::move(fallback));
    }
    INFERD_RETURN_IF_ERROR(stream_.expect_op(")"));
    INFERD_RETURN_IF_ERROR(end_of_header());
    const int outer_loop_depth = loop_depth_;
    loop_depth_ = 0;
    auto body = parse_inner({"endmacro"}, "macro", pos);
    loop_depth_ = outer_loop_depth;
    if (!body.has_value()) return body.status();
    s->body = std::move(body).value();
    take_end_tag();
    INFERD_RETURN_IF_ERROR(stream_.expect(TokenKind::kBlockEnd));
    return s;
  }

  // `{% filter f|g %}...{% endfilter %}` or `{% generation %}...{% endgeneration %}`.
  Expected<StmtPtr> parse_filter_or_scope(SourcePos pos, const std::string& name) {
    const bool filter = name == "filter";
    StmtPtr s = make_stmt(filter ? StmtKind::kFilterBlock : StmtKind::kScope, pos);
    stream_.next();
    if (filter) {
      INFERD_ASSIGN_OR_RETURN(s->expr, expr_.parse_filter(nullptr, true));
    }
    INFERD_RETURN_IF_ERROR(end_of_header());
    INFERD_ASSIGN_OR_RETURN(s->body, parse_inner({filter ? "endfilter" : "endgeneration"}, name, pos));
    take_end_tag();
    INFERD_RETURN_IF_ERROR(stream_.expect(TokenKind::kBlockEnd));
    return s;
  }

  TokenStream stream_;
  ExpressionParser expr_;
  int loop_depth_ = 0;
};

}  // namespace

Expected<Program> parse_template(std::string_view source) {
  INFERD_ASSIGN_OR_RETURN(std::vector<Token> tokens, tokenize(source));
  return Parser(std::move(tokens)).run();
}

}  // namespace inferd::jinja
