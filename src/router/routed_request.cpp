#include "router/routed_request.h"

#include "common/text.h"

namespace inferd {

namespace {

using json = nlohmann::json;

const json* field(const json& body, const char* key) {
  auto it = body.find(key);
  return it == body.end() || it->is_null() ? nullptr : &*it;
}

// Token ids as 4 little-endian bytes each.
void append_ids(const json& ids, std::string* out) {
  for (const json& id : ids) {
    const auto v = static_cast<uint32_t>(id.is_number_integer() ? id.get<int64_t>() : 0);
    for (int b = 0; b < 4; ++b) out->push_back(static_cast<char>((v >> (8 * b)) & 0xff));
  }
}

// Completions: a string, a list of strings, a list of ids, or a list of id lists.
void append_prompt(const json& prompt, std::string* out, size_t* num_prompts) {
  *num_prompts = 1;
  if (prompt.is_string()) {
    *out += prompt.get<std::string>();
    return;
  }
  if (!prompt.is_array()) return;
  if (!prompt.empty() && prompt[0].is_number_integer()) {
    append_ids(prompt, out);
    return;
  }
  *num_prompts = prompt.size();
  for (const json& p : prompt) {
    if (p.is_string()) *out += p.get<std::string>();
    if (p.is_array()) append_ids(p, out);
  }
}

// Chat: each message's role and content (a string, or the text of its parts), separated by
// unit separators so that "ab"+"c" and "a"+"bc" differ.
void append_messages(const json& messages, std::string* out) {
  if (!messages.is_array()) return;
  for (const json& m : messages) {
    if (!m.is_object()) continue;
    if (const json* role = field(m, "role"); role != nullptr && role->is_string())
      *out += role->get<std::string>();
    out->push_back('\x1f');
    if (const json* content = field(m, "content"); content != nullptr) {
      if (content->is_string()) {
        *out += content->get<std::string>();
      } else if (content->is_array()) {
        for (const json& part : *content) {
          if (const json* text = part.is_object() ? field(part, "text") : nullptr; text && text->is_string())
            *out += text->get<std::string>();
        }
      }
    }
    out->push_back('\x1e');
  }
}

// Responses: instructions as the system message, then the input (a string: one user message;
// items: messages as chat's, a function call's arguments, a call output) in chat's key form, so
// a conversation keys alike through either endpoint.
void append_responses_input(const json& body, std::string* out) {
  const auto append = [out](std::string_view role, std::string_view text) {
    *out += role;
    out->push_back('\x1f');
    *out += text;
    out->push_back('\x1e');
  };
  if (const json* ins = field(body, "instructions"); ins != nullptr && ins->is_string())
    append("system", ins->get_ref<const std::string&>());
  const json* input = field(body, "input");
  if (input == nullptr) return;
  if (input->is_string()) {
    append("user", input->get_ref<const std::string&>());
    return;
  }
  if (!input->is_array()) return;
  json messages = json::array();
  for (const json& item : *input) {
    if (!item.is_object()) continue;
    const json* type = field(item, "type");
    const std::string kind = type != nullptr && type->is_string() ? type->get<std::string>() : "message";
    if (kind == "message") {
      messages.push_back(item);
    } else if (kind == "function_call" || kind == "function_call_output") {
      const json* text = field(item, kind == "function_call" ? "arguments" : "output");
      messages.push_back({{"role", kind == "function_call" ? "assistant" : "tool"},
                          {"content", text != nullptr && text->is_string() ? *text : json("")}});
    }
  }
  append_messages(messages, out);
}

bool truthy(const json& v) {
  if (v.is_boolean()) return v.get<bool>();
  if (v.is_array() || v.is_object()) return !v.empty();
  return true;  // a number (completions' logprobs: k alternatives, even 0 asks for logprobs), a string
}

std::optional<std::string> blocker(const json& body, size_t num_prompts) {
  if (const json* n = field(body, "n"); n != nullptr && !(n->is_number_integer() && n->get<int64_t>() == 1))
    return "n";
  for (const char* key : {"logprobs", "top_logprobs", "prompt_logprobs", "response_format",
                          "structured_outputs", "tools", "kv_transfer_params"}) {
    const json* v = field(body, key);
    if (v == nullptr || !truthy(*v)) continue;
    if (std::string_view(key) == "top_logprobs" && v->is_number() && v->get<double>() <= 0) continue;
    return key;
  }
  for (const auto& [key, value] : body.items()) {
    if (key.rfind("guided_", 0) == 0 && !value.is_null()) return key;
  }
  for (const char* key : {"max_tokens", "max_completion_tokens"}) {
    if (const json* v = field(body, key); v != nullptr && v->is_number_integer() && v->get<int64_t>() == 1)
      return key;
  }
  if (num_prompts != 1) return "prompt";  // several prompts: one transfer each would be needed
  return std::nullopt;
}

}  // namespace

Expected<RoutedRequest> parse_routed_request(RouteEndpoint endpoint, std::string_view body,
                                             std::string_view session_header) {
  RoutedRequest r;
  r.endpoint = endpoint;
  if (json_nests_deeper_than(body))
    return invalid_argument("the request body nests arrays and objects deeper than " +
                            std::to_string(kMaxJsonDepth) + " levels");
  r.body = json::parse(body, nullptr, false);
  if (r.body.is_discarded()) return invalid_argument("the request body is not valid JSON");
  if (!r.body.is_object()) return invalid_argument("the request body must be a JSON object");
  size_t num_prompts = 1;
  if (endpoint == RouteEndpoint::kChat) {
    if (const json* m = field(r.body, "messages")) append_messages(*m, &r.prompt_key);
  } else if (endpoint == RouteEndpoint::kResponses) {
    append_responses_input(r.body, &r.prompt_key);
    if (const json* p = field(r.body, "previous_response_id"); p != nullptr && p->is_string())
      r.previous_response_id = p->get<std::string>();
  } else if (const json* p = field(r.body, "prompt")) {
    append_prompt(*p, &r.prompt_key, &num_prompts);
  }
  if (const json* s = field(r.body, "stream"); s != nullptr && s->is_boolean()) r.stream = s->get<bool>();
  if (const json* s = field(r.body, "session_id"); s != nullptr && s->is_string()) {
    r.session_id = s->get<std::string>();
  } else {
    r.session_id = std::string(session_header);
  }
  // A prefill instance's kv_transfer_params go with chat and completions bodies only.
  r.disagg_blocker = endpoint == RouteEndpoint::kResponses ? std::optional<std::string>("responses")
                                                           : blocker(r.body, num_prompts);
  return r;
}

std::string prefill_body(const RoutedRequest& request) {
  json body = request.body;
  body["stream"] = false;
  body.erase("stream_options");
  body["kv_transfer_params"] = {{"do_remote_decode", true}};
  return body.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string decode_body(const RoutedRequest& request, const nlohmann::json& kv_transfer_params) {
  json body = request.body;
  if (kv_transfer_params.is_object()) body["kv_transfer_params"] = kv_transfer_params;
  return body.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::optional<ResponseRecord> response_record(std::string_view body_or_events) {
  std::string_view text = body_or_events;
  const bool events = text.rfind("event:", 0) == 0 || text.rfind("data:", 0) == 0;
  if (events) {  // the first event's data line
    const size_t data = text.find("data:");
    if (data == std::string_view::npos) return std::nullopt;
    text.remove_prefix(data + 5);
    const size_t end = text.find('\n');
    if (end == std::string_view::npos) return std::nullopt;
    text = text.substr(0, end);
  }
  if (json_nests_deeper_than(text)) return std::nullopt;
  const json j = json::parse(text, nullptr, false);
  if (!j.is_object()) return std::nullopt;
  const json* response = &j;
  if (events) {
    const json* type = field(j, "type");
    if (type == nullptr || *type != "response.created") return std::nullopt;
    response = field(j, "response");
    if (response == nullptr || !response->is_object()) return std::nullopt;
  }
  const json* object = field(*response, "object");
  const json* id = field(*response, "id");
  if (object == nullptr || *object != "response" || id == nullptr || !id->is_string()) return std::nullopt;
  ResponseRecord record;
  record.id = id->get<std::string>();
  if (const json* store = field(*response, "store"); store != nullptr && store->is_boolean())
    record.stored = store->get<bool>();
  return record;
}

std::optional<int64_t> last_sequence_number(std::string_view events) {
  constexpr std::string_view kKey = "\"sequence_number\":";
  const size_t at = events.rfind(kKey);
  if (at == std::string_view::npos) return std::nullopt;
  size_t i = at + kKey.size();
  while (i < events.size() && events[i] == ' ') ++i;
  int64_t n = 0;
  size_t digits = 0;
  for (; i < events.size() && events[i] >= '0' && events[i] <= '9' && digits < 18; ++i, ++digits)
    n = n * 10 + (events[i] - '0');
  if (digits == 0) return std::nullopt;
  return n;
}

std::string responses_error_event(int64_t sequence_number, std::string_view message) {
  const json event = {{"type", "error"},
                      {"code", "server_error"},
                      {"message", message},
                      {"param", nullptr},
                      {"sequence_number", sequence_number}};
  return "event: error\ndata: " + event.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
}

}  // namespace inferd
