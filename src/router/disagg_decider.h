// DisaggDecider: whether a request goes through a prefill instance and then a decode instance
// (docs/disaggregation.md) or straight to one instance that computes the prompt itself.
// Disaggregation pays a round trip and a KV transfer, so only long uncached prompts take it.
// Plain function of its inputs; thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace inferd {

struct DisaggInputs {
  bool prefill_available = false;      // a healthy prefill instance
  bool decode_available = false;       // a healthy decode instance
  std::optional<std::string> blocker;  // RoutedRequest::disagg_blocker
  int64_t prompt_tokens = 0;           // estimated: prompt bytes / 4
  int64_t matched_tokens = 0;          // estimated: the prefix the chosen prefill instance holds / 4
};

struct DisaggDecision {
  bool disaggregate = false;
  // Why: "disaggregated", "no_prefill", "no_decode", "short_prompt", or the blocking field.
  std::string reason;
};

class DisaggDecider final {
 public:
  // min_tokens: the least estimated uncached prompt tokens worth a transfer (--disagg-min-tokens).
  explicit DisaggDecider(int64_t min_tokens) : min_tokens_(min_tokens) {}

  DisaggDecision decide(const DisaggInputs& in) const;
  int64_t min_tokens() const { return min_tokens_; }

 private:
  int64_t min_tokens_;
};

}  // namespace inferd
