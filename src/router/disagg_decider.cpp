#include "router/disagg_decider.h"

namespace inferd {

DisaggDecision DisaggDecider::decide(const DisaggInputs& in) const {
  if (!in.prefill_available) return {false, "no_prefill"};
  if (!in.decode_available) return {false, "no_decode"};
  if (in.blocker) return {false, *in.blocker};
  const int64_t uncached = in.prompt_tokens - in.matched_tokens;
  if (uncached < min_tokens_) return {false, "short_prompt"};
  return {true, "disaggregated"};
}

}  // namespace inferd
