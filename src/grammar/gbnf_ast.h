// The syntax tree of a GBNF grammar: what gbnf_parser reads and GrammarBuilder lowers to the flat
// rules of Grammar. Internal to the grammar module.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "grammar/codepoint_set.h"

namespace inferd {

struct GbnfExpr {
  enum class Kind {
    kAlternatives,  // children: sequences
    kSequence,      // children: items
    kCodepoints,    // one character out of `codepoints` (a literal's character, a class, `.`)
    kRuleRef,       // `name`
    kRepeat,        // children[0] repeated min..max times (max empty: unbounded)
  };
  Kind kind = Kind::kSequence;
  std::vector<GbnfExpr> children;
  CodepointSet codepoints;
  std::string name;
  int line = 0, column = 0;  // of a rule reference, for "undefined rule" errors
  int min = 0;
  std::optional<int> max;
};

struct GbnfRule {
  std::string name;
  GbnfExpr body;  // kAlternatives
  int line = 0, column = 0;
};

}  // namespace inferd
