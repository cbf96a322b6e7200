#include "server/openai_api.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <ctime>
#include <limits>
#include <random>
#include <tuple>

#include <boost/archive/iterators/base64_from_binary.hpp>
#include <boost/archive/iterators/transform_width.hpp>

#include "common/text.h"
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

  // A number of any value (its bounds are InputProcessor's); one beyond float's range becomes inf.
  bool number(const char* key, float* out) {
    const json* v = find(key);
    if (v == nullptr || failed()) return false;
    if (!v->is_number()) {
      fail(key, std::string("'") + key + "' must be a number");
      return false;
    }
    *out = static_cast<float>(v->get<double>());
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
  if (json_nests_deeper_than(body)) {
    *error = ApiError{
        400,
        "the request body nests arrays and objects deeper than " + std::to_string(kMaxJsonDepth) + " levels",
        "invalid_request_error", "", ""};
    return false;
  }
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

// OpenAI's older function calling in a conversation, as chat templates take tool calls: an
// assistant's function_call becomes its one tool call (with an id of its own), and a "function"
// message the "tool" message answering it.
json legacy_function_messages(const json& messages) {
  json out = messages;
  std::string last_call_id;
  for (size_t i = 0; i < out.size(); ++i) {
    json& msg = out[i];
    if (auto fc = msg.find("function_call"); fc != msg.end()) {
      if (!fc->is_null()) {
        last_call_id = "call_fn" + std::to_string(i);
        msg["tool_calls"] =
            json::array({{{"id", last_call_id},
                          {"type", "function"},
                          {"function", {{"name", (*fc)["name"]}, {"arguments", (*fc)["arguments"]}}}}});
      }
      msg.erase("function_call");
    }
    if (msg["role"] == "function") {
      msg["role"] = "tool";
      if (!last_call_id.empty() && !msg.contains("tool_call_id")) msg["tool_call_id"] = last_call_id;
    }
  }
  return out;
}

void parse_messages(Reader& r, const json& body, GenerationRequest* req) {
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
    if (rs != "system" && rs != "user" && rs != "assistant" && rs != "tool" && rs != "developer" &&
        rs != "function")
      return r.fail(
          where + ".role",
          where + ".role '" + rs + "' is not one of system, user, assistant, tool, developer, function");
    if (rs == "function" && (!msg.contains("name") || !msg["name"].is_string()))
      return r.fail(where + ".name", where + ".name (the function whose result this is) must be a string");
    if (auto fc = msg.find("function_call"); fc != msg.end() && !fc->is_null()) {
      if (rs != "assistant")
        return r.fail(where + ".function_call", where + ".function_call is for assistant messages");
      if (!fc->is_object() || !fc->contains("name") || !(*fc)["name"].is_string() ||
          !fc->contains("arguments") || !(*fc)["arguments"].is_string())
        return r.fail(where + ".function_call",
                      where + ".function_call must be {\"name\": string, \"arguments\": string}");
      if (msg.contains("tool_calls") && !msg["tool_calls"].is_null())
        return r.fail(where + ".function_call", where + " has both function_call and tool_calls");
    }
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
  req->messages = legacy_function_messages(*m);
}

void parse_prompt(Reader& r, GenerationRequest* req) {
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

// Every body field inferd reads, per endpoint; a field outside them is a 400 naming it, never
// silently ignored. Only informational fields that change nothing a client gets are accepted
// unread: user (logged), metadata, store (inferd stores nothing).
constexpr std::string_view kCommonFields[] = {"response_format",
                                              "structured_outputs",
                                              "guided_json",
                                              "guided_regex",
                                              "guided_choice",
                                              "guided_grammar",
                                              "guided_decoding_backend",
                                              "model",
                                              "max_tokens",
                                              "temperature",
                                              "top_p",
                                              "top_k",
                                              "min_p",
                                              "presence_penalty",
                                              "frequency_penalty",
                                              "repetition_penalty",
                                              "seed",
                                              "stop",
                                              "stop_token_ids",
                                              "n",
                                              "stream",
                                              "stream_options",
                                              "logprobs",
                                              "ignore_eos",
                                              "priority",
                                              "user",
                                              "session_id",
                                              "logit_bias",
                                              "include_stop_str_in_output",
                                              "metadata",
                                              "store",
                                              "kv_transfer_params",
                                              "streaming_llm",
                                              "slo_class",
                                              "min_tokens",
                                              "allowed_token_ids",
                                              "bad_words",
                                              "skip_special_tokens",
                                              "spaces_between_special_tokens",
                                              "truncate_prompt_tokens",
                                              "add_special_tokens",
                                              "return_tokens_as_token_ids",
                                              "prompt_logprobs",
                                              "best_of",
                                              "use_beam_search",
                                              "length_penalty",
                                              "prediction",
                                              "cache_salt",
                                              "request_id",
                                              "modalities",
                                              "mm_processor_kwargs",
                                              "guided_whitespace_pattern"};
constexpr std::string_view kChatFields[] = {"messages",
                                            "max_completion_tokens",
                                            "top_logprobs",
                                            "chat_template_kwargs",
                                            "tools",
                                            "tool_choice",
                                            "parallel_tool_calls",
                                            "add_generation_prompt",
                                            "continue_final_message",
                                            "functions",
                                            "function_call",
                                            "chat_template",
                                            "documents",
                                            "reasoning_effort"};
constexpr std::string_view kCompletionFields[] = {"prompt", "echo", "suffix"};
// Fields of OpenAI's or vLLM's APIs that inferd does not implement (yet): the message says so.
constexpr std::string_view kUnimplementedFields[] = {"audio", "web_search_options", "logits_processors",
                                                     "vllm_xargs", "structural_tag"};

template <size_t N>
bool contains(const std::string_view (&names)[N], std::string_view key) {
  for (std::string_view n : names) {
    if (n == key) return true;
  }
  return false;
}

void check_field_names(Reader& r, ApiEndpoint endpoint, const json& body) {
  for (const auto& [key, value] : body.items()) {
    if (contains(kCommonFields, key) ||
        (endpoint == ApiEndpoint::kChat ? contains(kChatFields, key) : contains(kCompletionFields, key)))
      continue;
    if (contains(kUnimplementedFields, key) && value.is_null()) continue;  // null is absent
    if (contains(kUnimplementedFields, key))
      return r.fail(key, "'" + key + "' is not supported by this server");
    return r.fail(key, "unknown field '" + key + "'" +
                           (endpoint == ApiEndpoint::kChat ? " for chat completions" : " for completions"));
  }
}

// tools (their shape is InputProcessor's), tool_choice and parallel_tool_calls.
void parse_tools(Reader& r, GenerationRequest* g) {
  if (const json* t = r.find("tools"); t != nullptr && !r.failed()) g->tools = *t;
  r.boolean("parallel_tool_calls", &g->parallel_tool_calls);
  const json* c = r.find("tool_choice");
  if (c == nullptr || r.failed()) return;
  ToolChoice choice;
  if (c->is_string()) {
    const std::string k = c->get<std::string>();
    if (k == "auto") {
      choice.kind = ToolChoice::Kind::kAuto;
    } else if (k == "none") {
      choice.kind = ToolChoice::Kind::kNone;
    } else if (k == "required") {
      choice.kind = ToolChoice::Kind::kRequired;
    } else {
      return r.fail("tool_choice", "'tool_choice' must be \"none\", \"auto\", \"required\" or a function");
    }
  } else {
    auto f = c->is_object() ? c->find("function") : c->end();
    if (!c->is_object() || c->value("type", "") != "function" || f == c->end() || !f->is_object() ||
        !f->contains("name") || !(*f)["name"].is_string())
      return r.fail("tool_choice",
                    "'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", "
                    "\"function\": {\"name\": ...}}");
    choice.kind = ToolChoice::Kind::kNamed;
    choice.name = (*f)["name"].get<std::string>();
  }
  g->tool_choice = choice;
}

// OpenAI's older function calling: `functions` are tools of type function, `function_call` the
// tool choice ("none", "auto" or {"name"}), and the answer one call at most (in the message's
// function_call). Returns whether the request uses it.
bool parse_functions(Reader& r, GenerationRequest* g) {
  const json* f = r.find("functions");
  const json* c = r.find("function_call");
  if (f == nullptr && c == nullptr) return false;
  if (f == nullptr) {
    r.fail("function_call", "'function_call' needs 'functions'");
    return false;
  }
  if (r.find("tools") != nullptr || r.find("tool_choice") != nullptr) {
    r.fail("functions", "'functions' cannot go with 'tools' or 'tool_choice' (use one or the other)");
    return false;
  }
  if (const json* p = r.find("parallel_tool_calls"); p != nullptr && p->is_boolean() && p->get<bool>()) {
    r.fail("parallel_tool_calls", "'parallel_tool_calls' is for 'tools': 'functions' answer with one call");
    return false;
  }
  if (!f->is_array()) {
    r.fail("functions", "'functions' must be an array of {\"name\", \"description\", \"parameters\"}");
    return false;
  }
  json tools = json::array();
  for (const auto& fn : *f) tools.push_back({{"type", "function"}, {"function", fn}});
  g->tools = std::move(tools);
  g->parallel_tool_calls = false;
  if (c == nullptr) return true;
  ToolChoice choice;
  if (c->is_string() && (*c == "auto" || *c == "none")) {
    choice.kind = *c == "auto" ? ToolChoice::Kind::kAuto : ToolChoice::Kind::kNone;
  } else if (c->is_object() && c->size() == 1 && c->contains("name") && (*c)["name"].is_string()) {
    choice.kind = ToolChoice::Kind::kNamed;
    choice.name = (*c)["name"].get<std::string>();
  } else {
    r.fail("function_call", "'function_call' must be \"none\", \"auto\" or {\"name\": ...}");
    return false;
  }
  g->tool_choice = choice;
  return true;
}

// A JSON schema given as an object or as its JSON text (vLLM takes both).
std::optional<json> schema_value(const json& v) {
  if (v.is_object() || v.is_boolean()) return v;
  if (!v.is_string() || json_nests_deeper_than(v.get_ref<const std::string&>())) return std::nullopt;
  auto parsed = json::parse(v.get<std::string>(), nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded() || !(parsed.is_object() || parsed.is_boolean())) return std::nullopt;
  return parsed;
}

bool string_list(const json& v, std::vector<std::string>* out) {
  if (!v.is_array() || v.empty()) return false;
  for (const auto& x : v) {
    if (!x.is_string()) return false;
    out->push_back(x.get<std::string>());
  }
  return true;
}

// One constraint from `value` of kind `kind` ("json", "regex", "choice", "grammar", "json_object").
void read_constraint(Reader& r, const std::string& field, const std::string& kind, const json& value,
                     std::optional<StructuredOutput>* out) {
  if (out->has_value())
    return r.fail(field, "'" + field + "': only one output constraint per request (there is already '" +
                             (*out)->field + "')");
  StructuredOutput so;
  so.field = field;
  if (kind == "json") {
    auto schema = schema_value(value);
    if (!schema) return r.fail(field, "'" + field + "' must be a JSON schema (an object or its JSON text)");
    so.kind = StructuredOutput::Kind::kJsonSchema;
    so.schema = *schema;
  } else if (kind == "regex" || kind == "grammar") {
    if (!value.is_string()) return r.fail(field, "'" + field + "' must be a string");
    so.kind = kind == "regex" ? StructuredOutput::Kind::kRegex : StructuredOutput::Kind::kGrammar;
    so.text = value.get<std::string>();
  } else if (kind == "choice") {
    if (!string_list(value, &so.choices))
      return r.fail(field, "'" + field + "' must be a non-empty array of strings");
    so.kind = StructuredOutput::Kind::kChoice;
  } else {  // json_object
    if (!value.is_boolean()) return r.fail(field, "'" + field + "' must be a boolean");
    if (!value.get<bool>()) return;
    so.kind = StructuredOutput::Kind::kJsonObject;
  }
  *out = std::move(so);
}

// response_format (OpenAI), structured_outputs (vLLM) and the older guided_* fields (vLLM).
void parse_structured_output(Reader& r, GenerationRequest* g) {
  auto& out = g->structured_output;
  if (const json* rf = r.find("response_format"); rf != nullptr && !r.failed()) {
    const std::string type = rf->is_object() ? rf->value("type", "") : "";
    if (type == "json_object") {
      read_constraint(r, "response_format", "json_object", true, &out);
    } else if (type == "json_schema") {
      auto js = rf->find("json_schema");
      if (js == rf->end() || !js->is_object() || !js->contains("schema"))
        return r.fail("response_format",
                      "'response_format' json_schema needs {\"json_schema\": {\"name\", \"schema\"}}");
      for (const auto& [key, v] : js->items()) {
        if (key != "name" && key != "schema" && key != "strict" && key != "description")
          return r.fail("response_format", "unknown field 'response_format.json_schema." + key + "'");
      }
      read_constraint(r, "response_format", "json", (*js)["schema"], &out);
    } else if (type != "text") {
      return r.fail("response_format", "'response_format.type' must be text, json_object or json_schema");
    }
  }
  // The JSON layout options (vLLM's), and the field that set them, applied to the constraint
  // once all are read (they may come before it).
  JsonGrammarOptions layout;
  std::string layout_field;
  auto set_layout = [&](const std::string& field, const json& v) {
    using W = JsonGrammarOptions::Whitespace;
    const std::string key = field.substr(field.find('.') + 1);
    if (key == "whitespace_pattern" || key == "guided_whitespace_pattern") {
      if (!v.is_string() || v.get_ref<const std::string&>().empty())
        return r.fail(field, "'" + field + "' must be a non-empty regex");
      if (layout.whitespace == W::kNone)
        return r.fail(field, "'" + field + "' cannot go with disable_any_whitespace");
      layout.whitespace = W::kPattern;
      layout.whitespace_pattern = v.get<std::string>();
    } else if (key == "disable_any_whitespace") {
      if (!v.is_boolean()) return r.fail(field, "'" + field + "' must be a boolean");
      if (!v.get<bool>()) return;  // the default: inferd's compact whitespace
      if (layout.whitespace == W::kPattern)
        return r.fail(field, "'" + field + "' cannot go with a whitespace_pattern");
      layout.whitespace = W::kNone;
    } else {  // disable_additional_properties
      if (!v.is_boolean()) return r.fail(field, "'" + field + "' must be a boolean");
      layout.additional_properties_by_default = !v.get<bool>();
    }
    if (layout != JsonGrammarOptions{} && layout_field.empty()) layout_field = field;
  };
  if (const json* so = r.find("structured_outputs"); so != nullptr && !r.failed()) {
    if (!so->is_object()) return r.fail("structured_outputs", "'structured_outputs' must be an object");
    for (const auto& [key, v] : so->items()) {
      if (v.is_null()) continue;
      const std::string field = "structured_outputs." + key;
      if (key == "json" || key == "regex" || key == "choice" || key == "grammar" || key == "json_object") {
        read_constraint(r, field, key, v, &out);
      } else if (key == "whitespace_pattern" || key == "disable_any_whitespace" ||
                 key == "disable_additional_properties") {
        set_layout(field, v);
      } else if (key == "disable_fallback") {
        // One grammar engine, which never falls back to another: either value holds.
        if (!v.is_boolean()) return r.fail(field, "'" + field + "' must be a boolean");
      } else {
        return r.fail(field, "'" + field + "' is not supported by this server");
      }
      if (r.failed()) return;
    }
  }
  if (const json* w = r.find("guided_whitespace_pattern"); w != nullptr && !r.failed())
    set_layout("guided_whitespace_pattern", *w);
  if (r.failed()) return;
  for (const char* kind : {"json", "regex", "choice", "grammar"}) {
    const std::string field = std::string("guided_") + kind;
    if (const json* v = r.find(field.c_str()); v != nullptr && !r.failed())
      read_constraint(r, field, kind, *v, &out);
  }
  std::string backend;
  r.string("guided_decoding_backend", &backend);  // one engine here: any name selects it
  if (!layout_field.empty() && !r.failed()) {
    using K = StructuredOutput::Kind;
    if (!out || (out->kind != K::kJsonSchema && out->kind != K::kJsonObject))
      return r.fail(layout_field,
                    "'" + layout_field + "' is for a JSON constraint (a schema or json_object)");
    out->json = layout;
  }
}

void parse_logit_bias(Reader& r, SamplingParams* s) {
  const json* b = r.find("logit_bias");
  if (b == nullptr || r.failed()) return;
  if (!b->is_object()) return r.fail("logit_bias", "'logit_bias' must be an object of token id -> bias");
  for (const auto& [key, value] : b->items()) {
    int64_t id = -1;
    const bool digits =
        !key.empty() && key.size() <= 10 && key.find_first_not_of("0123456789") == std::string::npos;
    if (digits) id = std::stoll(key);
    if (!digits || id > std::numeric_limits<int32_t>::max())
      return r.fail("logit_bias", "'logit_bias' keys must be token ids, not '" + key + "'");
    if (!value.is_number()) return r.fail("logit_bias", "'logit_bias' values must be numbers");
    s->logit_bias.emplace_back(static_cast<int32_t>(id), static_cast<float>(value.get<double>()));
  }
}

constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();
constexpr int64_t kInt32Min = std::numeric_limits<int32_t>::min();
constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

void parse_sampling(Reader& r, SamplingParams* s) {
  r.number("temperature", &s->temperature);
  r.number("top_p", &s->top_p);
  int32_t top_k = 0;
  if (r.integer("top_k", &top_k, kInt32Min, kInt32Max))
    s->top_k = top_k == -1 ? 0 : top_k;  // -1: all, as vLLM
  r.number("min_p", &s->min_p);
  r.number("presence_penalty", &s->presence_penalty);
  r.number("frequency_penalty", &s->frequency_penalty);
  r.number("repetition_penalty", &s->repetition_penalty);
  if (const json* seed = r.find("seed"); seed != nullptr && !r.failed()) {
    if (!seed->is_number_integer()) return r.fail("seed", "'seed' must be an integer");
    s->seed =
        seed->is_number_unsigned() ? seed->get<uint64_t>() : static_cast<uint64_t>(seed->get<int64_t>());
  }
}

// vLLM's fields: min_tokens, allowed_token_ids, bad_words, the special-token and prompt options.
void parse_vllm_extras(Reader& r, ApiEndpoint endpoint, GenerateRequest* req) {
  GenerationRequest& g = req->generation;
  r.integer("min_tokens", &g.sampling.min_tokens, 0, kInt32Max);
  if (const json* ids = r.find("allowed_token_ids"); ids != nullptr && !r.failed()) {
    if (!is_token_id_array(*ids) || !read_ids(*ids, &g.sampling.allowed_token_ids))
      return r.fail("allowed_token_ids", "'allowed_token_ids' must be a non-empty array of token ids");
  }
  if (const json* words = r.find("bad_words"); words != nullptr && !r.failed()) {
    if (!words->is_array()) return r.fail("bad_words", "'bad_words' must be an array of strings");
    for (const json& w : *words) {
      if (!w.is_string()) return r.fail("bad_words", "'bad_words' must be an array of strings");
      g.bad_words.push_back(w.get<std::string>());
    }
  }
  r.boolean("skip_special_tokens", &g.skip_special_tokens);
  // Byte-level BPE (every tokenizer inferd reads) writes special tokens' text as it is: no spaces
  // to add or leave out, as with Hugging Face's fast tokenizers in vLLM. Type-checked only.
  bool spaces_between_special_tokens = true;
  r.boolean("spaces_between_special_tokens", &spaces_between_special_tokens);
  int64_t truncate = 0;
  if (r.integer("truncate_prompt_tokens", &truncate, -1, kInt64Max)) g.truncate_prompt_tokens = truncate;
  bool flag = false;
  if (r.boolean("add_special_tokens", &flag)) g.add_special_tokens = flag;
  if (endpoint == ApiEndpoint::kChat) {
    if (r.boolean("add_generation_prompt", &flag)) g.add_generation_prompt = flag;
    r.boolean("continue_final_message", &g.continue_final_message);
  }
  r.boolean("return_tokens_as_token_ids", &req->return_tokens_as_token_ids);
  int32_t prompt_logprobs = 0;
  if (r.integer("prompt_logprobs", &prompt_logprobs, kInt32Min, kInt32Max)) {
    g.sampling.prompt_logprobs = prompt_logprobs;
    req->prompt_logprobs_field = true;
  }
}

void parse_stops(Reader& r, GenerationRequest* g) {
  if (const json* stop = r.find("stop"); stop != nullptr && !r.failed()) {
    const bool ok = stop->is_string() || stop->is_array();
    for (const json& x : stop->is_string() ? json::array({*stop}) : (ok ? *stop : json::array())) {
      if (!x.is_string()) return r.fail("stop", "'stop' must be a string or an array of strings");
      g->stop.push_back(x.get<std::string>());
    }
    if (!ok) return r.fail("stop", "'stop' must be a string or an array of strings");
  }
  if (const json* ids = r.find("stop_token_ids"); ids != nullptr && !r.failed()) {
    if (!ids->is_array() || (!ids->empty() && !is_token_id_array(*ids)) ||
        !read_ids(*ids, &g->stop_token_ids))
      r.fail("stop_token_ids", "'stop_token_ids' must be an array of token ids");
  }
}

// stream, stream_options and the logprobs fields, whose rules tie them to each other.
void parse_answer_shape(Reader& r, ApiEndpoint endpoint, GenerateRequest* req) {
  SamplingParams& s = req->generation.sampling;
  r.boolean("stream", &req->stream);
  if (const json* so = r.find("stream_options"); so != nullptr && !r.failed()) {
    if (!so->is_object()) return r.fail("stream_options", "'stream_options' must be an object");
    if (!req->stream) return r.fail("stream_options", "'stream_options' is only allowed with 'stream': true");
    if (auto iu = so->find("include_usage"); iu != so->end() && !iu->is_null()) {
      if (!iu->is_boolean())
        return r.fail("stream_options.include_usage", "'stream_options.include_usage' must be a boolean");
      req->include_usage = iu->get<bool>();
    }
  }
  if (endpoint == ApiEndpoint::kChat) {
    r.boolean("logprobs", &req->logprobs);
    int32_t top = 0;
    if (r.integer("top_logprobs", &top, kInt32Min, kInt32Max) && !req->logprobs && top > 0)
      return r.fail("top_logprobs", "'top_logprobs' needs 'logprobs': true");
    if (req->logprobs) s.logprobs = top;
  } else {
    int32_t k = 0;
    if (r.integer("logprobs", &k, kInt32Min, kInt32Max)) {
      req->logprobs = true;
      s.logprobs = k;
    }
  }
}

}  // namespace

std::string transfer_id_text(uint64_t id) {
  static const char* kHex = "0123456789abcdef";
  std::string out(16, '0');
  for (int i = 15; i >= 0; --i, id >>= 4) out[static_cast<size_t>(i)] = kHex[id & 15];
  return out;
}

std::optional<uint64_t> parse_transfer_id(const std::string& text) {
  if (text.size() != 16) return std::nullopt;
  uint64_t id = 0;
  for (char c : text) {
    int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (d < 0) return std::nullopt;
    id = id << 4 | static_cast<uint64_t>(d);
  }
  return id;
}

namespace {

// kv_transfer_params: {"do_remote_decode": true} or the prefill answer's handle.
// inferd's StreamingLLM window: {"sink_tokens": S, "window_tokens": W}.
void parse_streaming_llm(Reader& r, GenerationRequest* g) {
  const json* v = r.find("streaming_llm");
  if (v == nullptr || r.failed()) return;
  const std::string field = "streaming_llm";
  if (!v->is_object()) return r.fail(field, "'streaming_llm' must be an object");
  for (const auto& [key, value] : v->items()) {
    if (key != "sink_tokens" && key != "window_tokens")
      return r.fail(field + "." + key, "unknown field 'streaming_llm." + key + "'");
  }
  StreamingWindow w;
  for (const auto& [key, out, lo] : {std::tuple{"sink_tokens", &w.sink_tokens, int64_t{0}},
                                     std::tuple{"window_tokens", &w.window_tokens, int64_t{16}}}) {
    auto it = v->find(key);
    if (it == v->end()) {
      if (std::string_view(key) == "window_tokens")
        return r.fail(field + ".window_tokens", "'streaming_llm.window_tokens' is required");
      continue;
    }
    constexpr int64_t kMax = int64_t{1} << 30;
    if (!it->is_number_integer() || it->get<int64_t>() < lo || it->get<int64_t>() > kMax)
      return r.fail(field + "." + key, "'streaming_llm." + std::string(key) + "' must be an integer in [" +
                                           std::to_string(lo) + ", " + std::to_string(kMax) + "]");
    *out = it->get<int64_t>();
  }
  g->streaming = w;
}

void parse_kv_transfer(Reader& r, GenerateRequest* req) {
  const json* v = r.find("kv_transfer_params");
  if (v == nullptr || r.failed()) return;
  const std::string field = "kv_transfer_params";
  if (!v->is_object()) return r.fail(field, "'kv_transfer_params' must be an object");
  KvTransferParams p;
  auto bad = [&](const char* key, const std::string& what) {
    r.fail(field + "." + key, "'kv_transfer_params." + std::string(key) + "' " + what);
  };
  if (auto it = v->find("do_remote_decode"); it != v->end() && !it->is_null()) {
    if (!it->is_boolean()) return bad("do_remote_decode", "must be a boolean");
    p.do_remote_decode = it->get<bool>();
  }
  if (v->contains("remote_host") || v->contains("transfer_id")) {
    RemoteKvRef ref;
    auto str = [&](const char* key, std::string* out) {
      auto it = v->find(key);
      if (it == v->end() || !it->is_string() || it->get<std::string>().empty()) {
        bad(key, "must be a non-empty string");
        return false;
      }
      *out = it->get<std::string>();
      return true;
    };
    auto integer = [&](const char* key, int64_t lo, int64_t hi, int64_t* out) {
      auto it = v->find(key);
      if (it == v->end() || !it->is_number_integer() || it->get<int64_t>() < lo || it->get<int64_t>() > hi) {
        bad(key, "must be an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
        return false;
      }
      *out = it->get<int64_t>();
      return true;
    };
    std::string id_text;
    int64_t port = 0, tokens = 0, first = 0;
    if (!str("remote_host", &ref.host) || !integer("remote_port", 1, 65535, &port) ||
        !str("transfer_id", &id_text) || !integer("num_tokens", 1, kInt64Max, &tokens) ||
        !integer("first_token", 0, kInt32Max, &first))
      return;
    const auto id = parse_transfer_id(id_text);
    if (!id) return bad("transfer_id", "must be 16 lower-case hex digits");
    ref.port = static_cast<uint16_t>(port);
    ref.transfer_id = *id;
    ref.num_tokens = tokens;
    p.remote = std::move(ref);
    p.first_token = static_cast<int32_t>(first);
  }
  if (p.do_remote_decode && p.remote)
    return r.fail(
        field, "'kv_transfer_params' asks for a prefill (do_remote_decode) and names a prefill's KV at once");
  if (p.remote) {
    // The first token was sampled elsewhere, without these fields' state.
    for (const char* key :
         {"n", "logprobs", "response_format", "structured_outputs", "guided_json", "guided_regex",
          "guided_choice", "guided_grammar", "tools", "echo", "prompt_logprobs"}) {
      const json* f = r.find(key);
      if (f == nullptr) continue;
      const bool off = (f->is_boolean() && !f->get<bool>()) ||
                       (f->is_number_integer() && f->get<int64_t>() == 1 && std::string_view(key) == "n");
      if (!off)
        return r.fail(key, std::string("'") + key +
                               "' cannot be combined with kv_transfer_params (a decode "
                               "instance continues from a first token sampled without it)");
    }
  }
  if (p.do_remote_decode || p.remote) req->kv_transfer = std::move(p);
}

}  // namespace

bool is_request_id(std::string_view id) {
  return !id.empty() && id.size() <= 128 && std::all_of(id.begin(), id.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '_' || c == ':' || c == '-';
  });
}

namespace {

// OpenAI's predicted outputs: {"type": "content", "content": text or [{"type": "text", "text"}]}.
void parse_prediction(Reader& r, GenerationRequest* g) {
  const json* p = r.find("prediction");
  if (p == nullptr || r.failed()) return;
  const char* shape =
      "'prediction' must be {\"type\": \"content\", \"content\": a string or an array of text parts}";
  if (!p->is_object() || p->value("type", "") != "content" || !p->contains("content") || p->size() != 2)
    return r.fail("prediction", shape);
  const json& c = (*p)["content"];
  std::string text;
  if (c.is_string()) {
    text = c.get<std::string>();
  } else if (c.is_array()) {
    for (const auto& part : c) {
      if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") ||
          !part["text"].is_string())
        return r.fail("prediction", shape);
      text += part["text"].get<std::string>();
    }
  } else {
    return r.fail("prediction", shape);
  }
  g->prediction = std::move(text);
}

// The fields that shape the rendered chat (chat requests and /tokenize): their JSON types here,
// their values InputProcessor's.
void parse_chat_template_fields(Reader& r, GenerationRequest* g) {
  if (const json* kw = r.find("chat_template_kwargs"); kw != nullptr && !r.failed()) {
    if (!kw->is_object()) r.fail("chat_template_kwargs", "'chat_template_kwargs' must be an object");
    g->chat_template_kwargs = *kw;
  }
  if (std::string t; r.string("chat_template", &t)) g->chat_template = std::move(t);
  if (std::string e; r.string("reasoning_effort", &e)) g->reasoning_effort = std::move(e);
  if (const json* d = r.find("documents"); d != nullptr && !r.failed()) {
    if (!d->is_array())
      r.fail("documents", "'documents' must be a list of objects of strings (e.g. title, text)");
    g->documents = *d;
  }
}

}  // namespace

