// Prompt lookup (n-gram) drafting for speculative decoding: the tokens that followed the latest
// earlier occurrence of the sequence's last n tokens (n from prompt_lookup_max down to
// prompt_lookup_min) are proposed as its next ones. No model runs: a summary or an edit of a
// document copies long spans of its prompt, and those spans are verified in one target step.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace inferd {

struct NgramOptions {
  int32_t num_speculative_tokens = 5;  // k: at most this many drafts
  int32_t prompt_lookup_min = 2;       // the shortest suffix that may match
  int32_t prompt_lookup_max = 4;       // the longest one tried first
};

// Appends to `draft` (cleared first) at most min(k, max_tokens) tokens of `history` (prompt then
// output) that followed the most recent earlier occurrence of its longest matching suffix; none
// when no suffix of prompt_lookup_min tokens or more occurs earlier. O(len x max) per call, no
// allocation beyond `draft`'s.
void propose_ngram(std::span<const int32_t> prompt, std::span<const int32_t> output,
                   const NgramOptions& options, int64_t max_tokens, std::vector<int32_t>* draft);

}  // namespace inferd
