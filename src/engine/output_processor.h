// OutputProcessor: the output side of the one request front end, one per choice (a sample of
// one prompt). Turns the engine's StepOutputs into what a client sees: text detokenized
// incrementally (never half a UTF-8 character), stop strings (which end the choice: the caller
// aborts its sample), the reasoning split (<think>...</think> apart from the content), the
// tokens' logprobs, the finish reason and the token timings. Used by the server, `inferd
// generate` and `inferd run` alike; owned by whoever consumes the choice's outputs.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/engine.h"
#include "engine/reasoning_splitter.h"
#include "engine/tool_call_parser.h"
#include "tokenizer/incremental_detokenizer.h"
#include "tokenizer/tokenizer.h"

namespace inferd {

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0;
  std::vector<std::pair<int32_t, float>> top;  // best first
  int64_t rank = 0;                            // prompt logprobs: 1 + the tokens likelier than it
};

// What one engine output adds to a choice.
struct ChoiceDelta {
  std::string content;                    // new text (all of it, without the reasoning split or tool calls)
  std::string reasoning;                  // new reasoning text (with the reasoning split)
  std::vector<ToolCallDelta> tool_calls;  // with tool-call parsing
  std::vector<int32_t> tokens;
  std::vector<TokenLogprob> logprobs;  // of `tokens`, when the request asked for them
  bool finished = false;               // the choice ended with this output
  bool stop_string = false;            // ... because a stop string matched: abort its sample
};

struct OutputOptions {
  std::vector<std::string> stop;             // stop strings
  bool include_stop_str_in_output = false;   // a matched stop string ends the text (vLLM's option)
  std::optional<ReasoningParser> reasoning;  // split reasoning from content by these rules
  bool prompt_opens_think = false;
  std::string echo;                          // text that comes before the first token's (completions' echo)
  std::optional<ToolCallFormat> tool_calls;  // find tool calls in the content, in this format
  int32_t max_tool_calls = 1;
  bool skip_special_tokens = true;  // special tokens add no text (vLLM's skip_special_tokens)
  int32_t min_tokens = 0;           // stop strings count from this many tokens on (vLLM's min_tokens)
  int32_t prompt_head = -1;         // the prompt's first token (prompt logprobs start after it)
};

class OutputProcessor final {
 public:
  using Clock = std::chrono::steady_clock;
  // tokenizer: not owned, may be null (then the text is the token ids, space-separated).
  OutputProcessor(const Tokenizer* tokenizer, const OutputOptions& options);

  // Applies one engine output of this choice, received at `at`. Outputs after the choice
  // finished (a stop string ended it before the engine knew) add nothing.
  ChoiceDelta apply(const StepOutput& out, Clock::time_point at);

  bool finished() const { return finish_reason_.has_value(); }
  // Set once finished: kStop (stop token or string), kLength, kAborted or kError.
  std::optional<FinishReason> finish_reason() const { return finish_reason_; }
  const std::string& error() const { return error_; }      // with kError
  bool internal_error() const { return internal_error_; }  // the server failed, not the request
  const std::vector<int32_t>& token_ids() const { return ids_; }
  const std::string& text() const { return text_; }
  const std::string& reasoning() const { return reasoning_; }
  // The complete tool calls found (with tool-call parsing).
  const std::vector<ToolCall>& tool_calls() const;
  const std::vector<TokenLogprob>& logprobs() const { return logprobs_; }
  // With prompt_logprobs: the prompt's tokens from the second on, in order.
  const std::vector<TokenLogprob>& prompt_logprobs() const { return prompt_logprobs_; }
  int32_t prompt_head() const { return prompt_head_; }
  std::optional<Clock::time_point> first_token_at() const { return first_token_; }
  std::optional<Clock::time_point> last_token_at() const { return last_token_; }
  // When the engine first scheduled the choice's request (absent: never ran).
  std::optional<Clock::time_point> first_scheduled_at() const { return first_scheduled_; }
  // The prompt tokens its request found in the prefix cache when it first ran.
  int64_t cached_tokens() const { return cached_tokens_; }
  // Predicted outputs: the prediction's drafts verified so far, and those kept.
  int64_t predicted_tokens() const { return predicted_; }
  int64_t accepted_predicted_tokens() const { return accepted_predicted_; }
  // Gaps between successive tokens of the last apply() (for the inter-token histogram).
  const std::vector<double>& last_gaps_seconds() const { return gaps_; }

 private:
  std::string detokenize(int32_t token, bool* stopped);

  const Tokenizer* tokenizer_;
  bool include_stop_;
  int32_t prompt_head_;
  std::string echo_;  // until the first apply()
  std::optional<IncrementalDetokenizer> detok_;
  std::optional<ReasoningSplitter> splitter_;
  std::optional<ToolCallParser> tool_parser_;
  std::vector<int32_t> ids_;
  std::vector<TokenLogprob> logprobs_, prompt_logprobs_;
  std::string text_, reasoning_;
  std::optional<FinishReason> finish_reason_;
  std::string error_;
  bool internal_error_ = false;
  std::optional<Clock::time_point> first_token_, last_token_, first_scheduled_;
  std::vector<double> gaps_;
  int64_t predicted_ = 0, accepted_predicted_ = 0;
  int64_t cached_tokens_ = 0;
};

}  // namespace inferd
