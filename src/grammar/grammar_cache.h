// GrammarCache: compiled grammars by content (kind + text), so requests with the same schema share
// one Grammar (and with it the per-vocabulary context masks it has learned). The front end asks it
// before compiling; thread-safe (any thread), bounded (least recently used goes first).
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "common/status.h"
#include "grammar/grammar.h"

namespace inferd {

enum class GrammarKind : uint8_t {
  kGbnf,        // text: GBNF
  kJsonSchema,  // text: the schema's JSON
  kJsonObject,  // text ignored: any JSON object
  kRegex,       // text: the regex
  kChoice,      // text: a JSON array of strings
};

struct GrammarSpec {
  GrammarKind kind = GrammarKind::kGbnf;
  std::string text;
  JsonGrammarOptions json;  // kJsonSchema, kJsonObject: the output's layout
};

// Compiles a spec without caching (what GrammarCache calls on a miss). Errors as the compilers'.
Expected<std::shared_ptr<const Grammar>> compile_grammar(const GrammarSpec& spec);

class GrammarCache final {
 public:
  explicit GrammarCache(size_t capacity = 256);

  // The grammar of `spec`, compiled on a miss (outside the lock); errors are not cached.
  Expected<std::shared_ptr<const Grammar>> get(const GrammarSpec& spec);

  size_t size() const;
  uint64_t num_hits() const;
  uint64_t num_misses() const;

 private:
  using Entry = std::pair<std::string, std::shared_ptr<const Grammar>>;  // key, grammar
  const size_t capacity_;
  mutable std::mutex mutex_;  // guards everything below
  std::list<Entry> lru_;      // most recent first
  std::unordered_map<std::string, std::list<Entry>::iterator> by_key_;
  uint64_t hits_ = 0, misses_ = 0;
};

}  // namespace inferd
