#include "grammar/grammar.h"

#include <algorithm>
#include <cstdio>
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

// Choices sharing a prefix share its bytes in the grammar: the sorted choices form a radix tree
// with one rule per branching node, its edges cut at character boundaries (a literal holds whole
// UTF-8 characters). As alternatives of one rule, N choices were N parses alive from the first
// byte on: 50,000 choices took 0.37 s for the first token mask, and past StackStore's bound on
// live parses they could not be followed at all. The tree is built without recursion (a chain of
// choices each extending the last nests as deep as it is long) and its rules only refer to rules
// made after them, so the grammar has no recursion either.
Expected<std::shared_ptr<const Grammar>> grammar_from_choices(const std::vector<std::string>& choices) {
  if (choices.empty()) return invalid_argument("guided_choice: no choices");
  for (size_t c = 0; c < choices.size(); ++c) {
    for (size_t i = 0; i < choices[c].size();) {
      const size_t n = utf8_char_length(choices[c], i);
      if (n == 0)
        return invalid_argument("guided_choice: choice " + std::to_string(c) + " is not valid UTF-8");
      i += n;
    }
  }
  std::vector<std::string> sorted = choices;
  std::sort(sorted.begin(), sorted.end());
  sorted.erase(std::unique(sorted.begin(), sorted.end()), sorted.end());
  struct Node {
    size_t lo, hi;  // sorted[lo, hi): the choices below this node
    size_t depth;   // bytes they share above it (a character boundary)
  };
  std::vector<Node> nodes{{0, sorted.size(), 0}};  // node k is rule k; rule 0 is root
  std::string text;
  for (size_t k = 0; k < nodes.size(); ++k) {
    const Node node = nodes[k];
    text += k == 0 ? "root ::= " : "choice-" + std::to_string(k) + " ::= ";
    const std::string& first = sorted[node.lo];
    if (node.hi - node.lo == 1) {
      text += gbnf_literal(std::string_view(first).substr(node.depth)) + "\n";
      continue;
    }
    // Sorted, so what the first and last share, all share; cut back to a character's start.
    const std::string& last = sorted[node.hi - 1];
    size_t p = node.depth;
    while (p < first.size() && p < last.size() && first[p] == last[p]) ++p;
    while (p > node.depth && p < last.size() && is_continuation_byte(last[p])) --p;
    if (p > node.depth)
      text += gbnf_literal(std::string_view(first).substr(node.depth, p - node.depth)) + " ";
    text += "(";
    // The children: one choice may end here (it sorts first), then groups by the character at p.
    // Valid UTF-8 and the cut above make at least two, so every child is a smaller range.
    size_t i = node.lo;
    bool first_alternative = true;
    auto alternative = [&](const std::string& a) {
      text += first_alternative ? " " : " | ";
      text += a;
      first_alternative = false;
    };
    if (sorted[i].size() == p) {
      alternative("\"\"");
      ++i;
    }
    while (i < node.hi) {
      const std::string_view ch = std::string_view(sorted[i]).substr(p, utf8_char_length(sorted[i], p));
      size_t j = i + 1;
      while (j < node.hi && std::string_view(sorted[j]).substr(p, ch.size()) == ch) ++j;
      if (j - i == 1) {
        alternative(gbnf_literal(std::string_view(sorted[i]).substr(p)));
      } else {
        alternative("choice-" + std::to_string(nodes.size()));
        nodes.push_back({i, j, p});
      }
      i = j;
    }
    text += " )\n";
  }
  auto g = parse_gbnf(text);
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
