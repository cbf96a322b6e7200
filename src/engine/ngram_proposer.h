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

// Drafts per step from a request's prediction when the server has no speculative config.
inline constexpr int32_t kPredictionDraftTokens = 8;

// Predicted outputs: appends to `draft` (cleared first) at most min(k, max_tokens) tokens of
// `prediction` that follow where the output's last tokens (4 down to 1 of them) occur in it,
// the first such place at or after `*cursor` (where the previous draft was taken), else the
// first anywhere; `*cursor` becomes the end of the match. None when no token of the output's
// end occurs. O(len(prediction) x 4) per call, no allocation beyond `draft`'s.
void propose_from_prediction(std::span<const int32_t> prediction, std::span<const int32_t> output, int32_t k,
                             int64_t max_tokens, int64_t* cursor, std::vector<int32_t>* draft);

}  // namespace inferd
