// Beam search (vLLM's use_beam_search, Hugging Face's num_beams) driven over the engine, as
// vLLM's front end drives it: each step runs one single-token request per live beam (the prompt
// plus the beam's tokens, whose KV the prefix cache mostly holds) asking for the top 2 x width
// log-probabilities. Of all continuations the `width` likeliest by cumulative log-probability
// go on; one that ends in a stop token is complete and stops there. When no beam is live or
// max_tokens is reached, the complete and live beams are ranked by
// cumulative log-probability / (generated tokens ^ length_penalty) and the best `width` answered.
// Deterministic: the log-probabilities are the model's own, no sampling.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "engine/engine.h"

namespace inferd {

struct BeamSearchParams {
  int32_t width = 1;
  int64_t max_tokens = 16;
  float length_penalty = 1.0f;
  std::vector<int32_t> stop_token_ids;  // a beam that writes one is complete (empty: ignore_eos)
  // Keep each beam token's log-probability, and the top k alternatives when k > 0 (absent: none).
  std::optional<int32_t> logprobs;
};

struct Beam {
  std::vector<int32_t> tokens;  // generated, the stop token of a complete beam last
  double logprob = 0.0;         // cumulative, the stop token's included
  bool complete = false;
  // With BeamSearchParams::logprobs: per token, its log-probability and the top alternatives.
  std::vector<float> token_logprobs;
  std::vector<std::vector<std::pair<int32_t, float>>> top_logprobs;
  // logprob / length^length_penalty, the length without the stop token (Hugging Face's and
  // vLLM's rule; at least 1).
  double score(float length_penalty) const;
};

class BeamSearch final : public std::enable_shared_from_this<BeamSearch> {
 public:
  using OutputCallback = std::function<void(const StepOutput&)>;
  using Submit = std::function<RequestId(RequestSpec, OutputCallback)>;
  using Abort = std::function<void(RequestId)>;
  // The answer: the best beams, best first, or `error` (internal: the server's fault). Called
  // once, on the thread that delivered the last step's output (or that called cancel()).
  using Done = std::function<void(std::vector<Beam> beams, const std::string& error, bool internal)>;

  // Starts the search for `prompt` (its prompt, lora, priority, session and SLO class are each
  // step's; its sampling and limits are replaced). submit/abort: the engine's (thread-safe).
  static std::shared_ptr<BeamSearch> start(RequestSpec prompt, BeamSearchParams params, Submit submit,
                                           Abort abort, Done done);
  // Stops the search: aborts the step in flight; done gets the error "aborted". Thread-safe;
  // nothing after the search ended.
  void cancel();

  BeamSearch(RequestSpec prompt, BeamSearchParams params, Submit submit, Abort abort, Done done);

 private:
  void submit_step();  // mutex_ held
  void on_output(size_t beam, const StepOutput& out);
  void expand();  // mutex_ held: the step's candidates -> the next live beams
  void finish(const std::string& error, bool internal);  // mutex_ held

  RequestSpec prompt_;
  BeamSearchParams params_;
  Submit submit_;
  Abort abort_;
  Done done_;
  std::mutex mutex_;
  bool ended_ = false;
  int64_t steps_ = 0;
  std::vector<Beam> live_, complete_;
  std::vector<RequestId> in_flight_;                                // this step's requests
  std::vector<std::vector<std::pair<int32_t, float>>> candidates_;  // per live beam: top tokens
  size_t pending_ = 0;                                              // this step's unanswered beams
};

}  // namespace inferd