ParsedRequest parse_generate_request(ApiEndpoint endpoint, std::string_view body) {
  ParsedRequest out;
  json j;
  if (!parse_object(body, &j, &out.error)) return out;
  Reader r(j);
  GenerateRequest req;
  GenerationRequest& g = req.generation;
  req.endpoint = endpoint;
  check_field_names(r, endpoint, j);
  r.string("model", &req.model);
  if (endpoint == ApiEndpoint::kChat) {
    parse_messages(r, j, &g);
  } else {
    parse_prompt(r, &g);
  }
  int64_t max_tokens = 0;
  if (r.integer("max_tokens", &max_tokens, -kInt64Max, kInt64Max)) g.max_tokens = max_tokens;
  if (endpoint == ApiEndpoint::kChat &&
      r.integer("max_completion_tokens", &max_tokens, -kInt64Max, kInt64Max))
    g.max_tokens = max_tokens;
  parse_sampling(r, &g.sampling);
  parse_stops(r, &g);
  parse_vllm_extras(r, endpoint, &req);
  r.integer("n", &g.n, kInt32Min, kInt32Max);
  if (int32_t best_of = 0; r.integer("best_of", &best_of, kInt32Min, kInt32Max)) g.best_of = best_of;
  parse_answer_shape(r, endpoint, &req);
  r.boolean("ignore_eos", &g.ignore_eos);
  r.integer("priority", &g.priority, kInt32Min, kInt32Max);
  r.string("user", &req.user);
  r.string("session_id", &g.session_id);
  r.string("slo_class", &req.slo_class);
  parse_logit_bias(r, &g.sampling);
  if (endpoint == ApiEndpoint::kChat) {
    req.legacy_functions = parse_functions(r, &g);
    if (!req.legacy_functions) parse_tools(r, &g);
  }
  parse_structured_output(r, &g);
  r.boolean("include_stop_str_in_output", &g.include_stop_str_in_output);
  if (endpoint == ApiEndpoint::kCompletion) r.boolean("echo", &g.echo);
  if (std::string suffix; endpoint == ApiEndpoint::kCompletion && r.string("suffix", &suffix))
    g.suffix = suffix;
  // echo with logprobs (completions): the prompt's tokens come with theirs, as prompt logprobs
  // with the same number of alternatives.
  if (g.echo && g.sampling.logprobs && !g.sampling.prompt_logprobs)
    g.sampling.prompt_logprobs = g.sampling.logprobs;
  if (g.sampling.prompt_logprobs && req.stream)
    r.fail(
        g.echo && req.logprobs ? "echo" : "prompt_logprobs",
        "prompt log-probabilities (prompt_logprobs, or echo with logprobs) are not supported with 'stream'");
  parse_prediction(r, &g);
  if (r.string("cache_salt", &g.cache_salt) && g.cache_salt.empty())
    r.fail("cache_salt", "'cache_salt' must not be empty");
  if (r.string("request_id", &req.request_id) && !is_request_id(req.request_id))
    r.fail("request_id", "'request_id' must be 1-128 letters, digits or . _ : -");
  // Text is the only modality in and out: these fields are read, and refused where they would ask
  // for more.
  if (const json* m = r.find("modalities"); m != nullptr && !r.failed()) {
    if (!m->is_array() || m->empty() ||
        !std::all_of(m->begin(), m->end(), [](const json& x) { return x == "text"; }))
      r.fail("modalities", "'modalities' must be [\"text\"]: this server writes text only");
  }
  if (const json* k = r.find("mm_processor_kwargs"); k != nullptr && !r.failed()) {
    if (!k->is_object() || !k->empty())
      r.fail("mm_processor_kwargs", "'mm_processor_kwargs' must be {} (this server takes text only)");
  }
  r.boolean("use_beam_search", &g.use_beam_search);
  if (float penalty = 1.0f; r.number("length_penalty", &penalty)) g.length_penalty = penalty;
  if (g.use_beam_search && req.stream)
    r.fail("use_beam_search", "'use_beam_search' cannot go with 'stream' (the beams are ranked at the end)");
  if (g.best_of && req.stream)
    r.fail("best_of", "'best_of' cannot go with 'stream' (the best are known when all have finished)");
  parse_kv_transfer(r, &req);
  if (req.kv_transfer && g.best_of.value_or(1) != 1)
    r.fail("best_of", "'best_of' must be 1 with kv_transfer_params");
  if (req.kv_transfer && g.use_beam_search)
    r.fail("use_beam_search", "'use_beam_search' cannot go with kv_transfer_params");
  parse_streaming_llm(r, &g);
  if (g.streaming.enabled() && req.kv_transfer)
    r.fail("streaming_llm", "'streaming_llm' is not supported with kv_transfer_params");
  if (req.kv_transfer && req.kv_transfer->do_remote_decode && req.stream)
    r.fail("stream", "'stream' must be false with kv_transfer_params.do_remote_decode");
  if (endpoint == ApiEndpoint::kChat) parse_chat_template_fields(r, &g);
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
  GenerationRequest& chat = t.chat;
  if (r.find("messages") != nullptr) {
    parse_messages(r, j, &chat);
  } else if (!r.string("prompt", &t.prompt) && !r.failed()) {
    r.fail("prompt", "'prompt' (a string) or 'messages' is required");
  }
  for (const auto& [key, value] : j.items()) {
    static constexpr std::string_view kFields[] = {"model",
                                                   "prompt",
                                                   "messages",
                                                   "add_special_tokens",
                                                   "add_generation_prompt",
                                                   "continue_final_message",
                                                   "chat_template_kwargs",
                                                   "chat_template",
                                                   "documents",
                                                   "reasoning_effort",
                                                   "tools"};
    if (!contains(kFields, key)) {
      r.fail(key, "unknown field '" + key + "' for /tokenize");
      break;
    }
  }
  bool flag = false;
  if (r.boolean("add_special_tokens", &flag)) t.add_special_tokens = chat.add_special_tokens = flag;
  if (r.boolean("add_generation_prompt", &flag)) chat.add_generation_prompt = flag;
  r.boolean("continue_final_message", &chat.continue_final_message);
  parse_chat_template_fields(r, &chat);
  if (const json* tools = r.find("tools"); tools != nullptr && !r.failed()) chat.tools = *tools;
  if (chat.messages.is_null()) {
    for (const char* key : {"add_generation_prompt", "continue_final_message", "chat_template_kwargs",
                            "chat_template", "documents", "reasoning_effort", "tools"}) {
      if (r.find(key) != nullptr && !r.failed()) r.fail(key, std::string("'") + key + "' is for messages");
    }
  }
  if (r.failed()) {
    out.error = r.take_error();
    return out;
  }
  out.request = std::move(t);
  return out;
}

