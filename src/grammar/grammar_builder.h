// GrammarBuilder: lowers GBNF rules (gbnf_ast.h) to Grammar's flat element sequences: characters
// become UTF-8 byte-range terminals, groups and repetitions become generated rules, and the result
// is checked (every referenced rule defined, a `root`, no left recursion). Internal to the module.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "grammar/gbnf_ast.h"
#include "grammar/grammar.h"

namespace inferd {

class GrammarBuilder final {
 public:
  // One use per builder.
  Expected<std::shared_ptr<const Grammar>> build(const std::vector<GbnfRule>& rules);

 private:
  using Alternative = std::vector<GrammarElement>;
  uint32_t new_rule(std::string name);
  uint32_t byte_set_index(const ByteSet& set);
  void lower_alternatives(const GbnfExpr& alts, uint32_t rule);
  void lower_sequence(const GbnfExpr& seq, Alternative* out);
  void lower_item(const GbnfExpr& item, Alternative* out);
  void lower_codepoints(const CodepointSet& set, Alternative* out);
  void lower_repeat(const GbnfExpr& rep, Alternative* out);
  GrammarElement as_single_element(const GbnfExpr& item);
  Status check_left_recursion() const;
  std::shared_ptr<const Grammar> flatten() const;

  std::vector<std::string> names_;
  std::vector<std::vector<Alternative>> alternatives_;  // per rule
  std::map<std::string, uint32_t> rule_ids_;            // user rules by name
  std::vector<ByteSet> byte_sets_;
  std::map<std::array<uint64_t, 4>, uint32_t> byte_set_ids_;
  std::map<std::vector<std::pair<uint32_t, uint32_t>>, uint32_t> class_rules_;  // multi-byte classes
  std::map<std::pair<uint64_t, std::pair<int, int>>, uint32_t> repeat_rules_;   // (element, min, max)
  std::map<uint32_t, std::pair<uint64_t, int>> chain_ranks_;  // x{0,k} chain rule -> (element, k)
  std::string current_rule_;
  int generated_ = 0;
  Status error_;
};

}  // namespace inferd
