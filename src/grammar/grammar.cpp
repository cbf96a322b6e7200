#include "grammar/grammar.h"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <string>

#include "common/check.h"
#include "grammar/gbnf_parser.h"
#include "grammar/grammar_builder.h"
#include "grammar/grammar_vocab.h"
#include "grammar/stack_store.h"
#include "grammar/token_mask_cache.h"

namespace inferd {

Grammar::Grammar(std::vector<GrammarElement> elements, std::vector<ByteSet> byte_sets,
                 std::vector<Rule> rules, std::vector<uint32_t> short_token_positions)
    : elements_(std::move(elements)),
      byte_sets_(std::move(byte_sets)),
      rules_(std::move(rules)),
      short_token_positions_(std::move(short_token_positions)) {
  INFERD_CHECK(short_token_positions_.empty() || short_token_positions_.size() == elements_.size());
}

Grammar::~Grammar() = default;

namespace {

std::string byte_set_text(const ByteSet& set) {
  std::string out = "[";
  char buf[16];
  for (int b = 0; b < 256;) {
    if (!set.test(static_cast<uint8_t>(b))) {
      ++b;
      continue;
    }
    int e = b;
    while (e + 1 < 256 && set.test(static_cast<uint8_t>(e + 1))) ++e;
    std::snprintf(buf, sizeof buf, "\\x%02X", b);
    out += buf;
    if (e > b) {
      std::snprintf(buf, sizeof buf, "-\\x%02X", e);
      out += buf;
    }
    b = e + 1;
  }
  return out + "]";
}

}  // namespace

std::string Grammar::to_string() const {
  std::string out;
  for (const Rule& r : rules_) {
    out += r.name + " ::=";
    for (size_t a = 0; a < r.alternatives.size(); ++a) {
      if (a > 0) out += " |";
      for (uint32_t p = r.alternatives[a]; elements_[p].kind != GrammarElementKind::kEnd; ++p) {
        const GrammarElement& e = elements_[p];
        out += " ";
        out +=
            e.kind == GrammarElementKind::kRule ? rules_[e.value].name : byte_set_text(byte_sets_[e.value]);
      }
    }
    out += "\n";
  }
  return out;
}

std::shared_ptr<TokenMaskCache> Grammar::token_mask_cache(
    const std::shared_ptr<const GrammarVocab>& vocab) const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::erase_if(vocab_caches_, [](const VocabCache& c) { return c.vocab.expired(); });
  for (const VocabCache& c : vocab_caches_) {
    if (c.vocab.lock() == vocab) return c.cache;
  }
  auto cache = std::make_shared<TokenMaskCache>(*this, vocab);
  vocab_caches_.push_back({vocab, cache});
  return cache;
}

Expected<std::shared_ptr<const Grammar>> parse_gbnf(std::string_view text) {
  INFERD_ASSIGN_OR_RETURN(std::vector<GbnfRule> rules, read_gbnf(text));
  GrammarBuilder builder;
  INFERD_ASSIGN_OR_RETURN(std::shared_ptr<const Grammar> grammar, builder.build(rules));
  // A grammar with more parses alive at its start than a matcher may follow fails here, not on
  // the request's first token (e.g. tens of thousands of alternatives that all start alike).
  StackStore store(*grammar);
  (void)store.initial_set();
  if (store.overflowed()) return invalid_argument(StackStore::overflow_message() + " at its start");
  return grammar;
}

std::string gbnf_literal(std::string_view utf8) {
  std::string out = "\"";
  char buf[8];
  for (char ch : utf8) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += ch;
    } else if (c < 0x20 || c == 0x7F) {
      std::snprintf(buf, sizeof buf, "\\x%02X", c);
      out += buf;
    } else {
      out += ch;  // printable ASCII, or a byte of a UTF-8 character (the parser decodes it)
    }
  }
  return out + "\"";
}

namespace {

// The length of the UTF-8 character starting at s[i], or 0 where the bytes there are not one.
size_t utf8_char_length(std::string_view s, size_t i) {
  const auto c = static_cast<unsigned char>(s[i]);
  const size_t n = c < 0x80                ? 1
                   : c >= 0xC2 && c < 0xE0 ? 2
                   : c >= 0xE0 && c < 0xF0 ? 3
                   : c >= 0xF0 && c < 0xF5 ? 4
                                           : 0;
  if (n == 0 || i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return 0;
  }
  return n;
}

bool is_continuation_byte(char c) {
  return (static_cast<unsigned char>(c) & 0xC0) == 0x80;
}

}  // namespace