namespace {

// The prompt options of the embedding, score and rerank bodies.
void read_prompt_options(Reader& r, GenerationRequest* g) {
  r.integer("priority", &g->priority, kInt32Min, kInt32Max);
  if (int64_t k = 0; r.integer("truncate_prompt_tokens", &k, -1, kInt64Max)) g->truncate_prompt_tokens = k;
  if (bool a = true; r.boolean("add_special_tokens", &a)) g->add_special_tokens = a;
}

}  // namespace

ParsedEmbedding parse_embedding_request(std::string_view body, bool classify) {
  ParsedEmbedding out;
  json j;
  if (!parse_object(body, &j, &out.error)) return out;
  Reader r(j);
  static constexpr std::string_view kFields[] = {"model",
                                                 "input",
                                                 "user",
                                                 "priority",
                                                 "truncate_prompt_tokens",
                                                 "add_special_tokens",
                                                 "request_id",
                                                 "messages",
                                                 "add_generation_prompt",
                                                 "continue_final_message",
                                                 "chat_template_kwargs",
                                                 "chat_template"};
  static constexpr std::string_view kEmbeddingFields[] = {"encoding_format", "dimensions", "normalize"};
  for (const auto& [key, value] : j.items()) {
    if (!contains(kFields, key) && (classify ? key != "use_activation" : !contains(kEmbeddingFields, key))) {
      r.fail(key, "unknown field '" + key + (classify ? "' for classify" : "' for embeddings"));
      break;
    }
  }
  EmbeddingRequest e;
  GenerationRequest& g = e.generation;
  r.string("model", &e.model);
  r.string("user", &e.user);
  if (r.string("request_id", &e.request_id) && !is_request_id(e.request_id))
    r.fail("request_id", "'request_id' must be 1-128 letters, digits or . _ : -");
  const bool chat = r.find("messages") != nullptr;
  if (chat && r.find("input") != nullptr && !r.failed())
    r.fail("input", "give 'input' or 'messages', not both");
  if (chat) {
    parse_messages(r, j, &g);
    parse_chat_template_fields(r, &g);
    g.add_generation_prompt = false;  // an embedding of the conversation as it is
    bool flag = false;
    if (r.boolean("add_generation_prompt", &flag)) g.add_generation_prompt = flag;
    r.boolean("continue_final_message", &g.continue_final_message);
  } else if (!r.failed()) {
    const json* input = r.find("input");
    if (input == nullptr) {
      r.fail("input", "'input' is required");
    } else {
      json as_prompt = {{"prompt", *input}};
      Reader pr(as_prompt);
      parse_prompt(pr, &g);
      if (pr.failed()) {
        ApiError err = pr.take_error();
        std::string message = err.message;
        if (const size_t at = message.find("'prompt'"); at != std::string::npos)
          message.replace(at, 8, "'input'");
        r.fail("input", message);
      }
    }
    for (const char* key :
         {"add_generation_prompt", "continue_final_message", "chat_template_kwargs", "chat_template"}) {
      if (r.find(key) != nullptr && !r.failed()) r.fail(key, std::string("'") + key + "' is for messages");
    }
  }
  if (std::string f; r.string("encoding_format", &f)) {
    if (f != "float" && f != "base64")
      r.fail("encoding_format", "'encoding_format' must be \"float\" or \"base64\"");
    e.base64 = f == "base64";
  }
  if (int64_t d = 0; r.integer("dimensions", &d, 1, kInt32Max)) e.dimensions = d;
  if (bool n = true; r.boolean("normalize", &n)) e.normalize = n;
  if (bool a = true; r.boolean("use_activation", &a)) e.use_activation = a;
  read_prompt_options(r, &g);
  if (r.failed()) {
    out.error = r.take_error();
    return out;
  }
  out.request = std::move(e);
  return out;
}

