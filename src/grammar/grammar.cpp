#include "grammar/grammar.h"

#include <cstdio>

#include "common/check.h"
#include "grammar/gbnf_parser.h"
#include "grammar/grammar_builder.h"
#include "grammar/grammar_vocab.h"
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
  return builder.build(rules);
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

Expected<std::shared_ptr<const Grammar>> grammar_from_choices(const std::vector<std::string>& choices) {
  if (choices.empty()) return invalid_argument("guided_choice: no choices");
  std::string text = "root ::= ";
  for (size_t i = 0; i < choices.size(); ++i) {
    if (i > 0) text += " | ";
    text += gbnf_literal(choices[i]);
  }
  auto g = parse_gbnf(text + "\n");
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
