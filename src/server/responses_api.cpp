#include "server/responses_api.h"

#include <algorithm>
#include <utility>

#include "common/text.h"

namespace inferd {

using json = nlohmann::json;

namespace {

bool is_space(std::string_view s) {
  return std::all_of(s.begin(), s.end(),
                     [](char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; });
}

ApiError bad(const std::string& param, const std::string& message) {
  return ApiError{400, message, "invalid_request_error", param, ""};
}

// Fields read here, and vLLM's sampling extras passed to the chat request under the same names.
constexpr std::string_view kResponsesFields[] = {"model",
                                                 "input",
                                                 "instructions",
                                                 "max_output_tokens",
                                                 "temperature",
                                                 "top_p",
                                                 "top_logprobs",
                                                 "tools",
                                                 "tool_choice",
                                                 "parallel_tool_calls",
                                                 "text",
                                                 "reasoning",
                                                 "stream",
                                                 "stream_options",
                                                 "store",
                                                 "previous_response_id",
                                                 "metadata",
                                                 "user",
                                                 "safety_identifier",
                                                 "prompt_cache_key",
                                                 "service_tier",
                                                 "truncation",
                                                 "include",
                                                 "max_tool_calls",
                                                 "background"};
constexpr std::string_view kPassedFields[] = {"seed",
                                              "top_k",
                                              "min_p",
                                              "repetition_penalty",
                                              "presence_penalty",
                                              "frequency_penalty",
                                              "stop",
                                              "stop_token_ids",
                                              "priority",
                                              "request_id",
                                              "chat_template",
                                              "chat_template_kwargs",
                                              "cache_salt",
                                              "min_tokens",
                                              "ignore_eos",
                                              "logit_bias",
                                              "skip_special_tokens",
                                              "slo_class",
                                              "session_id"};

template <size_t N>
bool listed(const std::string_view (&names)[N], std::string_view key) {
  return std::find(std::begin(names), std::end(names), key) != std::end(names);
}

// A message's content (a string or parts) as chat text; parts of text only.
std::optional<ApiError> content_text(const json& content, const std::string& where, std::string* out) {
  if (content.is_string()) {
    *out = content.get<std::string>();
    return std::nullopt;
  }
  if (!content.is_array()) return bad(where, where + " must be a string or an array of content parts");
  std::string text;
  for (size_t j = 0; j < content.size(); ++j) {
    const json& part = content[j];
    const std::string at = where + "[" + std::to_string(j) + "]";
    const std::string type = part.is_object() ? part.value("type", "") : "";
    const char* key = type == "refusal" ? "refusal" : "text";
    if (type != "input_text" && type != "output_text" && type != "text" && type != "refusal")
      return bad(at + ".type",
                 at + ".type must be input_text or output_text (this server serves text models; '" + type +
                     "' is not supported)");
    if (!part.contains(key) || !part[key].is_string())
      return bad(at + "." + key, at + "." + key + " must be a string");
    if (!text.empty()) text += "\n";
    text += part[key].get<std::string>();
  }
  *out = std::move(text);
  return std::nullopt;
}

// Input items -> chat messages (appended to `messages`); each item copied to `items` with an id.
std::optional<ApiError> read_input(const json& input, json* messages, json* items) {
  if (input.is_string()) {
    messages->push_back({{"role", "user"}, {"content", input}});
    items->push_back({{"type", "message"},
                      {"id", random_id("msg_")},
                      {"role", "user"},
                      {"content", json::array({{{"type", "input_text"}, {"text", input}}})}});
    return std::nullopt;
  }
  if (!input.is_array()) return bad("input", "'input' must be a string or an array of input items");
  std::string reasoning;  // a reasoning item's text, for the next assistant message
  // The assistant message items and calls of one turn join: text, then its calls (parallel ones
  // in one message); text after a call starts the next message.
  auto assistant = [&](bool for_call) -> json& {
    if (messages->empty() || messages->back()["role"] != "assistant" ||
        (!for_call && messages->back().contains("tool_calls")))
      messages->push_back({{"role", "assistant"}, {"content", nullptr}});
    json& m = messages->back();
    if (!reasoning.empty()) {
      m["reasoning_content"] = reasoning;
      reasoning.clear();
    }
    return m;
  };
  for (size_t i = 0; i < input.size(); ++i) {
    const json& item = input[i];
    const std::string where = "input[" + std::to_string(i) + "]";
    if (!item.is_object()) return bad(where, where + " must be an object");
    const std::string type = item.contains("type") && item["type"].is_string()
                                 ? item["type"].get<std::string>()
                             : item.contains("type") ? "?"
                                                     : "message";
    json copy = item;
    if (!copy.contains("id") || !copy["id"].is_string())
      copy["id"] = random_id(type == "function_call_output" ? "fco_"
                             : type == "function_call"      ? "fc_"
                                                            : "msg_");
    copy["type"] = type;
    if (type == "message") {
      const std::string role =
          item.contains("role") && item["role"].is_string() ? item["role"].get<std::string>() : "";
      if (role != "user" && role != "assistant" && role != "system" && role != "developer")
        return bad(where + ".role", where + ".role must be user, assistant, system or developer");
      if (!item.contains("content")) return bad(where + ".content", where + ".content is required");
      std::string text;
      if (auto e = content_text(item["content"], where + ".content", &text)) return e;
      if (role == "assistant") {
        json& m = assistant(false);
        m["content"] = m["content"].is_string() ? m["content"].get<std::string>() + text : text;
      } else {
        messages->push_back({{"role", role}, {"content", text}});
      }
    } else if (type == "function_call") {
      for (const char* key : {"call_id", "name", "arguments"})
        if (!item.contains(key) || !item[key].is_string())
          return bad(where + "." + key, where + "." + key + " must be a string");
      json& m = assistant(true);
      if (!m.contains("tool_calls")) m["tool_calls"] = json::array();
      m["tool_calls"].push_back({{"id", item["call_id"]},
                                 {"type", "function"},
                                 {"function", {{"name", item["name"]}, {"arguments", item["arguments"]}}}});
    } else if (type == "function_call_output") {
      if (!item.contains("call_id") || !item["call_id"].is_string())
        return bad(where + ".call_id", where + ".call_id must be a string");
      if (!item.contains("output")) return bad(where + ".output", where + ".output is required");
      std::string text;
      if (auto e = content_text(item["output"], where + ".output", &text)) return e;
      messages->push_back({{"role", "tool"}, {"tool_call_id", item["call_id"]}, {"content", text}});
    } else if (type == "reasoning") {
      // The model's earlier reasoning goes back as the next assistant turn's reasoning_content
      // (templates that render it, as Qwen3's for the last turn, see it; others drop it).
      std::string text;
      if (auto c = item.find("content"); c != item.end() && c->is_array()) {
        for (const json& part : *c)
          if (part.is_object() && part.contains("text") && part["text"].is_string())
            text += part["text"].get<std::string>();
      }
      if (item.contains("encrypted_content") && !item["encrypted_content"].is_null())
        return bad(where + ".encrypted_content",
                   where +
                       ".encrypted_content: this server gives no encrypted reasoning; send the reasoning "
                       "item as it came (its content)");
      reasoning += text;
    } else {
      return bad(where + ".type", where + ".type '" + type +
                                      "' is not supported (message, function_call, function_call_output and "
                                      "reasoning items are)");
    }
    items->push_back(std::move(copy));
  }
  return std::nullopt;
}

std::optional<ApiError> read_tools(const json& body, json* chat, json* echo) {
  if (auto t = body.find("tools"); t != body.end() && !t->is_null()) {
    if (!t->is_array()) return bad("tools", "'tools' must be an array");
    json tools = json::array();
    for (size_t i = 0; i < t->size(); ++i) {
      const json& tool = (*t)[i];
      const std::string where = "tools[" + std::to_string(i) + "]";
      if (!tool.is_object() || !tool.contains("type") || !tool["type"].is_string())
        return bad(where + ".type", where + " must be an object with a type");
      const std::string type = tool["type"].get<std::string>();
      if (type != "function")
        return bad(where + ".type", where + ".type '" + type +
                                        "' is a built-in tool this server does not run: only function tools");
      json function = json::object();
      for (const auto& [key, value] : tool.items()) {
        if (key == "type") continue;
        if (key != "name" && key != "description" && key != "parameters" && key != "strict")
          return bad(where + "." + key, "unknown field '" + key + "' in " + where);
        if (!value.is_null()) function[key] = value;
      }
      tools.push_back({{"type", "function"}, {"function", function}});
    }
    (*chat)["tools"] = std::move(tools);
    (*echo)["tools"] = *t;
  }
  if (auto c = body.find("tool_choice"); c != body.end() && !c->is_null()) {
    if (c->is_string()) {
      (*chat)["tool_choice"] = *c;
    } else if (c->is_object() && c->value("type", "") == "function" && c->contains("name") &&
               (*c)["name"].is_string()) {
      (*chat)["tool_choice"] = {{"type", "function"}, {"function", {{"name", (*c)["name"]}}}};
    } else {
      return bad("tool_choice",
                 "'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", "
                 "\"name\": ...}");
    }
    (*echo)["tool_choice"] = *c;
  }
  if (auto p = body.find("parallel_tool_calls"); p != body.end() && !p->is_null()) {
    (*chat)["parallel_tool_calls"] = *p;
    (*echo)["parallel_tool_calls"] = *p;
  }
  return std::nullopt;
}

// text.format -> response_format; reasoning.effort -> reasoning_effort.
std::optional<ApiError> read_text_and_reasoning(const json& body, json* chat, json* echo) {
  if (auto t = body.find("text"); t != body.end() && !t->is_null()) {
    if (!t->is_object()) return bad("text", "'text' must be an object");
    for (const auto& [key, value] : t->items()) {
      if (key == "verbosity") {
        if (!value.is_null() && value != "medium")
          return bad("text.verbosity", "'text.verbosity' other than \"medium\" is not supported");
      } else if (key != "format") {
        return bad("text." + key, "unknown field 'text." + key + "'");
      }
    }
    if (auto f = t->find("format"); f != t->end() && !f->is_null()) {
      const std::string type = f->is_object() ? f->value("type", "") : "";
      if (type == "json_schema") {
        json schema = json::object();
        for (const auto& [key, value] : f->items())
          if (key != "type") schema[key] = value;
        (*chat)["response_format"] = {{"type", "json_schema"}, {"json_schema", schema}};
      } else if (type == "json_object") {
        (*chat)["response_format"] = {{"type", "json_object"}};
      } else if (type != "text") {
        return bad("text.format", "'text.format.type' must be text, json_object or json_schema");
      }
      (*echo)["text"]["format"] = *f;
    }
  }
  if (auto r = body.find("reasoning"); r != body.end() && !r->is_null()) {
    if (!r->is_object()) return bad("reasoning", "'reasoning' must be an object");
    for (const auto& [key, value] : r->items()) {
      if (value.is_null()) continue;
      if (key == "effort") {
        (*chat)["reasoning_effort"] = value;
      } else if (key == "summary" || key == "generate_summary") {
        if (value != "auto")
          return bad(
              "reasoning." + key,
              "'reasoning." + key +
                  "': this server does not summarize reasoning (the reasoning item carries the model's "
                  "reasoning text); give \"auto\" or null");
      } else {
        return bad("reasoning." + key, "unknown field 'reasoning." + key + "'");
      }
    }
    (*echo)["reasoning"] = {{"effort", r->value("effort", json())}, {"summary", r->value("summary", json())}};
  }
  return std::nullopt;
}

// Fields whose only accepted values change nothing here.
std::optional<ApiError> read_settings(const json& body, ResponsesRequest* out, json* chat) {
  for (const auto& [key, value] : body.items()) {
    if (value.is_null() || listed(kResponsesFields, key)) continue;
    if (listed(kPassedFields, key)) {
      (*chat)[key] = value;
      continue;
    }
    return bad(key, "unknown or unsupported field '" + key + "' for responses");
  }
  auto flag = [&](const char* key, bool fallback, bool* v) -> std::optional<ApiError> {
    *v = fallback;
    if (auto f = body.find(key); f != body.end() && !f->is_null()) {
      if (!f->is_boolean()) return bad(key, std::string("'") + key + "' must be a boolean");
      *v = f->get<bool>();
    }
    return std::nullopt;
  };
  if (auto e = flag("stream", false, &out->stream)) return e;
  if (auto e = flag("store", true, &out->store)) return e;
  bool background = false;
  if (auto e = flag("background", false, &background)) return e;
  if (background)
    return bad("background", "'background' responses are not supported: stream, or wait for the answer");
  if (auto t = body.find("truncation"); t != body.end() && !t->is_null() && *t != "disabled")
    return bad("truncation", "'truncation' must be \"disabled\": an input past the context window is a 400");
  if (auto s = body.find("service_tier"); s != body.end() && !s->is_null() && *s != "auto" && *s != "default")
    return bad("service_tier", "'service_tier' must be \"auto\" or \"default\" (use priority or slo_class)");
  if (auto s = body.find("stream_options"); s != body.end() && !s->is_null()) {
    if (!out->stream) return bad("stream_options", "'stream_options' needs 'stream'");
    for (const auto& [key, value] : s->items())
      if (key != "include_obfuscation")
        return bad("stream_options." + key, "unknown field 'stream_options." + key + "'");
  }
  if (auto m = body.find("max_tool_calls"); m != body.end() && !m->is_null() && !m->is_number_integer())
    return bad("max_tool_calls", "'max_tool_calls' must be an integer");
  if (auto inc = body.find("include"); inc != body.end() && !inc->is_null()) {
    if (!inc->is_array()) return bad("include", "'include' must be an array");
    for (const json& v : *inc) {
      if (v != "message.output_text.logprobs")
        return bad("include", "'include' may name message.output_text.logprobs only (got " + v.dump() + ")");
      out->logprobs = true;
    }
  }
  if (auto k = body.find("top_logprobs"); k != body.end() && !k->is_null()) {
    (*chat)["top_logprobs"] = *k;
    if (k->is_number_integer() && k->get<int64_t>() > 0) out->logprobs = true;
  }
  if (out->logprobs) (*chat)["logprobs"] = true;
  for (const char* key : {"model", "temperature", "top_p", "user"})
    if (auto v = body.find(key); v != body.end() && !v->is_null()) (*chat)[key] = *v;
  if (auto v = body.find("max_output_tokens"); v != body.end() && !v->is_null())
    (*chat)["max_completion_tokens"] = *v;
  if (auto v = body.find("metadata"); v != body.end() && !v->is_null() && !v->is_object())
    return bad("metadata", "'metadata' must be an object of strings");
  (*chat)["stream"] = out->stream;
  return std::nullopt;
}

}  // namespace

ParsedResponses parse_responses_request(std::string_view body, const ConversationLookup& previous) {
  ParsedResponses out;
  auto fail = [&](ApiError e) {
    out.error = std::move(e);
    return std::move(out);
  };
  if (json_nests_deeper_than(body)) return fail(bad("", "the body nests JSON too deeply"));
  json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return fail(bad("", "the body must be a JSON object"));
  ResponsesRequest r;
  json chat = json::object();
  json echo = {{"instructions", nullptr},
               {"max_output_tokens", nullptr},
               {"metadata", json::object()},
               {"parallel_tool_calls", true},
               {"previous_response_id", nullptr},
               {"reasoning", {{"effort", nullptr}, {"summary", nullptr}}},
               {"temperature", nullptr},
               {"text", {{"format", {{"type", "text"}}}}},
               {"tool_choice", "auto"},
               {"tools", json::array()},
               {"top_logprobs", 0},
               {"top_p", nullptr},
               {"truncation", "disabled"},
               {"user", nullptr},
               {"background", false},
               {"service_tier", "default"}};
  if (auto e = read_settings(j, &r, &chat)) return fail(*e);
  if (auto e = read_tools(j, &chat, &echo)) return fail(*e);
  if (auto e = read_text_and_reasoning(j, &chat, &echo)) return fail(*e);
  for (const char* key : {"max_output_tokens", "metadata", "temperature", "top_p", "top_logprobs", "user"})
    if (auto v = j.find(key); v != j.end() && !v->is_null()) echo[key] = *v;
  echo["store"] = r.store;

  json messages = json::array();
  if (auto ins = j.find("instructions"); ins != j.end() && !ins->is_null()) {
    if (!ins->is_string()) return fail(bad("instructions", "'instructions' must be a string"));
    messages.push_back({{"role", "system"}, {"content", *ins}});
    echo["instructions"] = *ins;
  }
  r.history = json::array();
  if (auto p = j.find("previous_response_id"); p != j.end() && !p->is_null()) {
    if (!p->is_string()) return fail(bad("previous_response_id", "'previous_response_id' must be a string"));
    std::optional<json> conversation = previous ? previous(p->get<std::string>()) : std::nullopt;
    if (!conversation)
      return fail(bad("previous_response_id", "previous response with id '" + p->get<std::string>() +
                                                  "' not found (responses are kept when stored, the newest "
                                                  "--max-stored-responses of them)"));
    r.history = std::move(*conversation);
    echo["previous_response_id"] = *p;
  }
  for (const json& m : r.history) messages.push_back(m);
  const auto input = j.find("input");
  if (input == j.end() || input->is_null()) return fail(bad("input", "'input' is required"));
  r.input_messages = json::array();
  r.input_items = json::array();
  if (auto e = read_input(*input, &r.input_messages, &r.input_items)) return fail(*e);
  for (const json& m : r.input_messages) messages.push_back(m);
  if (messages.empty()) return fail(bad("input", "'input' has no items"));
  chat["messages"] = std::move(messages);
  r.echo = std::move(echo);

  ParsedRequest parsed =
      parse_generate_request(ApiEndpoint::kChat, chat.dump(-1, ' ', false, json::error_handler_t::replace));
  if (!parsed.request) return fail(responses_error(parsed.error));
  r.generate = std::move(*parsed.request);
  out.request = std::move(r);
  return out;
}

ApiError responses_error(ApiError e) {
  static const std::pair<std::string_view, std::string_view> kNames[] = {
      {"max_completion_tokens", "max_output_tokens"},
      {"max_tokens", "max_output_tokens"},
      {"response_format", "text.format"},
      {"reasoning_effort", "reasoning.effort"},
      {"messages", "input"},
      {"logprobs", "include"}};
  for (const auto& [from, to] : kNames) {
    if (e.param.rfind(from, 0) == 0 &&
        (e.param.size() == from.size() || e.param[from.size()] == '[' || e.param[from.size()] == '.')) {
      // messages[i] do not map one to one onto input items: name the input as a whole.
      e.param = from == "messages" ? std::string(to) : std::string(to) + e.param.substr(from.size());
    }
    std::string quoted(1, '\'');
    quoted.append(from);
    quoted.push_back('\'');
    for (size_t at = e.message.find(quoted); at != std::string::npos;
         at = e.message.find(quoted, at + to.size() + 2))
      e.message.replace(at + 1, from.size(), to);
  }
  // tools[i].function.x -> tools[i].x (Responses tools are flat).
  if (e.param.rfind("tools[", 0) == 0) {
    if (size_t f = e.param.find("].function"); f != std::string::npos) e.param.erase(f + 1, 9);
  }
  return e;
}

// ---- the answer ---------------------------------------------------------------------------------

ResponsesAnswer::ResponsesAnswer(std::string id, int64_t created, std::string model,
                                 const ResponsesRequest& request, const Tokenizer* tokenizer)
    : id_(std::move(id)), model_(std::move(model)), tokenizer_(tokenizer), logprobs_(request.logprobs) {
  response_ = request.echo;
  response_["id"] = id_;
  response_["object"] = "response";
  response_["created_at"] = created;
  response_["model"] = model_;
  response_["status"] = "in_progress";
  response_["error"] = nullptr;
  response_["incomplete_details"] = nullptr;
  response_["output"] = json::array();
  response_["usage"] = nullptr;
}

std::string ResponsesAnswer::event(const char* type, json fields) {
  fields["type"] = type;
  fields["sequence_number"] = sequence_++;
  return std::string("event: ") + type +
         "\ndata: " + fields.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
}

std::string ResponsesAnswer::created_events() {
  std::string out = event("response.created", {{"response", response_}});
  return out + event("response.in_progress", {{"response", response_}});
}

json ResponsesAnswer::logprob_entries(const std::vector<TokenLogprob>& entries) const {
  json out = json::array();
  for (const TokenLogprob& e : entries) {
    json entry = token_logprob_json(tokenizer_, e.token, e.logprob);
    json top = json::array();
    for (const auto& [id, lp] : e.top) top.push_back(token_logprob_json(tokenizer_, id, lp));
    entry["top_logprobs"] = std::move(top);
    out.push_back(std::move(entry));
  }
  return out;
}

json ResponsesAnswer::item_json(const Item& item) const {
  const char* status = item.done ? "completed" : "in_progress";
  switch (item.kind) {
    case Kind::kReasoning: {
      json content = json::array();
      if (item.done) content.push_back({{"type", "reasoning_text"}, {"text", item.text}});
      return {{"id", item.id},
              {"type", "reasoning"},
              {"summary", json::array()},
              {"content", content},
              {"status", status}};
    }
    case Kind::kMessage: {
      json content = json::array();
      if (item.done) {
        json part = {{"type", "output_text"}, {"text", item.text}, {"annotations", json::array()}};
        if (logprobs_) part["logprobs"] = item.logprobs;
        content.push_back(std::move(part));
      }
      return {{"id", item.id},
              {"type", "message"},
              {"status", status},
              {"role", "assistant"},
              {"content", content}};
    }
    case Kind::kCall:
      return {{"id", item.id},           {"type", "function_call"}, {"status", status},
              {"call_id", item.call_id}, {"name", item.name},       {"arguments", item.text}};
  }
  return json::object();
}

std::string ResponsesAnswer::open(Kind kind, std::string call_id, std::string name, int32_t call_index) {
  std::string out = close();
  Item item;
  item.kind = kind;
  item.id = random_id(kind == Kind::kReasoning ? "rs_" : kind == Kind::kMessage ? "msg_" : "fc_");
  item.call_id = std::move(call_id);
  item.name = std::move(name);
  item.call_index = call_index;
  items_.push_back(std::move(item));
  const size_t index = items_.size() - 1;
  out += event("response.output_item.added", {{"output_index", index}, {"item", item_json(items_.back())}});
  if (kind == Kind::kReasoning) {
    out += event("response.content_part.added", {{"item_id", items_.back().id},
                                                 {"output_index", index},
                                                 {"content_index", 0},
                                                 {"part", {{"type", "reasoning_text"}, {"text", ""}}}});
  } else if (kind == Kind::kMessage) {
    json part = {{"type", "output_text"}, {"text", ""}, {"annotations", json::array()}};
    if (logprobs_) part["logprobs"] = json::array();
    out +=
        event("response.content_part.added",
              {{"item_id", items_.back().id}, {"output_index", index}, {"content_index", 0}, {"part", part}});
  }
  return out;
}

std::string ResponsesAnswer::close() {
  if (items_.empty() || items_.back().done) return {};
  Item& item = items_.back();
  item.done = true;
  const size_t index = items_.size() - 1;
  const json where = {{"item_id", item.id}, {"output_index", index}};
  std::string out;
  if (item.kind == Kind::kCall) {
    json f = where;
    f["arguments"] = item.text;
    f["name"] = item.name;
    out += event("response.function_call_arguments.done", std::move(f));
  } else {
    const json part = item_json(item)["content"][0];
    json f = where;
    f["content_index"] = 0;
    f["text"] = item.text;
    if (item.kind == Kind::kMessage) {
      if (logprobs_) f["logprobs"] = item.logprobs;
      out += event("response.output_text.done", f);
    } else {
      out += event("response.reasoning_text.done", f);
    }
    f.erase("text");
    f.erase("logprobs");
    f["part"] = part;
    out += event("response.content_part.done", std::move(f));
  }
  out += event("response.output_item.done", {{"output_index", index}, {"item", item_json(item)}});
  return out;
}

std::string ResponsesAnswer::apply(const ChoiceDelta& d) {
  std::string out;
  json lps = logprobs_ ? logprob_entries(d.logprobs) : json::array();
  auto open_kind = [&](Kind k) { return !items_.empty() && !items_.back().done && items_.back().kind == k; };
  if (!d.reasoning.empty()) {
    if (!open_kind(Kind::kReasoning)) out += open(Kind::kReasoning);
    Item& item = items_.back();
    item.text += d.reasoning;
    out += event("response.reasoning_text.delta", {{"item_id", item.id},
                                                   {"output_index", items_.size() - 1},
                                                   {"content_index", 0},
                                                   {"delta", d.reasoning}});
    if (d.content.empty()) reasoning_tokens_ += static_cast<int64_t>(d.tokens.size());
  }
  // Logprobs go with the message's text: a delta's tokens with its content, tokens that produced
  // no text yet (held back by the detokenizer or a stop string's prefix) with the next content.
  for (json& e : lps) held_logprobs_.push_back(std::move(e));
  if (!d.content.empty()) {
    if (!open_kind(Kind::kMessage) && is_space(held_space_ + d.content)) {
      held_space_ += d.content;  // whitespace before a tool call is no message
    } else {
      std::string text = d.content;
      if (!open_kind(Kind::kMessage)) {
        out += open(Kind::kMessage);
        text = held_space_ + text;
        held_space_.clear();
      }
      Item& item = items_.back();
      item.text += text;
      json f = {
          {"item_id", item.id}, {"output_index", items_.size() - 1}, {"content_index", 0}, {"delta", text}};
      if (logprobs_) f["logprobs"] = held_logprobs_;
      for (json& e : held_logprobs_) item.logprobs.push_back(std::move(e));
      held_logprobs_ = json::array();
      out += event("response.output_text.delta", std::move(f));
    }
  } else if (!d.reasoning.empty()) {
    held_logprobs_ = json::array();  // reasoning tokens: reasoning text has no logprobs
  }
  for (const ToolCallDelta& t : d.tool_calls) {
    if (t.name) {
      held_space_.clear();
      out += open(Kind::kCall, t.id.value_or(random_id("call_")), *t.name, t.index);
    }
    if (t.arguments.empty()) continue;
    for (size_t i = items_.size(); i-- > 0;) {
      Item& item = items_[i];
      if (item.kind != Kind::kCall || item.call_index != t.index) continue;
      item.text += t.arguments;
      if (!item.done)
        out += event("response.function_call_arguments.delta",
                     {{"item_id", item.id}, {"output_index", i}, {"delta", t.arguments}});
      break;
    }
  }
  return out;
}

std::string ResponsesAnswer::finish(const OutputProcessor& choice, int64_t input_tokens) {
  std::string out;
  if (items_.empty() || !held_space_.empty()) {  // an answer of whitespace, or none: one message
    const bool message_open = !items_.empty() && !items_.back().done && items_.back().kind == Kind::kMessage;
    if (!message_open && (items_.empty() || std::none_of(items_.begin(), items_.end(), [](const Item& i) {
                            return i.kind == Kind::kMessage || i.kind == Kind::kCall;
                          }))) {
      out += open(Kind::kMessage);
      items_.back().text = held_space_;
      if (!held_space_.empty())
        out += event("response.output_text.delta", {{"item_id", items_.back().id},
                                                    {"output_index", items_.size() - 1},
                                                    {"content_index", 0},
                                                    {"delta", held_space_}});
    }
    held_space_.clear();
  }
  if (!items_.empty() && !items_.back().done && items_.back().kind == Kind::kMessage) {
    for (json& e : held_logprobs_) items_.back().logprobs.push_back(std::move(e));
    held_logprobs_ = json::array();
  }
  out += close();
  // The parser's calls are the complete, well-formed ones: their arguments are final.
  for (Item& item : items_) {
    if (item.kind != Kind::kCall) continue;
    for (const ToolCall& c : choice.tool_calls())
      if (c.id == item.call_id) item.text = c.arguments;
  }
  json output = json::array();
  for (const Item& item : items_) output.push_back(item_json(item));
  const bool incomplete = choice.finish_reason() == FinishReason::kLength;
  response_["status"] = incomplete ? "incomplete" : "completed";
  if (incomplete) response_["incomplete_details"] = {{"reason", "max_output_tokens"}};
  response_["output"] = std::move(output);
  const auto output_tokens = static_cast<int64_t>(choice.token_ids().size());
  response_["usage"] = {{"input_tokens", input_tokens},
                        {"input_tokens_details", {{"cached_tokens", choice.cached_tokens()}}},
                        {"output_tokens", output_tokens},
                        {"output_tokens_details", {{"reasoning_tokens", reasoning_tokens_}}},
                        {"total_tokens", input_tokens + output_tokens}};
  out += event(incomplete ? "response.incomplete" : "response.completed", {{"response", response_}});
  return out;
}

std::string ResponsesAnswer::failed_event(const std::string& message, bool internal) {
  response_["status"] = "failed";
  response_["error"] = {{"code", internal ? "server_error" : "invalid_prompt"}, {"message", message}};
  return event("response.failed", {{"response", response_}});
}

json ResponsesAnswer::assistant_message() const {
  json m = {{"role", "assistant"}, {"content", nullptr}};
  std::string text, reasoning;
  json calls = json::array();
  for (const Item& item : items_) {
    if (item.kind == Kind::kMessage) text += item.text;
    if (item.kind == Kind::kReasoning) reasoning += item.text;
    if (item.kind == Kind::kCall)
      calls.push_back({{"id", item.call_id},
                       {"type", "function"},
                       {"function", {{"name", item.name}, {"arguments", item.text}}}});
  }
  if (!text.empty() || calls.empty()) m["content"] = text;
  if (!reasoning.empty()) m["reasoning_content"] = reasoning;
  if (!calls.empty()) m["tool_calls"] = std::move(calls);
  return m;
}

// ---- the store ----------------------------------------------------------------------------------

void ResponseStore::put(const std::string& id, json response, json conversation, json input_items) {
  if (capacity_ == 0) return;
  std::lock_guard<std::mutex> lock(mutex_);
  if (entries_.find(id) == entries_.end()) order_.push_back(id);
  entries_[id] = Entry{std::move(response), std::move(conversation), std::move(input_items)};
  while (entries_.size() > capacity_ && !order_.empty()) {
    entries_.erase(order_.front());
    order_.pop_front();
  }
  // Ids of erased entries linger in order_; keep it from growing past twice the capacity.
  if (order_.size() > 2 * capacity_) {
    std::deque<std::string> live;
    for (std::string& k : order_)
      if (entries_.count(k) != 0) live.push_back(std::move(k));
    order_ = std::move(live);
  }
}

std::optional<json> ResponseStore::response(const std::string& id) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = entries_.find(id);
  if (it == entries_.end()) return std::nullopt;
  return it->second.response;
}

std::optional<json> ResponseStore::conversation(const std::string& id) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = entries_.find(id);
  if (it == entries_.end()) return std::nullopt;
  return it->second.conversation;
}

std::optional<json> ResponseStore::input_items(const std::string& id) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = entries_.find(id);
  if (it == entries_.end()) return std::nullopt;
  return it->second.input_items;
}

bool ResponseStore::erase(const std::string& id) {
  std::lock_guard<std::mutex> lock(mutex_);
  return entries_.erase(id) != 0;
}

size_t ResponseStore::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return entries_.size();
}

}  // namespace inferd
