// Syntax tree of a compiled chat template: expressions and statements as the parser builds them
// and the interpreter walks them. Immutable after parsing; shared by every render.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "jinja/jinja_lexer.h"
#include "jinja/jinja_value.h"

namespace inferd::jinja {

struct Expr;
struct Stmt;
using ExprPtr = std::unique_ptr<Expr>;
using StmtPtr = std::unique_ptr<Stmt>;

enum class ExprKind {
  kLiteral,    // constant
  kName,       // name
  kList,       // [args...] or a tuple (is_tuple)
  kDict,       // {args[0]: args[1], args[2]: args[3], ...}
  kGetAttr,    // args[0].name
  kGetItem,    // args[0][args[1]]
  kSlice,      // args[0][args[1]:args[2]:args[3]], absent parts null
  kCall,       // args[0](args[1...], kwargs)
  kFilter,     // args[0] | name(args[1...], kwargs); args[0] null in filter blocks
  kTest,       // args[0] is name(args[1...], kwargs)
  kUnary,      // op args[0]: kNeg, kPos, kNot
  kBinary,     // args[0] op args[1]: arithmetic, kAnd, kOr
  kConcat,     // args[0] ~ args[1] ~ ...
  kCompare,    // args[0] compare_ops[0] args[1] compare_ops[1] args[2] ...
  kCondition,  // args[1] if args[0] else args[2] (args[2] null: undefined)
};

enum class Op {
  kNone,
  kAdd,
  kSub,
  kMul,
  kDiv,
  kFloorDiv,
  kMod,
  kPow,
  kAnd,
  kOr,
  kNot,
  kNeg,
  kPos,
  kEq,
  kNe,
  kLt,
  kLe,
  kGt,
  kGe,
  kIn,
  kNotIn,
};

struct Expr {
  ExprKind kind = ExprKind::kLiteral;
  SourcePos pos;
  Op op = Op::kNone;
  std::string name;  // variable, attribute, filter or test
  Value constant;
  bool is_tuple = false;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<Op> compare_ops;
  int depth = 1;  // height of this subtree
};

enum class StmtKind {
  kText,         // text
  kOutput,       // {{ expr }}
  kIf,           // branches, else_body
  kFor,          // for targets in expr [if loop_filter]: body, else_body
  kSet,          // set targets = expr, or set targets[0].attribute = expr
  kSetBlock,     // set targets[0] [| filter chain in expr] ... endset (body)
  kMacro,        // macro name(targets = defaults): body
  kFilterBlock,  // filter chain in expr ... endfilter (body)
  kScope,        // body in its own scope ({% generation %})
  kBreak,
  kContinue,
};

struct IfBranch {
  ExprPtr condition;
  std::vector<StmtPtr> body;
};

struct Stmt {
  StmtKind kind = StmtKind::kText;
  SourcePos pos;
  std::string text;
  ExprPtr expr;
  std::vector<std::string> targets;
  std::string attribute;  // kSet/kSetBlock on a namespace attribute; targets[0] is the namespace
  std::string name;       // kMacro
  ExprPtr loop_filter;
  std::vector<ExprPtr> defaults;  // kMacro: one per parameter, null when it has none
  std::vector<IfBranch> branches;
  std::vector<StmtPtr> body;
  std::vector<StmtPtr> else_body;
};

struct Program {
  std::vector<StmtPtr> body;
};

}  // namespace inferd::jinja
