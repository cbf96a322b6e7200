// Output constraints of the front end's input side: a request's response_format / structured
// outputs, or its tool_choice "required" / named function, compiled into the grammar the
// sampler masks logits with (grammar/). Compiled grammars are cached by their source.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "engine/tool_call_parser.h"
#include "grammar/grammar.h"

namespace inferd {

struct StructuredOutput;

// The GBNF that forces tool calls in `format` (hermes: <tool_call> blocks; llama3_json: bare
// objects joined by "; "): each call one of `tools`' functions (all of them, or only `name`
// when not empty) with arguments matching its parameter schema; at least one call, at most one
// unless `parallel`. Errors name the schema keyword inferd cannot compile.
Expected<std::string> tool_call_gbnf(ToolCallFormat format, const nlohmann::ordered_json& tools,
                                     const std::string& name, bool parallel);

// Compiled grammars by source, least recently used dropped beyond `capacity`. Thread-safe.
class GrammarCache final {
 public:
  explicit GrammarCache(size_t capacity = 256) : capacity_(capacity) {}
  // The compiled grammar of `key` (kind and source text), compiling it with `compile` on a miss.
  template <typename Compile>
  Expected<std::shared_ptr<const Grammar>> get(const std::string& key, Compile compile) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (auto it = index_.find(key); it != index_.end()) {
        order_.splice(order_.begin(), order_, it->second);
        return it->second->second;
      }
    }
    Expected<std::shared_ptr<const Grammar>> g = compile();  // outside the lock: compiles may be slow
    if (!g) return g;
    std::lock_guard<std::mutex> lock(mutex_);
    if (index_.count(key) == 0) {
      order_.emplace_front(key, *g);
      index_[key] = order_.begin();
      if (order_.size() > capacity_) {
        index_.erase(order_.back().first);
        order_.pop_back();
      }
    }
    return g;
  }
  size_t size() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return order_.size();
  }

 private:
  using Entry = std::pair<std::string, std::shared_ptr<const Grammar>>;
  size_t capacity_;
  mutable std::mutex mutex_;
  std::list<Entry> order_;  // most recent first
  std::unordered_map<std::string, std::list<Entry>::iterator> index_;
};

// Compiles a structured-output request through `cache`.
Expected<std::shared_ptr<const Grammar>> compile_structured_output(const StructuredOutput& so,
                                                                   GrammarCache& cache);

}  // namespace inferd
