// The OpenAI-compatible request and response shapes: parsing and validating request bodies of
// /v1/chat/completions and /v1/completions (every error names its field, as OpenAI's do), and
// building the JSON of responses and stream chunks. No I/O, no engine: the HTTP layer
// (http_server) calls these; the fuzz target feeds parse_generate_request random bodies.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/request.h"
#include "engine/sampler.h"

namespace inferd {

// An error answered to the client: HTTP status plus OpenAI's {"error": {...}} fields.
struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // the offending field, or empty
  std::string code;   // machine-readable code, or empty
};
std::string error_body(const ApiError& e);

enum class ApiEndpoint { kChat, kCompletion };

// One prompt of a completions request: text or token ids.
struct PromptInput {
  std::string text;
  std::vector<int32_t> ids;
  bool is_ids = false;
};

struct GenerateRequest {
  ApiEndpoint endpoint = ApiEndpoint::kChat;
  std::string model;
  nlohmann::ordered_json messages;   // chat: validated array of messages
  std::vector<PromptInput> prompts;  // completions: one or more prompts
  SamplingParams sampling;
  std::optional<int64_t> max_tokens;  // absent: up to the context window
  std::vector<std::string> stop;
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  int32_t n = 1;
  bool stream = false;
  bool include_usage = false;
  bool logprobs = false;  // return logprobs (sampling.logprobs holds how many alternatives)
  int32_t priority = 0;
  std::string user;
  std::optional<std::string> session_id;
};

// Parses and validates a request body. Unknown fields are ignored; a wrong type or a value out
// of range is a 400 naming the field.
struct ParsedRequest {
  std::optional<GenerateRequest> request;
  ApiError error;  // when !request
};
ParsedRequest parse_generate_request(ApiEndpoint endpoint, std::string_view body);

// /tokenize and /detokenize bodies.
struct TokenizeRequest {
  std::string prompt;
  nlohmann::ordered_json messages;  // instead of prompt: render with the chat template
  bool add_special_tokens = true;
};
struct ParsedTokenize {
  std::optional<TokenizeRequest> request;
  ApiError error;
};
ParsedTokenize parse_tokenize_request(std::string_view body);
struct ParsedDetokenize {
  std::optional<std::vector<int32_t>> tokens;
  ApiError error;
};
ParsedDetokenize parse_detokenize_request(std::string_view body);

// Splits generated text into reasoning (inside <think>...</think>) and content, incrementally:
// feed() returns what may be sent now of each part; text that could still be the start of a tag
// is held back until finish().
class ReasoningSplitter final {
 public:
  // starts_in_reasoning: the prompt itself opened <think> (templates that add it).
  explicit ReasoningSplitter(bool starts_in_reasoning = false);
  struct Parts {
    std::string reasoning, content;
  };
  Parts feed(std::string_view text);
  Parts finish();

 private:
  Parts drain(bool final);
  enum class State { kStart, kReasoning, kContent } state_;
  bool strip_newlines_ = false;
  std::string pending_;
};

}  // namespace inferd