ParsedScore parse_score_request(bool rerank, std::string_view body) {
  ParsedScore out;
  json j;
  if (!parse_object(body, &j, &out.error)) return out;
  Reader r(j);
  static constexpr std::string_view kScoreFields[] = {
      "model",    "text_1",     "text_2", "truncate_prompt_tokens", "add_special_tokens",
      "priority", "request_id", "user",   "use_activation"};
  static constexpr std::string_view kRerankFields[] = {
      "model",    "query",      "documents", "top_n",         "return_documents", "truncate_prompt_tokens",
      "priority", "request_id", "user",      "use_activation"};
  for (const auto& [key, value] : j.items()) {
    if (rerank ? !contains(kRerankFields, key) : !contains(kScoreFields, key)) {
      r.fail(key, "unknown field '" + key + (rerank ? "' for rerank" : "' for score"));
      break;
    }
  }
  ScoreRequest s;
  s.rerank = rerank;
  EmbeddingRequest& e = s.embedding;
  GenerationRequest& g = e.generation;
  r.string("model", &e.model);
  r.string("user", &e.user);
  if (r.string("request_id", &e.request_id) && !is_request_id(e.request_id))
    r.fail("request_id", "'request_id' must be 1-128 letters, digits or . _ : -");
  // A field of one text or a non-empty list of texts, appended to the prompts.
  auto texts = [&](const char* key, bool list_allowed, std::vector<std::string>* kept) -> size_t {
    const json* v = r.find(key);
    const std::string what =
        std::string("'") + key + "' must be a string" + (list_allowed ? " or a list of strings" : "");
    if (r.failed()) return 0;
    if (v == nullptr) {
      r.fail(key, std::string("'") + key + "' is required");
      return 0;
    }
    std::vector<std::string> items;
    if (v->is_string()) {
      items.push_back(v->get<std::string>());
    } else if (list_allowed && v->is_array() && !v->empty() &&
               std::all_of(v->begin(), v->end(), [](const json& x) { return x.is_string(); })) {
      for (const json& x : *v) items.push_back(x.get<std::string>());
    } else {
      r.fail(key, what);
      return 0;
    }
    for (const std::string& t : items) {
      if (t.empty()) {
        r.fail(key, std::string("'") + key + "' has an empty text");
        return 0;
      }
      g.prompts.push_back({t, {}, false});
      if (kept != nullptr) kept->push_back(t);
    }
    return items.size();
  };
  if (rerank) {
    s.num_queries = texts("query", false, nullptr);
    texts("documents", true, &s.documents);
    if (const json* d = r.find("documents"); d != nullptr && d->is_string() && !r.failed())
      r.fail("documents", "'documents' must be a list of strings");
    if (int64_t n = 0; r.integer("top_n", &n, 0, kInt32Max)) s.top_n = n;
    r.boolean("return_documents", &s.return_documents);
  } else {
    s.num_queries = texts("text_1", true, nullptr);
    const size_t docs = texts("text_2", true, nullptr);
    if (!r.failed() && s.num_queries != 1 && s.num_queries != docs)
      r.fail("text_1",
             "'text_1' must be one text, or as many texts as 'text_2' (" + std::to_string(docs) + ")");
  }
  if (bool a = true; r.boolean("use_activation", &a)) e.use_activation = a;
  read_prompt_options(r, &g);
  if (r.failed()) {
    out.error = r.take_error();
    return out;
  }
  out.request = std::move(s);
  return out;
}

