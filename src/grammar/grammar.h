// Grammar: a compiled context-free grammar over bytes, the constraint of one structured-output
// request (GBNF, JSON schema, regex or a choice list). The front end compiles it once (or takes it
// from GrammarCache); each sequence's GrammarMatcher walks it while the sampler masks logits.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace inferd {

class GrammarVocab;
class TokenMaskCache;

// A set of bytes (256 bits): one terminal of the grammar.
struct ByteSet {
  std::array<uint64_t, 4> words{};
  void set(uint8_t b) { words[b >> 6] |= uint64_t{1} << (b & 63); }
  void set_range(uint8_t lo, uint8_t hi) {
    for (int b = lo; b <= hi; ++b) set(static_cast<uint8_t>(b));
  }
  bool test(uint8_t b) const { return (words[b >> 6] >> (b & 63)) & 1; }
  bool operator==(const ByteSet&) const = default;
};

enum class GrammarElementKind : uint8_t {
  kBytes,  // match one byte of byte_sets()[value]
  kRule,   // expand rule `value`
  kEnd,    // end of an alternative
};

struct GrammarElement {
  GrammarElementKind kind = GrammarElementKind::kEnd;
  uint32_t value = 0;
};

// Rules as flat element sequences, each alternative ending with kEnd:
//
//   elements: [Rule root][End] | [Bytes 0][Rule 2][End] | [End] | ...
//              position 0: the start (root, then the end of input)
//   rule(r).alternatives = positions of the first element of each alternative
//
// Immutable once built, except for the per-vocabulary token-mask caches it owns, which are
// guarded by a mutex: a Grammar is thread-safe to share (std::shared_ptr<const Grammar>).
class Grammar final {
 public:
  struct Rule {
    std::string name;
    std::vector<uint32_t> alternatives;
  };

  // short_token_positions: see short_token_position(); empty = the identity.
  Grammar(std::vector<GrammarElement> elements, std::vector<ByteSet> byte_sets, std::vector<Rule> rules,
          std::vector<uint32_t> short_token_positions = {});
  ~Grammar();
  Grammar(const Grammar&) = delete;
  Grammar& operator=(const Grammar&) = delete;

  static constexpr uint32_t kStartPosition = 0;  // [Rule root][End]

  const std::vector<GrammarElement>& elements() const { return elements_; }
  const GrammarElement& element(uint32_t position) const { return elements_[position]; }
  const ByteSet& byte_set(uint32_t index) const { return byte_sets_[index]; }
  const std::vector<Rule>& rules() const { return rules_; }
  size_t num_byte_sets() const { return byte_sets_.size(); }

  // A position that parses every input of at most kShortTokenBytes bytes exactly as `position`
  // does: the same offset in a shorter rule of a bounded repetition chain (x{0,k} ::= x x{0,k-1} | ε
  // for k past the horizon behaves like x{0,kShortTokenBytes + 1} within it), else `position`.
  // TokenMaskCache keys masks of short tokens by it, so x{0,40} costs one trie walk, not forty.
  uint32_t short_token_position(uint32_t position) const {
    return short_token_positions_.empty() ? position : short_token_positions_[position];
  }

  // The rules in GBNF-like text (byte sets as [\xHH-\xHH]); for tests and debugging.
  std::string to_string() const;

  // The context-independent token masks of this grammar for `vocab`, made on first use and kept
  // for the grammar's lifetime (one per vocabulary; it refers to this grammar, so use it only
  // while the grammar lives, as GrammarMatcher does by holding both). Thread-safe.
  std::shared_ptr<TokenMaskCache> token_mask_cache(const std::shared_ptr<const GrammarVocab>& vocab) const;

 private:
  std::vector<GrammarElement> elements_;
  std::vector<ByteSet> byte_sets_;
  std::vector<Rule> rules_;
  std::vector<uint32_t> short_token_positions_;  // [elements] or empty

