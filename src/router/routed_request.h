// RoutedRequest: what the router reads of a completions / chat / Responses body to route it (the
// prompt text for the prefix index, stream, session, previous_response_id, the fields that rule
// out disaggregation) and the bodies it sends a prefill and a decode instance
// (docs/disaggregation.md). The instance validates the rest: the router forwards the client's
// body unchanged otherwise. Also what it reads back of a Responses answer: the response's id.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace inferd {

enum class RouteEndpoint { kCompletions, kChat, kResponses };

struct RoutedRequest {
  RouteEndpoint endpoint = RouteEndpoint::kCompletions;
  nlohmann::json body;  // the client's body (an object)
  // The prompt as bytes for the PrefixIndex: completions' prompt text (token ids as 4 bytes
  // each, so bytes / 4 estimates tokens either way); chat: every message's role and content.
  std::string prompt_key;
  bool stream = false;
  std::string session_id;  // the body's session_id, else the X-Session-Id header; empty: none
  // /v1/responses: the stored response this one continues; empty: none. Only the instance that
  // stored it can continue it.
  std::string previous_response_id;
  // The first field that rules disaggregation out (n > 1, logprobs, response_format, tools,
  // guided_*, max_tokens == 1, ...; every /v1/responses request); none: the request may be
  // disaggregated.
  std::optional<std::string> disagg_blocker;

  // Estimated prompt tokens: prompt bytes / 4.
  int64_t estimated_prompt_tokens() const { return static_cast<int64_t>(prompt_key.size() / 4); }
};

// Parses a client's body. Errors: not JSON, not an object (the caller answers 400).
Expected<RoutedRequest> parse_routed_request(RouteEndpoint endpoint, std::string_view body,
                                             std::string_view session_header);

// The body for the prefill instance: the client's, "stream": false (stream_options dropped) and
// "kv_transfer_params": {"do_remote_decode": true}.
std::string prefill_body(const RoutedRequest& request);

// The body for the decode instance: the client's, plus `kv_transfer_params` when given.
std::string decode_body(const RoutedRequest& request, const nlohmann::json& kv_transfer_params);

// What the router keeps of a /v1/responses answer to send its continuations to the same instance.
struct ResponseRecord {
  std::string id;      // "resp_..."
  bool stored = true;  // the request's store (default true): false, nothing to continue
};

// The record of a non-streamed answer (the response object) or of a stream's first bytes (its
// response.created event); none when they hold no response (an error, a partial event).
std::optional<ResponseRecord> response_record(std::string_view body_or_events);

// The sequence_number of the last event in `events` that has one; none when none has.
std::optional<int64_t> last_sequence_number(std::string_view events);

// A Responses stream's `error` event (OpenAI's ResponseErrorEvent) numbered `sequence_number`.
std::string responses_error_event(int64_t sequence_number, std::string_view message);

}  // namespace inferd