// Strings sharing a prefix share its bytes in the grammar: the sorted strings form a radix tree
// with one rule per branching node below the first, its edges cut at character boundaries (a
// literal holds whole UTF-8 characters). As one alternative per string, N strings were N parses
// alive from their first byte: 50,000 choices took 0.37 s for the first token mask, and past
// StackStore's bound on live parses they could not be followed at all. Built without recursion
// (a chain of strings each extending the last nests as deep as it is long); the rules only refer
// to rules made before them, so the grammar has no recursion either.
Expected<std::string> gbnf_alternatives_tree(std::vector<std::string> strings,
                                             const std::function<std::string(const std::string&)>& add_rule) {
  if (strings.empty()) return invalid_argument("no strings to choose from");
  for (size_t c = 0; c < strings.size(); ++c) {
    for (size_t i = 0; i < strings[c].size();) {
      const size_t n = utf8_char_length(strings[c], i);
      if (n == 0) return invalid_argument("value " + std::to_string(c) + " is not valid UTF-8");
      i += n;
    }
  }
  std::sort(strings.begin(), strings.end());
  strings.erase(std::unique(strings.begin(), strings.end()), strings.end());
  struct Alternative {
    std::string literal;  // a GBNF literal, or empty: the child node's rule
    size_t child = 0;
  };
  struct Node {
    size_t lo, hi;       // strings[lo, hi): the strings below this node
    size_t depth;        // bytes they share above it (a character boundary)
    std::string prefix;  // a GBNF literal of the bytes all of them share next, or empty
    std::vector<Alternative> alternatives;
  };
  std::vector<Node> nodes{{0, strings.size(), 0, "", {}}};
  for (size_t k = 0; k < nodes.size(); ++k) {
    const size_t lo = nodes[k].lo, hi = nodes[k].hi, depth = nodes[k].depth;
    const std::string& first = strings[lo];
    if (hi - lo == 1) {
      nodes[k].alternatives.push_back({gbnf_literal(std::string_view(first).substr(depth)), 0});
      continue;
    }
    // Sorted, so what the first and last share, all share; cut back to a character's start.
    const std::string& last = strings[hi - 1];
    size_t p = depth;
    while (p < first.size() && p < last.size() && first[p] == last[p]) ++p;
    while (p > depth && p < last.size() && is_continuation_byte(last[p])) --p;
    if (p > depth) nodes[k].prefix = gbnf_literal(std::string_view(first).substr(depth, p - depth));
    // The children: one string may end here (it sorts first), then groups by the character at p.
    // Valid UTF-8 and the cut above make at least two, so every child is a smaller range.
    size_t i = lo;
    if (strings[i].size() == p) {
      nodes[k].alternatives.push_back({"\"\"", 0});
      ++i;
    }
    while (i < hi) {
      const std::string_view ch = std::string_view(strings[i]).substr(p, utf8_char_length(strings[i], p));
      size_t j = i + 1;
      while (j < hi && std::string_view(strings[j]).substr(p, ch.size()) == ch) ++j;
      if (j - i == 1) {
        nodes[k].alternatives.push_back({gbnf_literal(std::string_view(strings[i]).substr(p)), 0});
      } else {
        nodes[k].alternatives.push_back({"", nodes.size()});
        nodes.push_back({i, j, p, "", {}});
      }
      i = j;
    }
  }
  // Children first, so that each rule's body can name its children's rules.
  std::vector<std::string> names(nodes.size());
  std::string body;
  for (size_t k = nodes.size(); k-- > 0;) {
    body = nodes[k].prefix;
    if (!body.empty()) body += " ";
    body += "(";
    for (size_t a = 0; a < nodes[k].alternatives.size(); ++a) {
      const Alternative& alt = nodes[k].alternatives[a];
      body += a > 0 ? " | " : " ";
      body += alt.literal.empty() ? names[alt.child] : alt.literal;
    }
    body += " )";
    if (k > 0) names[k] = add_rule(body);
  }
  return "(" + body + ")";
}

Expected<std::shared_ptr<const Grammar>> grammar_from_choices(const std::vector<std::string>& choices) {
  if (choices.empty()) return invalid_argument("guided_choice: no choices");
  std::string rules;
  size_t num_rules = 0;
  auto expr = gbnf_alternatives_tree(choices, [&](const std::string& body) {
    const std::string name = "choice-" + std::to_string(++num_rules);
    rules += name + " ::= " + body + "\n";
    return name;
  });
  if (!expr) return expr.status().with_context("guided_choice");
  auto g = parse_gbnf("root ::= " + *expr + "\n" + rules);
  if (!g) return g.status().with_context("guided_choice");
  return g;
}

Expected<std::shared_ptr<const Grammar>> grammar_from_regex(std::string_view regex) {
  INFERD_ASSIGN_OR_RETURN(std::string expr, regex_to_gbnf(regex, false));
  auto g = parse_gbnf("root ::= " + expr + "\n");
  if (!g) return g.status().with_context("guided_regex");
  return g;
}

}  // namespace inferd