  struct VocabCache {
    std::weak_ptr<const GrammarVocab> vocab;
    std::shared_ptr<TokenMaskCache> cache;
  };
  mutable std::mutex mutex_;
  mutable std::vector<VocabCache> vocab_caches_;
};

// llama.cpp's GBNF (grammars/README.md): `name ::= alternatives`, "literals" with escapes,
// [classes], [^negated], `.`, ( groups ), * + ? {m} {m,} {m,n}, # comments; the start rule is
// `root`. Characters are code points, matched as their UTF-8 bytes. Errors name line and column.
Expected<std::shared_ptr<const Grammar>> parse_gbnf(std::string_view text);

// How JSON output is laid out (vLLM's structured-output options; docs/grammar.md).
struct JsonGrammarOptions {
  enum class Whitespace : uint8_t {
    kCompact,  // inferd's policy: an optional single space after ':' and ','
    kNone,     // none at all (vLLM's disable_any_whitespace)
    kPattern,  // `whitespace_pattern` (a regex) before and after every ':' and ',', after every
               // '{' and '[' and before every '}' and ']' (outlines' positions)
  };
  Whitespace whitespace = Whitespace::kCompact;
  std::string whitespace_pattern;
  // An object schema without additionalProperties: no other keys (inferd's default, OpenAI's
  // strict mode) or any others, JSON Schema's own default (vLLM's disable_additional_properties
  // false).
  bool additional_properties_by_default = false;
  bool operator==(const JsonGrammarOptions&) const = default;
  // A short text naming the options, for cache keys ("" for the defaults).
  std::string key() const;
};

// The GBNF a JSON schema compiles to (docs/grammar.md lists the keywords); an unsupported keyword
// is an error naming it and its JSON pointer, never a silently looser grammar.
Expected<std::string> json_schema_to_gbnf(const nlohmann::ordered_json& schema,
                                          const JsonGrammarOptions& options = {});
Expected<std::shared_ptr<const Grammar>> grammar_from_json_schema(const nlohmann::ordered_json& schema,
                                                                  const JsonGrammarOptions& options = {});

// Any JSON object (OpenAI response_format json_object); compiled once, shared.
std::shared_ptr<const Grammar> any_json_grammar();
// The same in other layouts (a whitespace pattern that does not compile is an error).
Expected<std::shared_ptr<const Grammar>> any_json_grammar(const JsonGrammarOptions& options);

// The GBNF expression of a regex (vLLM guided_regex: the whole output matches). Supported: literals,
// escapes (\d \w \s \D \W \S \n \t \r \f \v \xHH \uHHHH, escaped punctuation), classes, `.`,
// groups ( ) (?: ) (?P<n> ) (?<n> ), |, * + ? {m} {m,} {m,n} (lazy forms too), ^ at the start and $
// at the end. Anything else (backreferences, lookaround, \b ...) is an error naming it.
// `in_json_string`: the expression matches a JSON string's content, escaping `"` `\` and control
// characters the pattern writes literally and leaving them out of classes and `.`.
Expected<std::string> regex_to_gbnf(std::string_view regex, bool in_json_string);
Expected<std::shared_ptr<const Grammar>> grammar_from_regex(std::string_view regex);

// Exactly one of `choices` (vLLM guided_choice); error when empty.
Expected<std::shared_ptr<const Grammar>> grammar_from_choices(const std::vector<std::string>& choices);

// `text` as a GBNF string literal ("..." with escapes), e.g. for generated grammars.
std::string gbnf_literal(std::string_view utf8);

// A GBNF expression matching exactly one of `strings` (valid UTF-8, else an error naming the
// index; duplicates allowed), with one parse alive however many there are: shared prefixes are
// written once, as a radix tree whose inner nodes become rules made by `add_rule(body)` (which
// returns the rule's name). guided_choice and JSON schema enums use it.
Expected<std::string> gbnf_alternatives_tree(std::vector<std::string> strings,
                                             const std::function<std::string(const std::string&)>& add_rule);

}  // namespace inferd
