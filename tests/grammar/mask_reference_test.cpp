// The token mask (trie walk + context-independent cache + uncertain tokens) against brute force:
// on random small grammars and a random small vocabulary, token by token, a bit is set exactly
// when accept_token of that token succeeds from the same state.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "grammar_test_util.h"

namespace inferd {
namespace {

using test::mask_has;

std::string random_item(std::mt19937& rng, int rule, int num_rules, int depth) {
  static const std::vector<std::string> literals = {"\"a\"",  "\"b\"", "\"ab\"", "\"é\"",
                                                    "\"ba\"", "\"c\"", "\"aé\""};
  static const std::vector<std::string> classes = {"[a-b]", "[^a]", ".", "[bé]", "[a-c]"};
  static const std::vector<std::string> reps = {"*", "+", "?", "{0,2}", "{2}", "{1,3}"};
  switch (rng() % 6) {
    case 0:
    case 1: return literals[rng() % literals.size()];
    case 2: return classes[rng() % classes.size()];
    case 3: {
      // Only rules defined later: no recursion, whose ambiguity could make stack sets explode
      // (a limit of the stack-set matcher, docs/grammar.md); recursion is covered by the JSON test.
      if (rule + 1 >= num_rules) return literals[rng() % literals.size()];
      std::string ref = "r";
      ref += std::to_string(rule + 1 + static_cast<int>(rng() % static_cast<unsigned>(num_rules - rule - 1)));
      return ref;
    }
    default: {
      if (depth > 1) return literals[rng() % literals.size()];
      std::string g = "(";
      g += random_item(rng, rule, num_rules, depth + 1);
      g += ' ';
      g += random_item(rng, rule, num_rules, depth + 1);
      if (rng() % 2) {
        g += " | ";
        g += random_item(rng, rule, num_rules, depth + 1);
      }
      g += ')';
      g += reps[rng() % reps.size()];
      return g;
    }
  }
}

std::string random_grammar(std::mt19937& rng) {
  const int num_rules = 1 + static_cast<int>(rng() % 3);
  std::string text;
  for (int r = 0; r < num_rules; ++r) {
    if (r == 0) {
      text += "root ::= ";
    } else {
      text += 'r';
      text += std::to_string(r);
      text += " ::= ";
    }
    const int alts = 1 + static_cast<int>(rng() % 3);
    for (int a = 0; a < alts; ++a) {
      if (a > 0) text += " | ";
      // A terminal first keeps most grammars free of left recursion.
      text += '"';
      text += "abc"[rng() % 3];
      text += '"';
      const int items = static_cast<int>(rng() % 4);
      for (int i = 0; i < items; ++i) {
        text += ' ';
        text += random_item(rng, r, num_rules, 0);
      }
    }
    text += "\n";
  }
  // r0 means root.
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == 'r' && i + 1 < text.size() && text[i + 1] == '0') {
      out += "root";
      ++i;
    } else {
      out += text[i];
    }
  }
  return out;
}

// Checks every bit of `mask` (the matcher's after `history`) against brute force: a fresh matcher
// that replays `history` and tries each token. Appends the allowed ids to `allowed`.
void expect_mask_is_brute_force(const std::shared_ptr<const Grammar>& g,
                                const std::shared_ptr<const GrammarVocab>& vocab,
                                const std::vector<int32_t>& history, const std::vector<uint32_t>& mask,
                                const std::string& context, std::vector<int32_t>* allowed) {
  GrammarMatcher reference(g, vocab);
  for (int32_t id : history) ASSERT_TRUE(reference.accept_token(id));
  for (int32_t id = 0; id < vocab->size(); ++id) {
    const bool ok = reference.accept_token(id);
    if (ok) {
      allowed->push_back(id);
      ASSERT_TRUE(reference.rollback(1).is_ok());
    }
    ASSERT_EQ(mask_has(mask, id), ok) << context << "token " << id << " '" << vocab->token_bytes(id)
                                      << "' after " << history.size() << " tokens";
  }
}

TEST(GrammarMaskReferenceTest, TrieWalkEqualsBruteForceOnRandomGrammars) {
  std::mt19937 rng(1234);
  int checked_grammars = 0, checked_masks = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const std::string text = random_grammar(rng);
    auto parsed = parse_gbnf(text);
    if (!parsed.has_value()) continue;  // left recursion or an undefined rule: not this test's subject
    auto g = *parsed;
    auto vocab = test::byte_vocab(test::random_tokens(rng, 80, "abc", 5));
    const int32_t n = vocab->size();
    GrammarMatcher m(g, vocab);
    std::vector<int32_t> history;
    std::vector<uint32_t> mask(GrammarMatcher::bitmask_words(static_cast<size_t>(n)));
    ++checked_grammars;
    for (int step = 0; step < 12 && !m.is_terminated(); ++step) {
      m.fill_next_token_bitmask(mask);
      std::vector<int32_t> allowed;
      ASSERT_NO_FATAL_FAILURE(
          expect_mask_is_brute_force(g, vocab, history, mask, "grammar:\n" + text, &allowed));
      ++checked_masks;
      if (allowed.empty()) break;
      // Mostly text tokens, so walks go deep.
      int32_t pick = allowed[rng() % allowed.size()];
      if (pick == test::end_id(*vocab) && allowed.size() > 1) pick = allowed[0];
      ASSERT_TRUE(m.accept_token(pick));
      history.push_back(pick);
    }
  }
  EXPECT_GT(checked_grammars, 150);
  EXPECT_GT(checked_masks, 1000);
  RecordProperty("masks_checked", checked_masks);
}

