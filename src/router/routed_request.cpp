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
  } else if (const json* p = field(r.body, "prompt")) {
    append_prompt(*p, &r.prompt_key, &num_prompts);
  }
  if (const json* s = field(r.body, "stream"); s != nullptr && s->is_boolean()) r.stream = s->get<bool>();
  if (const json* s = field(r.body, "session_id"); s != nullptr && s->is_string()) {
    r.session_id = s->get<std::string>();
  } else {
    r.session_id = std::string(session_header);
  }
  r.disagg_blocker = blocker(r.body, num_prompts);
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

}  // namespace inferd
