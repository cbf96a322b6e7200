#include "server/openai_api.h"

#include <cmath>
#include <limits>

#include "engine/engine.h"

namespace inferd {

using json = nlohmann::ordered_json;

std::string error_body(const ApiError& e) {
  nlohmann::json err = {{"message", e.message},
                        {"type", e.type},
                        {"param", e.param.empty() ? nlohmann::json(nullptr) : nlohmann::json(e.param)},
                        {"code", e.code.empty() ? nlohmann::json(nullptr) : nlohmann::json(e.code)}};
  return nlohmann::json{{"error", err}}.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

namespace {

// Field readers: absent or null leaves *out unchanged; a wrong type or range sets `error`.
class Reader {
 public:
  explicit Reader(const json& body) : body_(body) {}
  bool failed() const { return error_.has_value(); }
  ApiError take_error() { return std::move(*error_); }
  void fail(const std::string& param, const std::string& message) {
    if (!error_) error_ = ApiError{400, message, "invalid_request_error", param, ""};
  }
  const json* find(const char* key) const {
    auto it = body_.find(key);
    return it == body_.end() || it->is_null() ? nullptr : &*it;
  }

  template <typename T>
  bool integer(const char* key, T* out, int64_t lo, int64_t hi) {
    const json* v = find(key);
    if (v == nullptr || failed()) return false;
    if (!v->is_number_integer()) {
      fail(key, std::string("'") + key + "' must be an integer");
      return false;
    }
    // Read as signed or unsigned to keep huge values from wrapping.
    const bool in_range = v->is_number_unsigned() ? v->get<uint64_t>() <= static_cast<uint64_t>(hi) &&
                                                        static_cast<int64_t>(v->get<uint64_t>()) >= lo
                                                  : v->get<int64_t>() >= lo && v->get<int64_t>() <= hi;
    if (!in_range) {
      fail(key,
           std::string("'") + key + "' must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
      return false;
    }
    *out = static_cast<T>(v->get<int64_t>());
    return true;
  }

  bool number(const char* key, float* out, double lo, double hi, bool lo_open = false) {
    const json* v = find(key);
    if (v == nullptr || failed()) return false;
    if (!v->is_number()) {
      fail(key, std::string("'") + key + "' must be a number");
      return false;
    }
    const double x = v->get<double>();
    if (!std::isfinite(x) || x > hi || (lo_open ? x <= lo : x < lo)) {
      fail(key, std::string("'") + key + "' must be in " + (lo_open ? "(" : "[") + trim(lo) + ", " +
                    trim(hi) + "]");
      return false;
    }
    *out = static_cast<float>(x);
    return true;
  }

  bool boolean(const char* key, bool* out) {
    const json* v = find(key);
    if (v == nullptr || failed()) return false;
    if (!v->is_boolean()) {
      fail(key, std::string("'") + key + "' must be a boolean");
      return false;
    }
    *out = v->get<bool>();
    return true;
  }

  bool string(const char* key, std::string* out) {
    const json* v = find(key);
    if (v == nullptr || failed()) return false;
    if (!v->is_string()) {
      fail(key, std::string("'") + key + "' must be a string");
      return false;
    }
    *out = v->get<std::string>();
    return true;
  }

 private:
  static std::string trim(double x) {
    std::string s = std::to_string(x);
    while (s.size() > 1 && s.back() == '0') s.pop_back();
    if (!s.empty() && s.back() == '.') s.pop_back();
    return s;
  }
  const json& body_;
  std::optional<ApiError> error_;
};

bool is_token_id_array(const json& v) {
  if (!v.is_array() || v.empty()) return false;
  for (const auto& x : v) {
    if (!x.is_number_integer()) return false;
  }
  return true;
}

// Token ids of a JSON array already checked by is_token_id_array; false if one is out of int32.
bool read_ids(const json& v, std::vector<int32_t>* out) {
  for (const auto& x : v) {
    if (x.is_number_unsigned()
            ? x.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int32_t>::max())
            : x.get<int64_t>() < 0 || x.get<int64_t>() > std::numeric_limits<int32_t>::max())
      return false;
    out->push_back(static_cast<int32_t>(x.get<int64_t>()));
  }
  return true;
}

// Parses a request body that must be a JSON object; false with `error` set otherwise.
bool parse_object(std::string_view body, json* out, ApiError* error) {
  *out = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (out->is_discarded()) {
    *error = ApiError{400, "the request body is not valid JSON", "invalid_request_error", "", ""};
    return false;
  }
  if (!out->is_object()) {
    *error = ApiError{400, "the request body must be a JSON object", "invalid_request_error", "", ""};
    return false;
  }
  return true;
}

void parse_messages(Reader& r, const json& body, GenerateRequest* req) {
  const json* m = r.find("messages");
  if (m == nullptr) return r.fail("messages", "'messages' is required");
  if (!m->is_array() || m->empty()) return r.fail("messages", "'messages' must be a non-empty array");
  for (size_t i = 0; i < m->size(); ++i) {
    const json& msg = (*m)[i];
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (!msg.is_object()) return r.fail(where, where + " must be an object");
    auto role = msg.find("role");
    if (role == msg.end() || !role->is_string())
      return r.fail(where + ".role", where + ".role must be a string");
    const std::string rs = role->get<std::string>();
    if (rs != "system" && rs != "user" && rs != "assistant" && rs != "tool" && rs != "developer")
      return r.fail(where + ".role",
                    where + ".role '" + rs + "' is not one of system, user, assistant, tool, developer");
    auto content = msg.find("content");
    if (content == msg.end() || content->is_null()) {
      if (rs != "assistant") return r.fail(where + ".content", where + ".content is required");
      continue;
    }
    if (content->is_string()) continue;
    if (!content->is_array())
      return r.fail(where + ".content", where + ".content must be a string or an array of parts");
    for (const auto& part : *content) {
      auto type = part.is_object() ? part.find("type") : part.end();
      if (!part.is_object() || type == part.end() || !type->is_string() || *type != "text" ||
          !part.contains("text") || !part["text"].is_string())
        return r.fail(
            where + ".content",
            where + ".content parts must be {\"type\": \"text\", \"text\": string} (only text is supported)");
    }
  }
  (void)body;
  req->messages = *m;
}

void parse_prompt(Reader& r, GenerateRequest* req) {
  const json* p = r.find("prompt");
  if (p == nullptr) return r.fail("prompt", "'prompt' is required");
  auto bad = [&] {
    r.fail("prompt",
           "'prompt' must be a string, an array of strings, an array of token ids or an array of arrays of "
           "token ids");
  };
  if (p->is_string()) {
    req->prompts.push_back({p->get<std::string>(), {}, false});
    return;
  }
  if (!p->is_array() || p->empty()) return bad();
  if (is_token_id_array(*p)) {
    PromptInput in;
    in.is_ids = true;
    if (!read_ids(*p, &in.ids)) return r.fail("prompt", "'prompt' has a token id outside [0, 2^31)");
    req->prompts.push_back(std::move(in));
    return;
  }
  for (const auto& item : *p) {
    if (item.is_string()) {
      req->prompts.push_back({item.get<std::string>(), {}, false});
    } else if (is_token_id_array(item)) {
      PromptInput in;
      in.is_ids = true;
      if (!read_ids(item, &in.ids)) return r.fail("prompt", "'prompt' has a token id outside [0, 2^31)");
      req->prompts.push_back(std::move(in));
    } else {
      return bad();
    }
  }
}

}  // namespace

ParsedRequest parse_generate_request(ApiEndpoint endpoint, std::string_view body) {
  ParsedRequest out;
  json j;
  if (!parse_object(body, &j, &out.error)) return out;
  Reader r(j);
  GenerateRequest req;
  req.endpoint = endpoint;
  r.string("model", &req.model);
  if (endpoint == ApiEndpoint::kChat) {
    parse_messages(r, j, &req);
  } else {
    parse_prompt(r, &req);
  }
  int64_t max_tokens = 0;
  constexpr int64_t kMaxTokensLimit = int64_t{1} << 31;
  if (r.integer("max_tokens", &max_tokens, 1, kMaxTokensLimit)) req.max_tokens = max_tokens;
  if (r.integer("max_completion_tokens", &max_tokens, 1, kMaxTokensLimit)) req.max_tokens = max_tokens;
  SamplingParams& s = req.sampling;
  r.number("temperature", &s.temperature, 0, 2);
  r.number("top_p", &s.top_p, 0, 1, /*lo_open=*/true);
  int32_t top_k = 0;
  if (r.integer("top_k", &top_k, -1, 1 << 30)) s.top_k = top_k < 0 ? 0 : top_k;
  r.number("min_p", &s.min_p, 0, 1);
  r.number("presence_penalty", &s.presence_penalty, -2, 2);
  r.number("frequency_penalty", &s.frequency_penalty, -2, 2);
  r.number("repetition_penalty", &s.repetition_penalty, 0, 2, /*lo_open=*/true);
  if (const json* seed = r.find("seed"); seed != nullptr && !r.failed()) {
    if (!seed->is_number_integer()) {
      r.fail("seed", "'seed' must be an integer");
    } else {
      s.seed =
          seed->is_number_unsigned() ? seed->get<uint64_t>() : static_cast<uint64_t>(seed->get<int64_t>());
    }
  }
  if (const json* stop = r.find("stop"); stop != nullptr && !r.failed()) {
    if (stop->is_string()) {
      req.stop.push_back(stop->get<std::string>());
    } else if (stop->is_array()) {
      for (const auto& x : *stop) {
        if (!x.is_string()) {
          r.fail("stop", "'stop' must be a string or an array of strings");
          break;
        }
        req.stop.push_back(x.get<std::string>());
      }
    } else {
      r.fail("stop", "'stop' must be a string or an array of strings");
    }
    for (const auto& x : req.stop) {
      if (x.empty()) r.fail("stop", "'stop' strings must not be empty");
    }
  }
  if (const json* ids = r.find("stop_token_ids"); ids != nullptr && !r.failed()) {
    if (!ids->is_array() || (!ids->empty() && !is_token_id_array(*ids)) ||
        !read_ids(*ids, &req.stop_token_ids))
      r.fail("stop_token_ids", "'stop_token_ids' must be an array of token ids");
  }
  r.integer("n", &req.n, 1, kMaxSamples);
  r.boolean("stream", &req.stream);
  if (const json* so = r.find("stream_options"); so != nullptr && !r.failed()) {
    if (!so->is_object()) {
      r.fail("stream_options", "'stream_options' must be an object");
    } else if (!req.stream) {
      r.fail("stream_options", "'stream_options' is only allowed with 'stream': true");
    } else if (auto iu = so->find("include_usage"); iu != so->end() && !iu->is_null()) {
      if (!iu->is_boolean()) {
        r.fail("stream_options.include_usage", "'stream_options.include_usage' must be a boolean");
      } else {
        req.include_usage = iu->get<bool>();
      }
    }
  }
  constexpr int32_t kMaxLogprobs = 20;
  if (endpoint == ApiEndpoint::kChat) {
    r.boolean("logprobs", &req.logprobs);
    int32_t top = 0;
    if (r.integer("top_logprobs", &top, 0, kMaxLogprobs) && !req.logprobs && top > 0)
      r.fail("top_logprobs", "'top_logprobs' needs 'logprobs': true");
    if (req.logprobs) s.logprobs = top;
  } else {
    int32_t k = 0;
    if (r.integer("logprobs", &k, 0, kMaxLogprobs)) {
      req.logprobs = true;
      s.logprobs = k;
    }
  }
  r.boolean("ignore_eos", &req.ignore_eos);
  r.integer("priority", &req.priority, std::numeric_limits<int32_t>::min(),
            std::numeric_limits<int32_t>::max());
  r.string("user", &req.user);
  std::string session;
  if (r.string("session_id", &session)) req.session_id = session;
  if (r.failed()) {
    out.error = r.take_error();
    return out;
  }
  out.request = std::move(req);
  return out;
}

ParsedTokenize parse_tokenize_request(std::string_view body) {
  ParsedTokenize out;
  json j;
  if (!parse_object(body, &j, &out.error)) return out;
  Reader r(j);
  TokenizeRequest t;
  GenerateRequest chat;
  if (r.find("messages") != nullptr) {
    parse_messages(r, j, &chat);
    t.messages = chat.messages;
  } else if (!r.string("prompt", &t.prompt) && !r.failed()) {
    r.fail("prompt", "'prompt' (a string) or 'messages' is required");
  }
  r.boolean("add_special_tokens", &t.add_special_tokens);
  if (r.failed()) {
    out.error = r.take_error();
    return out;
  }
  out.request = std::move(t);
  return out;
}

ParsedDetokenize parse_detokenize_request(std::string_view body) {
  ParsedDetokenize out;
  json j;
  if (!parse_object(body, &j, &out.error)) return out;
  auto it = j.find("tokens");
  std::vector<int32_t> ids;
  if (it == j.end() || !it->is_array() || (!it->empty() && !is_token_id_array(*it)) || !read_ids(*it, &ids)) {
    out.error =
        ApiError{400, "'tokens' must be an array of token ids", "invalid_request_error", "tokens", ""};
    return out;
  }
  out.tokens = std::move(ids);
  return out;
}

// ---------------------------------------------------------------------------------------------

namespace {
constexpr std::string_view kOpen = "<think>";
constexpr std::string_view kClose = "</think>";

// Length of the longest suffix of `s` that is a proper prefix of `tag`.
size_t partial_tag_suffix(std::string_view s, std::string_view tag) {
  for (size_t n = std::min(s.size(), tag.size() - 1); n > 0; --n) {
    if (s.substr(s.size() - n) == tag.substr(0, n)) return n;
  }
  return 0;
}
}  // namespace

ReasoningSplitter::ReasoningSplitter(bool starts_in_reasoning)
    : state_(starts_in_reasoning ? State::kReasoning : State::kStart) {}

ReasoningSplitter::Parts ReasoningSplitter::feed(std::string_view text) {
  pending_.append(text);
  return drain(false);
}

ReasoningSplitter::Parts ReasoningSplitter::finish() {
  return drain(true);
}

ReasoningSplitter::Parts ReasoningSplitter::drain(bool final) {
  Parts out;
  for (;;) {
    if (state_ == State::kStart) {
      // Leading whitespace, then either <think> or content.
      const size_t first = pending_.find_first_not_of(" \t\r\n");
      if (first == std::string::npos) {
        if (final) {
          out.content += pending_;
          pending_.clear();
        }
        return out;
      }
      std::string_view rest = std::string_view(pending_).substr(first);
      if (rest.substr(0, kOpen.size()) == kOpen) {
        pending_.erase(0, first + kOpen.size());
        state_ = State::kReasoning;
        continue;
      }
      if (!final && kOpen.substr(0, rest.size()) == rest) return out;  // may still become <think>
      state_ = State::kContent;
      continue;
    }
    if (state_ == State::kReasoning) {
      const size_t close = pending_.find(kClose);
      if (close != std::string::npos) {
        out.reasoning += pending_.substr(0, close);
        pending_.erase(0, close + kClose.size());
        strip_newlines_ = true;  // the newline(s) a model writes after </think> belong to neither part
        state_ = State::kContent;
        continue;
      }
      const size_t hold = final ? 0 : partial_tag_suffix(pending_, kClose);
      out.reasoning += pending_.substr(0, pending_.size() - hold);
      pending_.erase(0, pending_.size() - hold);
      return out;
    }
    if (strip_newlines_) {
      const size_t body = pending_.find_first_not_of("\r\n");
      pending_.erase(0, body == std::string::npos ? pending_.size() : body);
      if (pending_.empty()) return out;
      strip_newlines_ = false;
    }
    out.content += pending_;
    pending_.clear();
    return out;
  }
}

}  // namespace inferd
