// OpenAI's Responses API (/v1/responses) on top of chat completions: a body's input items become
// the chat messages (its instructions the system message, a previous response's conversation the
// messages before them), its options the chat body's, and the chat output the Responses output
// items (reasoning, message, function_call) with their typed stream events. No I/O: http_server
// runs the chat request and calls these. The store of finished responses (store,
// previous_response_id, GET / DELETE /v1/responses/{id}) is here too.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/output_processor.h"
#include "server/openai_api.h"
#include "tokenizer/tokenizer.h"

namespace inferd {

struct ResponsesRequest {
  GenerateRequest generate;       // the chat request it runs as
  nlohmann::json echo;            // the settings the response object repeats (instructions, tools, ...)
  nlohmann::json history;         // the previous response's conversation (chat messages), or []
  nlohmann::json input_messages;  // this turn's input as chat messages
  nlohmann::json input_items;     // this turn's input items, each with an id
  bool stream = false;
  bool store = true;
  bool logprobs = false;  // include "message.output_text.logprobs" (or top_logprobs > 0)
};
struct ParsedResponses {
  std::optional<ResponsesRequest> request;
  ApiError error;
};
// The stored conversation a previous_response_id names (nullopt: none such).
using ConversationLookup = std::function<std::optional<nlohmann::json>(const std::string& id)>;
// Reads a /v1/responses body: Responses fields, and vLLM's sampling extras under their chat names
// (seed, top_k, min_p, stop, priority, ...). A field that would change the answer and is not
// implemented is a 400 naming it.
ParsedResponses parse_responses_request(std::string_view body, const ConversationLookup& previous);
// An error of the chat request a Responses body ran as, naming the Responses field instead
// (max_completion_tokens -> max_output_tokens, response_format -> text.format, messages -> input).
ApiError responses_error(ApiError e);

// One response's output and events, fed the chat output's deltas. Items open in the order the
// model writes them: its reasoning, then the message, then each function call.
class ResponsesAnswer final {
 public:
  // tokenizer: not owned, may be null (logprobs then name token ids).
  ResponsesAnswer(std::string id, int64_t created, std::string model, const ResponsesRequest& request,
                  const Tokenizer* tokenizer);

  const std::string& id() const { return id_; }
  // response.created and response.in_progress.
  std::string created_events();
  // What one chat delta adds; returns its stream events (the caller sends them when streaming).
  std::string apply(const ChoiceDelta& d);
  // The end (the choice finished without error): closes the open item, takes the parser's final
  // tool calls, sets status and usage; returns the last events (response.completed, or
  // response.incomplete when max_output_tokens ran out).
  std::string finish(const OutputProcessor& choice, int64_t input_tokens);
  // response.failed, with the error.
  std::string failed_event(const std::string& message, bool internal);
  // The response object (after finish(): the whole answer).
  const nlohmann::json& response() const { return response_; }
  // The assistant's turn as a chat message (content, reasoning_content, tool_calls).
  nlohmann::json assistant_message() const;

 private:
  enum class Kind { kReasoning, kMessage, kCall };
  struct Item {
    Kind kind = Kind::kMessage;
    std::string id;
    std::string text;  // reasoning text, message text or call arguments
    std::string call_id, name;
    int32_t call_index = -1;
    nlohmann::json logprobs = nlohmann::json::array();
    bool done = false;
  };
  std::string event(const char* type, nlohmann::json fields);
  nlohmann::json item_json(const Item& item) const;
  std::string open(Kind kind, std::string call_id = {}, std::string name = {}, int32_t call_index = -1);
  std::string close();  // the last item, if open
  nlohmann::json logprob_entries(const std::vector<TokenLogprob>& entries) const;

  std::string id_;
  std::string model_;
  const Tokenizer* tokenizer_;
  bool logprobs_;
  nlohmann::json response_;
  std::vector<Item> items_;
  std::string held_space_;                                  // whitespace not yet shown as a message
  nlohmann::json held_logprobs_ = nlohmann::json::array();  // tokens that produced no text yet
  int64_t sequence_ = 0;
  int64_t reasoning_tokens_ = 0;
};

// Finished responses kept for previous_response_id and GET /v1/responses/{id}: the newest
// `capacity`, the oldest dropped first. Thread-safe (input workers look up conversations).
class ResponseStore final {
 public:
  explicit ResponseStore(size_t capacity) : capacity_(capacity) {}
  void put(const std::string& id, nlohmann::json response, nlohmann::json conversation,
           nlohmann::json input_items);
  std::optional<nlohmann::json> response(const std::string& id) const;
  std::optional<nlohmann::json> conversation(const std::string& id) const;
  std::optional<nlohmann::json> input_items(const std::string& id) const;
  bool erase(const std::string& id);
  size_t size() const;

 private:
  struct Entry {
    nlohmann::json response, conversation, input_items;
  };
  size_t capacity_;
  mutable std::mutex mutex_;
  std::unordered_map<std::string, Entry> entries_;
  std::deque<std::string> order_;  // oldest first (erased ids are skipped when dropping)
};

}  // namespace inferd
