// Sampler: turns one row of logits into the next token (greedy or seeded random sampling).
// The engine calls it per sampling row after the forward pass.
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "grammar/grammar.h"
#include "grammar/grammar_matcher.h"
#include "grammar/grammar_vocab.h"

namespace inferd {

// An output constraint: the grammar the output must match and the vocabulary its token masks are
// over (both immutable and shared by every sequence that uses them).
struct GrammarConstraint {
  std::shared_ptr<const Grammar> grammar;
  std::shared_ptr<const GrammarVocab> vocab;
};

struct SamplingParams {
  float temperature = 0.0f;  // 0 = greedy (argmax)
  int32_t top_k = 0;         // 0 = off
  float top_p = 1.0f;        // 1 = off
  std::optional<uint64_t> seed;
  float min_p = 0.0f;               // drop tokens below min_p x the top probability (0 = off)
  float repetition_penalty = 1.0f;  // > 1 discourages tokens of the prompt and output (1 = off)
  float presence_penalty = 0.0f;    // subtracted once from tokens already generated
  float frequency_penalty = 0.0f;   // subtracted per occurrence in the generated tokens
  std::optional<int32_t> logprobs;  // absent: none; 0: the chosen token's; k: also the top k
  // vLLM's prompt_logprobs: each prompt token's log-probability given the tokens before it (from
  // the second on), with the top k; absent: none.
  std::optional<int32_t> prompt_logprobs;
  // Added to a token's logit before sampling (OpenAI's logit_bias: each in [-100, 100]; -100
  // bans the token, 100 all but forces it). Ids are checked against the vocabulary by the caller.
  std::vector<std::pair<int32_t, float>> logit_bias;
  // The output must match this grammar: tokens it does not allow are masked before sampling
  // (so temperature, top-k, top-p and min-p act within the allowed set; end tokens are allowed
  // only where the grammar can end).
  std::optional<GrammarConstraint> grammar;
  // Masks (vLLM's fields of the same names), applied after logit_bias:
  // - min_tokens: until the output has this many tokens, `end_token_ids` (the request's stop
  //   tokens with the model's end-of-sequence ones, filled by the input processor) are masked.
  // - allowed_token_ids: when not empty, every other token is masked.
  // - bad_words: token sequences the output must not contain; a sequence's last token is masked
  //   where the output ends with the rest of it (a one-token sequence: always).
  int32_t min_tokens = 0;
  std::vector<int32_t> end_token_ids;
  std::vector<int32_t> allowed_token_ids;
  std::vector<std::vector<int32_t>> bad_words;

  // The one table of their bounds (every front end's requests pass through it): the first
  // field out of range, with a message naming it.
  struct FieldError {
    std::string field, message;
  };
  std::optional<FieldError> check() const;
  // check() as a Status.
  Status validate() const;
};

// A sampled token, with log-probabilities (of the model's raw distribution) when asked.
struct SampleResult {
  int32_t token = 0;
  float logprob = 0;
  std::vector<std::pair<int32_t, float>> top_logprobs;  // best first
  // The grammar, or the masks above, allowed no token of the vocabulary (token: the unmasked
  // argmax); dead_end_error() says why.
  bool dead_end = false;
  int64_t rank = 0;  // prompt logprobs: 1 + how many tokens the model found likelier than `token`
};

class Sampler final {
 public:
  // The random stream is seeded from params.seed (or from the OS when absent); with a grammar,
  // the sequence's matcher starts at the grammar's start.
  explicit Sampler(const SamplingParams& params);

  // Picks a token from `logits` ([vocab]). Greedy ties go to the lowest id. Allocates only
  // when the vocabulary grows.
  int32_t sample(std::span<const float> logits);

  // As above, with penalties over the request's `prompt` and `output` so far, and logprobs (of
  // the model's own distribution, before penalties and biases, as vLLM reports them).
  // Order: penalties, logit_bias, grammar mask, temperature, top-k, top-p, min-p, draw; the
  // grammar then advances by the token.
  SampleResult sample(std::span<const float> logits, std::span<const int32_t> prompt,
                      std::span<const int32_t> output);

  // The log-probability of `token` in the model's distribution `logits`, its rank, and the top k
  // (prompt logprobs: no sampling, no state change).
  SampleResult logprobs_of(std::span<const float> logits, int32_t token, int32_t k);

  // With a grammar: computes the mask of the next token now (over num_logits ids), so that the
  // next sample() only applies it (MaskPrefetcher calls it while the forward pass runs; the
  // sampler must not be used concurrently). No-op without a grammar.
  void prepare_grammar_mask(size_t num_logits);
  bool has_grammar() const { return matcher_.has_value(); }
  // Why the last dead_end happened: the grammar's matcher failed (too ambiguous to follow,
  // GrammarMatcher::failed()), the masks ruled out every token, or the grammar allows no token
  // of the vocabulary.
  std::string dead_end_error() const;

 private:
  int32_t draw(std::span<const float> logits);
  // Sorts the candidates kept by top_p / min_p (no top_k) to the front, as weights; returns how
  // many (before min_p's own cut, which draw applies).
  template <typename Less>
  size_t sort_kept_prefix(Less by_logit);
  void apply_penalties(std::span<const int32_t> prompt, std::span<const int32_t> output);  // on adjusted_
  bool apply_grammar_mask();  // on adjusted_; false when the grammar allows no token
  // min_tokens, allowed_token_ids and bad_words on adjusted_, given the output so far.
  void apply_masks(std::span<const int32_t> output);
  bool has_masks() const {
    return params_.min_tokens > 0 || !params_.allowed_token_ids.empty() || !params_.bad_words.empty();
  }

  void fill_logprobs(std::span<const float> logits, SampleResult* r, int32_t k);
  // weights_ and block_sums_ of logits at temperature (kernels/sampling_kernels.h): returns the
  // weights' total (0 when every logit is -inf) and sets *max_scaled to max / temperature.
  double weigh(std::span<const float> logits, float temperature, float* max_scaled);

  SamplingParams params_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> candidates_;
  std::vector<float> weights_, block_sums_;  // the whole distribution's (kernels/sampling_kernels.h)
  std::vector<float> adjusted_;              // logits after penalties
  std::vector<int32_t> counts_;              // occurrences in the output, per token (zero between calls)
  std::vector<uint8_t> seen_;                // token in prompt or output (zero between calls)
  std::vector<int32_t> touched_;             // the tokens a call marked in seen_
  std::optional<GrammarMatcher> matcher_;
  std::vector<uint32_t> bitmask_;  // allowed tokens of the grammar (GrammarMatcher's layout)
  bool mask_prepared_ = false;     // bitmask_ holds the current state's mask
  std::vector<uint8_t> allowed_;   // allowed_token_ids as a per-token flag (built on first use)
  bool masks_dead_end_ = false;    // the last dead end came from the masks, not the grammar
};

// Index of the largest value (lowest index on ties).
int32_t argmax(std::span<const float> values);

}  // namespace inferd
