#include "grammar/grammar_cache.h"

#include <nlohmann/json.hpp>

namespace inferd {

Expected<std::shared_ptr<const Grammar>> compile_grammar(const GrammarSpec& spec) {
  switch (spec.kind) {
    case GrammarKind::kGbnf: return parse_gbnf(spec.text);
    case GrammarKind::kJsonObject: return any_json_grammar(spec.json);
    case GrammarKind::kRegex: return grammar_from_regex(spec.text);
    case GrammarKind::kJsonSchema:
    case GrammarKind::kChoice: {
      nlohmann::ordered_json j;
      try {
        j = nlohmann::ordered_json::parse(spec.text);
      } catch (const nlohmann::json::exception& e) {
        return invalid_argument(
            std::string(spec.kind == GrammarKind::kChoice ? "guided_choice" : "json_schema") +
            ": not JSON: " + e.what());
      }
      if (spec.kind == GrammarKind::kJsonSchema) return grammar_from_json_schema(j, spec.json);
      if (!j.is_array()) return invalid_argument("guided_choice: not an array of strings");
      std::vector<std::string> choices;
      for (const auto& c : j) {
        if (!c.is_string()) return invalid_argument("guided_choice: not an array of strings");
        choices.push_back(c.get<std::string>());
      }
      return grammar_from_choices(choices);
    }
  }
  return invalid_argument("grammar: unknown kind");
}

GrammarCache::GrammarCache(size_t capacity) : capacity_(capacity == 0 ? 1 : capacity) {}

Expected<std::shared_ptr<const Grammar>> GrammarCache::get(const GrammarSpec& spec) {
  std::string key(1, static_cast<char>('0' + static_cast<int>(spec.kind)));
  key += spec.json.key();
  key += '\n';
  key += spec.text;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (auto it = by_key_.find(key); it != by_key_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second);
      ++hits_;
      return it->second->second;
    }
    ++misses_;
  }
  INFERD_ASSIGN_OR_RETURN(std::shared_ptr<const Grammar> grammar, compile_grammar(spec));
  std::lock_guard<std::mutex> lock(mutex_);
  if (auto it = by_key_.find(key); it != by_key_.end()) return it->second->second;  // compiled meanwhile
  lru_.emplace_front(key, grammar);
  by_key_.emplace(std::move(key), lru_.begin());
  while (lru_.size() > capacity_) {
    by_key_.erase(lru_.back().first);
    lru_.pop_back();
  }
  return grammar;
}

size_t GrammarCache::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return lru_.size();
}

uint64_t GrammarCache::num_hits() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return hits_;
}

uint64_t GrammarCache::num_misses() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return misses_;
}

}  // namespace inferd
