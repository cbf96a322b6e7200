// Interpreter of a compiled chat template: walks the syntax tree with jinja2's semantics
// (scoping, undefined values, loops, macros) and writes the rendered text. Last stage of
// ChatTemplate::render; one Interpreter per render, single-threaded.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "jinja/chat_template.h"
#include "jinja/jinja_ast.h"
#include "jinja/jinja_builtins.h"
#include "jinja/jinja_operators.h"
#include "jinja/jinja_value.h"

namespace inferd::jinja {

// Variables of one frame: the template's top level, a loop iteration, a macro call. Lookups
// fall through to the enclosing frame.
class Scope final {
 public:
  explicit Scope(const Scope* parent) : parent_(parent) {}
  const Value* find(std::string_view name) const;
  void set(const std::string& name, Value value) { vars_[name] = std::move(value); }

 private:
  const Scope* parent_;
  std::unordered_map<std::string, Value, StringHash, std::equal_to<>> vars_;
};

class Interpreter final {
 public:
  // `context` must be an object (its keys are the template's variables); not owned, must
  // outlive the interpreter.
  Interpreter(const Value& context, const ChatTemplateLimits& limits);

  // Runs the program and returns the text it writes.
  Expected<std::string> render(const Program& program);

 private:
  enum class Flow { kNormal, kBreak, kContinue };

  // Statements (jinja_interpreter.cpp).
  Expected<Flow> exec_block(const std::vector<StmtPtr>& body, Scope& scope);
  Expected<Flow> exec(const Stmt& s, Scope& scope);
  Expected<Flow> exec_if(const Stmt& s, Scope& scope);
  Status exec_for(const Stmt& s, Scope& scope);
  Status assign(const Stmt& s, Value value, Scope& scope);
  Status bind_targets(const std::vector<std::string>& targets, const Value& value, Scope& scope);
  Expected<std::string> capture(const std::vector<StmtPtr>& body, Scope& scope);
  Expected<Value> apply_filter_chain(const Expr* chain, Value input, Scope& scope);
  Expected<Value> call_macro(const Stmt& macro, const CallArgs& args);
  Status write(std::string_view text);
  Status count_iteration();

  // Expressions (jinja_eval.cpp).
  Expected<Value> eval(const Expr& e, Scope& scope);
  Expected<Value> eval_node(const Expr& e, Scope& scope);
  Expected<Value> eval_collection(const Expr& e, Scope& scope);
  Expected<CallArgs> eval_args(const Expr& e, Scope& scope);
  Expected<Value> eval_binary(const Expr& e, Scope& scope);
  Expected<Value> eval_compare(const Expr& e, Scope& scope);
  Value lookup(const std::string& name, const Scope& scope) const;

  const Value& context_;
  ChatTemplateLimits limits_;
  BuiltinLimits builtin_limits_;
  std::vector<std::string> outputs_;  // back() receives writes; captures push a buffer
  int64_t num_iterations_ = 0;
  int call_depth_ = 0;
  const Scope* root_ = nullptr;
};

}  // namespace inferd::jinja
