// RoutedRequest: what the router reads of a completions / chat body to route it (the prompt
// text for the prefix index, stream, session, the fields that rule out disaggregation) and
// the bodies it sends a prefill and a decode instance (docs/disaggregation.md). The instance
// validates the rest: the router forwards the client's body unchanged otherwise.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace inferd {

enum class RouteEndpoint { kCompletions, kChat };

struct RoutedRequest {
  RouteEndpoint endpoint = RouteEndpoint::kCompletions;
  nlohmann::json body;  // the client's body (an object)
  // The prompt as bytes for the PrefixIndex: completions' prompt text (token ids as 4 bytes
  // each, so bytes / 4 estimates tokens either way); chat: every message's role and content.
  std::string prompt_key;
  bool stream = false;
  std::string session_id;  // the body's session_id, else the X-Session-Id header; empty: none
  // The first field that rules disaggregation out (n > 1, logprobs, response_format, tools,
  // guided_*, max_tokens == 1, ...); none: the request may be disaggregated.
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

}  // namespace inferd
