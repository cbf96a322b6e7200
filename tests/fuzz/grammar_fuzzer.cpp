// libFuzzer target: the structured-output front ends a request reaches (GBNF text, a regex, a JSON
// schema, a choice list), then a walk of what compiled: token masks, accepted tokens and rollbacks
// over a small vocabulary of single bytes and a few multi-byte tokens. The first input byte picks
// the front end; the rest is its text. Every error must come back as a Status.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "grammar/grammar.h"
#include "grammar/grammar_matcher.h"
#include "grammar/grammar_vocab.h"

namespace {

using inferd::Expected;
using inferd::Grammar;

std::shared_ptr<const inferd::GrammarVocab> fuzz_vocab() {
  static const auto vocab = [] {
    inferd::GrammarVocabSpec spec;
    for (int b = 0; b < 256; ++b) spec.token_bytes.emplace_back(1, static_cast<char>(b));
    for (const char* t : {"\"", "{\"", "\":", "\": \"", "true", "null", "12", "-0.5e3", "\\u00", "é",
                          "\xe2\x82", "\xac", "ab", "abc", "    ", "\n"})
      spec.token_bytes.emplace_back(t);
    spec.token_bytes.emplace_back("<special>");
    spec.special_ids.push_back(static_cast<int32_t>(spec.token_bytes.size() - 1));
    spec.token_bytes.emplace_back("<eos>");
    spec.end_ids.push_back(static_cast<int32_t>(spec.token_bytes.size() - 1));
    return *inferd::GrammarVocab::create(std::move(spec));
  }();
  return vocab;
}

Expected<std::shared_ptr<const Grammar>> compile(uint8_t mode, const std::string& text) {
  switch (mode % 5) {
    case 0: return inferd::parse_gbnf(text);
    case 1: return inferd::grammar_from_regex(text);
    case 2: {
      (void)inferd::regex_to_gbnf(text, true);
      return inferd::grammar_from_regex(text);
    }
    case 3: {
      const auto schema = nlohmann::ordered_json::parse(text, nullptr, false);
      if (schema.is_discarded()) return inferd::invalid_argument("not JSON");
      return inferd::grammar_from_json_schema(schema);
    }
    default: {
      std::vector<std::string> choices;
      size_t start = 0;
      for (size_t i = 0; i <= text.size(); ++i) {
        if (i == text.size() || text[i] == '\n') {
          choices.push_back(text.substr(start, i - start));
          start = i + 1;
        }
      }
      return inferd::grammar_from_choices(choices);
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  auto grammar = compile(data[0], text);
  if (!grammar) return 0;
  (void)(*grammar)->to_string();
  // A walk driven by the input's bytes: each picks one of the allowed tokens.
  const auto vocab = fuzz_vocab();
  inferd::GrammarMatcher matcher(*grammar, vocab);
  std::vector<uint32_t> mask(inferd::GrammarMatcher::bitmask_words(static_cast<size_t>(vocab->size())));
  size_t accepted = 0;
  for (size_t step = 0; step < 24 && !matcher.is_terminated(); ++step) {
    matcher.fill_next_token_bitmask(mask);
    std::vector<int32_t> allowed;
    for (int32_t id = 0; id < vocab->size(); ++id) {
      if ((mask[static_cast<size_t>(id) >> 5] >> (id & 31)) & 1) allowed.push_back(id);
    }
    if (allowed.empty()) break;
    const int32_t id = allowed[data[step % size] % allowed.size()];
    if (!matcher.accept_token(id)) {
      if (matcher.failed()) break;  // too ambiguous to follow: it says so instead
      __builtin_trap();             // the mask allowed it
    }
    ++accepted;
  }
  if (accepted > 0) (void)matcher.rollback(accepted / 2 + 1);
  (void)matcher.accept_bytes(text.substr(0, 64));
  (void)matcher.can_end();
  return 0;
}