std::vector<double> cosine_scores(const ScoreRequest& request,
                                  const std::vector<std::vector<float>>& embeddings) {
  const size_t queries = request.num_queries;
  const size_t documents = embeddings.size() - queries;
  auto cosine = [&](size_t d) {
    const std::vector<float>& q = embeddings[queries == 1 ? 0 : d];
    const std::vector<float>& v = embeddings[queries + d];
    double dot = 0, qq = 0, vv = 0;
    for (size_t k = 0; k < q.size() && k < v.size(); ++k) {
      dot += static_cast<double>(q[k]) * v[k];
      qq += static_cast<double>(q[k]) * q[k];
      vv += static_cast<double>(v[k]) * v[k];
    }
    return dot / std::max(std::sqrt(qq * vv), 1e-12);
  };
  std::vector<double> out;
  for (size_t d = 0; d < documents; ++d) out.push_back(cosine(d));
  return out;
}

std::string score_body(const std::string& id, const std::string& model, const ScoreRequest& request,
                       const std::vector<double>& scores, int64_t prompt_tokens) {
  const size_t documents = scores.size();
  if (!request.rerank) {
    json data = json::array();
    for (size_t d = 0; d < documents; ++d)
      data.push_back({{"index", d}, {"object", "score"}, {"score", scores[d]}});
    return json{{"id", id},
                {"object", "list"},
                {"created", static_cast<int64_t>(std::time(nullptr))},
                {"model", model},
                {"data", std::move(data)},
                {"usage", {{"prompt_tokens", prompt_tokens}, {"total_tokens", prompt_tokens}}}}
        .dump(-1, ' ', false, json::error_handler_t::replace);
  }
  std::vector<std::pair<double, size_t>> ranked;
  for (size_t d = 0; d < documents; ++d) ranked.emplace_back(scores[d], d);
  std::stable_sort(ranked.begin(), ranked.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  if (request.top_n.value_or(0) > 0 && static_cast<size_t>(*request.top_n) < ranked.size())
    ranked.resize(static_cast<size_t>(*request.top_n));
  json results = json::array();
  for (const auto& [score, d] : ranked) {
    json item = {{"index", d}, {"relevance_score", score}};
    if (request.return_documents) item["document"] = {{"text", request.documents.at(d)}};
    results.push_back(std::move(item));
  }
  return json{{"id", id},
              {"model", model},
              {"usage", {{"prompt_tokens", prompt_tokens}, {"total_tokens", prompt_tokens}}},
              {"results", std::move(results)}}
      .dump(-1, ' ', false, json::error_handler_t::replace);
}

std::optional<std::string> check_dimensions(int64_t dimensions, int64_t hidden_size,
                                            const std::optional<std::vector<int64_t>>& matryoshka) {
  if (dimensions == hidden_size) return std::nullopt;
  if (!matryoshka)
    return "'dimensions' must be " + std::to_string(hidden_size) +
           ", the model's embedding size: it has no Matryoshka representation to shorten (a model that has "
           "one: "
           "inferd serve --hf-overrides '{\"is_matryoshka\": true}')";
  if (dimensions > hidden_size)
    return "'dimensions' must be at most " + std::to_string(hidden_size) + ", the model's embedding size";
  if (matryoshka->empty() ||
      std::find(matryoshka->begin(), matryoshka->end(), dimensions) != matryoshka->end())
    return std::nullopt;
  std::string sizes;
  for (int64_t d : *matryoshka) sizes += (sizes.empty() ? "" : ", ") + std::to_string(d);
  return "'dimensions' must be one of the model's Matryoshka sizes (" + sizes + ")";
}

void shorten_embedding(std::vector<float>* v, int64_t dimensions, bool normalize) {
  if (dimensions <= 0 || static_cast<size_t>(dimensions) >= v->size()) return;
  v->resize(static_cast<size_t>(dimensions));
  if (!normalize) return;
  double norm = 0;
  for (float x : *v) norm += static_cast<double>(x) * x;
  const double scale = 1.0 / std::max(std::sqrt(norm), 1e-12);
  for (float& x : *v) x = static_cast<float>(x * scale);
}

std::string base64_encode(std::string_view bytes) {
  using Encoder = boost::archive::iterators::base64_from_binary<
      boost::archive::iterators::transform_width<std::string_view::const_iterator, 6, 8>>;
  std::string out(Encoder(bytes.begin()), Encoder(bytes.end()));
  out.append((3 - bytes.size() % 3) % 3, '=');
  return out;
}

std::string embedding_body(const std::string& id, const std::string& model,
                           const std::vector<std::vector<float>>& embeddings, bool base64,
                           int64_t prompt_tokens) {
  json data = json::array();
  for (size_t i = 0; i < embeddings.size(); ++i) {
    const std::vector<float>& v = embeddings[i];
    json item = {{"object", "embedding"}, {"index", i}};
    if (base64) {
      static_assert(std::endian::native == std::endian::little, "base64 embeddings are little-endian floats");
      item["embedding"] =
          base64_encode(std::string_view(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float)));
    } else {
      item["embedding"] = v;
    }
    data.push_back(std::move(item));
  }
  const json answer = {{"id", id},
                       {"object", "list"},
                       {"created", static_cast<int64_t>(std::time(nullptr))},
                       {"model", model},
                       {"data", std::move(data)},
                       {"usage", {{"prompt_tokens", prompt_tokens}, {"total_tokens", prompt_tokens}}}};
  return answer.dump(-1, ' ', false, json::error_handler_t::replace);
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

// ---- answers ----------------------------------------------------------------------------------

std::vector<size_t> best_of_choices(const std::vector<OutputProcessor>& candidates, size_t per_prompt,
                                    size_t answered) {
  std::vector<size_t> out;
  if (per_prompt == 0) return out;
  auto score = [&](size_t i) {
    const auto& lp = candidates[i].logprobs();
    if (lp.empty()) return -std::numeric_limits<double>::infinity();
    double sum = 0;
    for (const TokenLogprob& e : lp) sum += e.logprob;
    return sum / static_cast<double>(lp.size());
  };
  for (size_t first = 0; first < candidates.size(); first += per_prompt) {
    std::vector<std::pair<double, size_t>> ranked;
    for (size_t i = first; i < std::min(first + per_prompt, candidates.size()); ++i)
      ranked.emplace_back(score(i), i);
    std::stable_sort(ranked.begin(), ranked.end(),
                     [](const auto& a, const auto& b) { return a.first > b.first; });
    for (size_t k = 0; k < std::min(answered, ranked.size()); ++k) out.push_back(ranked[k].second);
  }
  return out;
}

namespace {
std::string dump(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}
std::string sse(const nlohmann::json& j) {
  return "data: " + dump(j) + "\n\n";
}
}  // namespace

OpenAiAnswer::OpenAiAnswer(ApiEndpoint endpoint, std::string id, int64_t created, std::string model,
                           const Tokenizer* tokenizer, bool logprobs, bool split_reasoning)
    : endpoint_(endpoint),
      id_(std::move(id)),
      created_(created),
      model_(std::move(model)),
      tokenizer_(tokenizer),
      logprobs_(logprobs),
      split_reasoning_(split_reasoning) {}

nlohmann::json token_logprob_json(const Tokenizer* tokenizer, int32_t id, float logprob, bool as_ids) {
  const bool named = tokenizer != nullptr && !as_ids;
  const std::string token =
      named ? tokenizer->token_bytes(id) : (as_ids ? "token_id:" + std::to_string(id) : std::to_string(id));
  nlohmann::json b = nlohmann::json::array();
  if (tokenizer != nullptr)
    for (unsigned char c : token) b.push_back(c);
  return {{"token", token}, {"logprob", logprob}, {"bytes", b}};
}

std::string random_id(const char* prefix) {
  static thread_local std::mt19937_64 rng(std::random_device{}());
  char buf[48];
  std::snprintf(buf, sizeof buf, "%s%016llx", prefix, static_cast<unsigned long long>(rng()));
  return buf;
}

nlohmann::json OpenAiAnswer::token_entry(int32_t id, float logprob) const {
  return token_logprob_json(tokenizer_, id, logprob, tokens_as_ids_);
}

// vLLM's prompt_logprobs: null for the first prompt token, then per token {id: {logprob, rank,
// decoded_token}} for the token itself and the top alternatives (ranks 1..k).
nlohmann::json OpenAiAnswer::prompt_logprobs_json(const OutputProcessor& choice) const {
  nlohmann::json out = nlohmann::json::array({nullptr});
  for (const TokenLogprob& e : choice.prompt_logprobs()) {
    nlohmann::json entry = nlohmann::json::object();
    auto put = [&](int32_t id, float logprob, int64_t rank) {
      const std::string key = std::to_string(id);
      if (!entry.contains(key))
        entry[key] = {
            {"logprob", logprob}, {"rank", rank}, {"decoded_token", token_entry(id, logprob)["token"]}};
    };
    put(e.token, e.logprob, e.rank);
    for (size_t i = 0; i < e.top.size(); ++i)
      put(e.top[i].first, e.top[i].second, static_cast<int64_t>(i) + 1);
    out.push_back(std::move(entry));
  }
  return out;
}

// Chat: {"content": [entries]}; completions: tokens / token_logprobs / top_logprobs maps.
nlohmann::json OpenAiAnswer::logprobs_json(const std::vector<TokenLogprob>& entries,
                                           const OutputProcessor* prompt) const {
  if (!logprobs_) return nullptr;
  if (endpoint_ == ApiEndpoint::kChat) {
    nlohmann::json content = nlohmann::json::array();
    for (const auto& e : entries) {
      nlohmann::json entry = token_entry(e.token, e.logprob);
      nlohmann::json top = nlohmann::json::array();
      for (const auto& [t, lp] : e.top) top.push_back(token_entry(t, lp));
      entry["top_logprobs"] = top;
      content.push_back(entry);
    }
    return {{"content", content}};
  }
  nlohmann::json tokens = nlohmann::json::array(), lps = nlohmann::json::array(),
                 tops = nlohmann::json::array();
  if (prompt != nullptr && prompt->prompt_head() >= 0) {  // echo: the prompt's tokens first
    tokens.push_back(token_entry(prompt->prompt_head(), 0.0f)["token"]);
    lps.push_back(nullptr);
    tops.push_back(nullptr);
  }
  static const std::vector<TokenLogprob> kNone;
  const std::vector<TokenLogprob>& prompt_entries = prompt != nullptr ? prompt->prompt_logprobs() : kNone;
  for (const auto* list : {&prompt_entries, &entries}) {
    for (const auto& e : *list) {
      tokens.push_back(token_entry(e.token, e.logprob)["token"]);
      lps.push_back(e.logprob);
      nlohmann::json top = nlohmann::json::object();
      for (const auto& [t, lp] : e.top) top[token_entry(t, lp)["token"].get<std::string>()] = lp;
      tops.push_back(top);
    }
  }
  return {{"tokens", tokens}, {"token_logprobs", lps}, {"top_logprobs", tops}};
}

nlohmann::json OpenAiAnswer::chunk(size_t index, nlohmann::json delta_or_text, const nlohmann::json& logprobs,
                                   const nlohmann::json& finish) const {
  nlohmann::json c = {{"index", index}};
  c[endpoint_ == ApiEndpoint::kChat ? "delta" : "text"] = std::move(delta_or_text);
  c["logprobs"] = logprobs;
  c["finish_reason"] = finish;
  return {{"id", id_},
          {"object", endpoint_ == ApiEndpoint::kChat ? "chat.completion.chunk" : "text_completion"},
          {"created", created_},
          {"model", model_},
          {"choices", nlohmann::json::array({c})}};
}

// OpenAI's finish_reason: "tool_calls" when the model stopped after calling tools.
const char* OpenAiAnswer::finish_name(const OutputProcessor& choice) const {
  const FinishReason reason = choice.finish_reason().value_or(FinishReason::kAborted);
  if (reason == FinishReason::kStop && !choice.tool_calls().empty())
    return legacy_functions_ ? "function_call" : "tool_calls";
  return finish_reason_name(reason);
}

std::string OpenAiAnswer::stream_events(size_t index, const ChoiceDelta& d, const OutputProcessor& choice,
                                        bool first_output) const {
  const bool chat = endpoint_ == ApiEndpoint::kChat;
  std::string events;
  if (chat && first_output)
    events += sse(chunk(index, {{"role", "assistant"}, {"content", ""}}, nullptr, nullptr));
  if (!d.content.empty() || !d.reasoning.empty() || !d.logprobs.empty()) {
    nlohmann::json delta;
    if (chat) {
      delta = nlohmann::json::object();
      if (!d.reasoning.empty()) delta["reasoning_content"] = d.reasoning;
      if (!d.content.empty() || (d.reasoning.empty() && d.tool_calls.empty())) delta["content"] = d.content;
    } else {
      delta = d.content;
    }
    events += sse(chunk(index, delta, logprobs_json(d.logprobs), nullptr));
  }
  // Each tool call: a first delta with its id, type and name, then fragments of its arguments.
  for (const ToolCallDelta& call : d.tool_calls) {
    if (legacy_functions_) {  // {"function_call": {"name", "arguments": ""}}, then arguments
      nlohmann::json function = {{"arguments", call.arguments}};
      if (call.name) function["name"] = *call.name;
      events += sse(chunk(index, {{"function_call", function}}, nullptr, nullptr));
      continue;
    }
    nlohmann::json entry = {{"index", call.index}};
    nlohmann::json function = nlohmann::json::object();
    if (call.id) {
      entry["id"] = *call.id;
      entry["type"] = "function";
      function["name"] = *call.name;
    }
    function["arguments"] = call.arguments;
    entry["function"] = function;
    events += sse(chunk(index, {{"tool_calls", nlohmann::json::array({entry})}}, nullptr, nullptr));
  }
  if (d.finished && choice.error().empty())
    events +=
        sse(chunk(index, chat ? nlohmann::json::object() : nlohmann::json(""), nullptr, finish_name(choice)));
  return events;
}

nlohmann::json OpenAiAnswer::usage_json(const Usage& u) {
  nlohmann::json j = {{"prompt_tokens", u.prompt_tokens},
                      {"completion_tokens", u.completion_tokens},
                      {"total_tokens", u.prompt_tokens + u.completion_tokens}};
  if (u.prediction)
    j["completion_tokens_details"] = {{"accepted_prediction_tokens", u.prediction->first},
                                      {"rejected_prediction_tokens", u.prediction->second}};
  if (u.cached_tokens) j["prompt_tokens_details"] = {{"cached_tokens", *u.cached_tokens}};
  return j;
}

std::string OpenAiAnswer::usage_event(const Usage& u) const {
  return sse({{"id", id_},
              {"object", endpoint_ == ApiEndpoint::kChat ? "chat.completion.chunk" : "text_completion"},
              {"created", created_},
              {"model", model_},
              {"choices", nlohmann::json::array()},
              {"usage", usage_json(u)}});
}

std::string OpenAiAnswer::error_event(const std::string& message, bool internal) {
  const ApiError e = internal ? ApiError{500, message, "server_error", "", ""}
                              : ApiError{400, message, "invalid_request_error", "", ""};
  return sse({{"error", nlohmann::json::parse(error_body(e))["error"]}});
}

std::string OpenAiAnswer::body(const std::vector<OutputProcessor>& choices, const Usage& u) const {
  const bool chat = endpoint_ == ApiEndpoint::kChat;
  nlohmann::json out = nlohmann::json::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    const OutputProcessor& c = choices[i];
    nlohmann::json choice = {{"index", i}};
    if (chat) {
      nlohmann::json message = {{"role", "assistant"}, {"content", c.text()}};
      if (!c.tool_calls().empty() && legacy_functions_) {
        if (c.text().empty()) message["content"] = nullptr;
        const ToolCall& t = c.tool_calls().front();  // one at most: no parallel calls
        message["function_call"] = {{"name", t.name}, {"arguments", t.arguments}};
      } else if (!c.tool_calls().empty()) {
        if (c.text().empty()) message["content"] = nullptr;
        nlohmann::json calls = nlohmann::json::array();
        for (const ToolCall& t : c.tool_calls())
          calls.push_back({{"id", t.id},
                           {"type", "function"},
                           {"function", {{"name", t.name}, {"arguments", t.arguments}}}});
        message["tool_calls"] = calls;
      }
      if (split_reasoning_)
        message["reasoning_content"] =
            c.reasoning().empty() ? nlohmann::json(nullptr) : nlohmann::json(c.reasoning());
      choice["message"] = message;
    } else {
      choice["text"] = c.text();
    }
    choice["logprobs"] = logprobs_json(c.logprobs(), echo_logprobs_ ? &c : nullptr);
    choice["finish_reason"] = finish_name(c);
    if (prompt_field_ && !chat) choice["prompt_logprobs"] = prompt_logprobs_json(c);
    out.push_back(choice);
  }
  nlohmann::json answer = {{"id", id_},           {"object", chat ? "chat.completion" : "text_completion"},
                           {"created", created_}, {"model", model_},
                           {"choices", out},      {"usage", usage_json(u)}};
  if (prompt_field_ && chat && !choices.empty()) answer["prompt_logprobs"] = prompt_logprobs_json(choices[0]);
  return dump(answer);
}

}  // namespace inferd