// The same on JSON grammars (any object; a schema with nesting and bounds), where the context cache's
// uncertain tokens matter most (strings closed inside a token, then more structure).
TEST(GrammarMaskReferenceTest, TrieWalkEqualsBruteForceOnJson) {
  std::mt19937 rng(99);
  auto schema = parse_gbnf(*json_schema_to_gbnf(nlohmann::ordered_json::parse(
      R"({"type": "object", "properties": {"a": {"type": "string", "maxLength": 4}, "b": {"type": "array", "items":
          {"type": "object", "properties": {"c": {"type": "integer", "minimum": -5, "maximum": 20}, "d": {"type": "string"}}}},
          "e": {"enum": ["x", "yz"]}}, "additionalProperties": true})")));
  ASSERT_TRUE(schema.has_value());
  auto vocab = test::byte_vocab(test::random_tokens(rng, 300, "{}[]\",: abcdexyz01.-etruflsn\\", 6));
  const int32_t n = vocab->size();
  for (int walk = 0; walk < 12; ++walk) {
    auto g = walk % 2 == 0 ? any_json_grammar() : *schema;
    GrammarMatcher m(g, vocab);
    std::vector<int32_t> history;
    std::vector<uint32_t> mask(GrammarMatcher::bitmask_words(static_cast<size_t>(n)));
    for (int step = 0; step < 25 && !m.is_terminated(); ++step) {
      m.fill_next_token_bitmask(mask);
      std::vector<int32_t> allowed;
      ASSERT_NO_FATAL_FAILURE(expect_mask_is_brute_force(g, vocab, history, mask, "", &allowed));
      ASSERT_FALSE(allowed.empty());
      const int32_t pick = allowed[rng() % allowed.size()];
      ASSERT_TRUE(m.accept_token(pick));
      history.push_back(pick);
    }
  }
}

// Bounded repetitions past the short-token horizon (x{0,k}, k > kShortTokenBytes + 1) share the
// masks of short tokens across the chain's ranks (Grammar::short_token_position) and walk long
// tokens from the exact rank: with tokens longer than the horizon, and walks that exhaust the
// chain (where a long token of the same bytes must be refused), masks still equal brute force.
TEST(GrammarMaskReferenceTest, RepetitionChainsPastTheShortTokenHorizon) {
  auto g = parse_gbnf(
      "root ::= \"[\" [ab]{0,40} \"]\" tail\n"
      "tail ::= \",\" \"\\\"\" ch{2,30} \"\\\"\" tail | \".\"\n"
      "ch ::= [a-c] | \"\\\\\" [ab]\n");
  ASSERT_TRUE(g.has_value()) << g.status().message();
  size_t mapped = 0;
  for (uint32_t p = 0; p < (*g)->elements().size(); ++p) mapped += (*g)->short_token_position(p) != p;
  ASSERT_GT(mapped, 0u) << "no chain position maps to the horizon rank: the test would not test it";
  std::mt19937 rng(7);
  std::vector<std::string> tokens;
  for (int len : {1, 2, 3, 5, 8, 15, 16, 17, 18, 20, 24, 30, 39, 40, 41, 45}) {
    for (int i = 0; i < 3; ++i) {
      std::string t;
      for (int j = 0; j < len; ++j) t += "ab"[rng() % 2];
      const std::string half = t.substr(0, static_cast<size_t>(len / 2));
      tokens.push_back(t);
      tokens.push_back(t + "]");
      tokens.push_back(t + "],\"");
      std::string quoted(1, '"');
      quoted.append(t, 0, static_cast<size_t>(std::min(len, 28))).append("\",\"");
      tokens.push_back(quoted);
      std::string escaped = half;
      escaped.append("\\a").append(half);
      tokens.push_back(escaped);
    }
  }
  auto vocab = test::byte_vocab(tokens);
  ASSERT_FALSE(vocab->long_tokens().empty());
  const int32_t n = vocab->size();
  int checked = 0;
  for (int walk = 0; walk < 16; ++walk) {
    GrammarMatcher m(*g, vocab);
    std::vector<int32_t> history;
    std::vector<uint32_t> mask(GrammarMatcher::bitmask_words(static_cast<size_t>(n)));
    for (int step = 0; step < 30 && !m.is_terminated(); ++step) {
      m.fill_next_token_bitmask(mask);
      std::vector<int32_t> allowed;
      ASSERT_NO_FATAL_FAILURE(expect_mask_is_brute_force(*g, vocab, history, mask, "", &allowed));
      ++checked;
      if (allowed.empty()) break;
      // Prefer the longest allowed tokens, so chains run out within a walk.
      std::sort(allowed.begin(), allowed.end(), [&](int32_t a, int32_t b) {
        return vocab->token_bytes(a).size() > vocab->token_bytes(b).size();
      });
      const size_t pick =
          walk % 4 == 0 ? rng() % allowed.size() : rng() % std::min<size_t>(allowed.size(), 4);
      if (allowed[pick] == test::end_id(*vocab)) break;
      ASSERT_TRUE(m.accept_token(allowed[pick]));
      history.push_back(allowed[pick]);
    }
  }
  EXPECT_GT(checked, 100);
}

}  // namespace
}  // namespace inferd
