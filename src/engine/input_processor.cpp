#include "engine/input_processor.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <string_view>

#include "common/text.h"
#include "tokenizer/chat_encoder.h"

namespace inferd {

namespace {

InputError invalid(std::string field, std::string message) {
  return InputError{InputError::Kind::kInvalid, std::move(field), std::move(message)};
}

// Whether the rendered prompt ends in "<think>" (after trailing whitespace): the template opened
// the reasoning block itself, so the output starts inside it.
bool opens_think(const std::string& text) {
  constexpr std::string_view kOpen = "<think>";
  const size_t last = text.find_last_not_of(" \t\r\n");
  return last != std::string::npos && last + 1 >= kOpen.size() &&
         text.compare(last + 1 - kOpen.size(), kOpen.size(), kOpen) == 0;
}

// Token ids space-separated: the text of a model without a tokenizer (as OutputProcessor writes it).
std::string ids_text(const std::vector<int32_t>& ids) {
  std::string text;
  for (int32_t id : ids) text.append(text.empty() ? "" : " ").append(std::to_string(id));
  return text;
}

// The model's fill-in-the-middle tokens (prefix, suffix, middle): Qwen2.5-Coder's <|fim_*|> or
// StarCoder's <fim_*>, as added tokens of its vocabulary; none when it has no complete set.
std::optional<std::array<int32_t, 3>> fim_tokens(const Vocab& v) {
  using Names = std::array<std::string_view, 3>;
  for (const Names& names : {Names{"<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"},
                             Names{"<fim_prefix>", "<fim_suffix>", "<fim_middle>"}}) {
    std::array<int32_t, 3> ids{-1, -1, -1};
    for (const AddedToken& t : v.added_tokens) {
      for (size_t k = 0; k < 3; ++k) {
        if (t.content == names[k]) ids[k] = t.id;
      }
    }
    if (ids[0] >= 0 && ids[1] >= 0 && ids[2] >= 0) return ids;
  }
  return std::nullopt;
}

bool is_function_name(const std::string& name) {
  if (name.empty() || name.size() > 64) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
  });
}

// OpenAI's tool list: [{"type": "function", "function": {"name", "description"?, "parameters"?,
// "strict"?}}], names unique. The first fault, naming where it is.
std::optional<InputError> check_tool_list(const nlohmann::ordered_json& tools) {
  if (!tools.is_array()) return invalid("tools", "'tools' must be an array");
  std::vector<std::string> names;
  for (size_t i = 0; i < tools.size(); ++i) {
    const auto& t = tools[i];
    const std::string where = "tools[" + std::to_string(i) + "]";
    if (!t.is_object() || t.value("type", "") != "function")
      return invalid(where, where + " must be {\"type\": \"function\", \"function\": {...}}");
    auto f = t.find("function");
    if (f == t.end() || !f->is_object())
      return invalid(where + ".function", where + ".function must be an object");
    auto name = f->find("name");
    if (name == f->end() || !name->is_string() || !is_function_name(name->get<std::string>()))
      return invalid(where + ".function.name",
                     where + ".function.name must be 1-64 letters, digits, underscores or dashes");
    if (std::find(names.begin(), names.end(), name->get<std::string>()) != names.end())
      return invalid(where + ".function.name",
                     "the function name '" + name->get<std::string>() + "' is repeated");
    names.push_back(name->get<std::string>());
    if (auto d = f->find("description"); d != f->end() && !d->is_string() && !d->is_null())
      return invalid(where + ".function.description", where + ".function.description must be a string");
    if (auto p = f->find("parameters"); p != f->end() && !p->is_object() && !p->is_null())
      return invalid(where + ".function.parameters",
                     where + ".function.parameters must be a JSON schema object");
    if (auto st = f->find("strict"); st != f->end() && !st->is_boolean() && !st->is_null())
      return invalid(where + ".function.strict", where + ".function.strict must be a boolean");
  }
  return std::nullopt;
}

// The conversation as templates expect it: an assistant's tool call arguments, a JSON string in
// OpenAI's API, become the object they encode (Qwen's and Llama's templates apply tojson).
Expected<nlohmann::ordered_json> template_messages(const nlohmann::ordered_json& messages) {
  nlohmann::ordered_json out = messages;
  for (size_t i = 0; i < out.size(); ++i) {
    auto calls = out[i].find("tool_calls");
    if (calls == out[i].end() || calls->is_null()) continue;
    const std::string where = "messages[" + std::to_string(i) + "].tool_calls";
    if (!calls->is_array()) return invalid_argument(where + " must be an array");
    for (size_t k = 0; k < calls->size(); ++k) {
      auto& call = (*calls)[k];
      auto f = call.is_object() ? call.find("function") : call.end();
      if (f == call.end() || !f->is_object() || !f->contains("name") || !(*f)["name"].is_string())
        return invalid_argument(where + "[" + std::to_string(k) + "] needs a function with a name");
      auto args = f->find("arguments");
      if (args == f->end() || !args->is_string()) continue;
      if (json_nests_deeper_than(args->get_ref<const std::string&>()))
        return invalid_argument(where + "[" + std::to_string(k) + "].function.arguments nests deeper than " +
                                std::to_string(kMaxJsonDepth) + " levels");
      auto parsed = nlohmann::ordered_json::parse(args->get<std::string>(), nullptr, false);
      if (parsed.is_discarded() || !parsed.is_object())
        return invalid_argument(where + "[" + std::to_string(k) +
                                "].function.arguments must be a JSON object");
      *args = std::move(parsed);
    }
  }
  return out;
}

}  // namespace

InputProcessor::InputProcessor(const Tokenizer* tokenizer, const ChatTemplate* chat_template,
                               InputLimits limits)
    : tokenizer_(tokenizer), chat_template_(chat_template), limits_(limits) {}

std::optional<InputError> InputProcessor::check_fields(const GenerationRequest& r) const {
  if (auto e = r.sampling.check()) return invalid(e->field, e->message);
  if (r.n < 1 || r.n > kMaxSamples)
    return invalid("n", "'n' must be in [1, " + std::to_string(kMaxSamples) + "]");
  if (r.max_tokens && *r.max_tokens < 1) return invalid("max_tokens", "'max_tokens' must be at least 1");
  if (r.streaming.enabled() && r.streaming.sink_tokens + r.streaming.window_tokens > limits_.max_model_len)
    return invalid("streaming_llm",
                   "'streaming_llm' sink_tokens + window_tokens exceed the context window of " +
                       std::to_string(limits_.max_model_len));
  for (const auto& s : r.stop) {
    if (s.empty()) return invalid("stop", "'stop' strings must not be empty");
  }
  for (int32_t t : r.stop_token_ids) {
    if (t < 0 || t >= limits_.vocab_size)
      return invalid("stop_token_ids", "'stop_token_ids' has " + std::to_string(t) +
                                           ", outside the vocabulary of " +
                                           std::to_string(limits_.vocab_size));
  }
  for (const auto& [id, bias] : r.sampling.logit_bias) {
    if (id >= limits_.vocab_size)
      return invalid("logit_bias", "'logit_bias' has token " + std::to_string(id) +
                                       ", outside the vocabulary of " + std::to_string(limits_.vocab_size));
  }
  if (r.max_tokens && r.sampling.min_tokens > *r.max_tokens)
    return invalid("min_tokens", "'min_tokens' (" + std::to_string(r.sampling.min_tokens) +
                                     ") must not exceed max_tokens (" + std::to_string(*r.max_tokens) + ")");
  for (int32_t id : r.sampling.allowed_token_ids) {
    if (id >= limits_.vocab_size)
      return invalid("allowed_token_ids", "'allowed_token_ids' has token " + std::to_string(id) +
                                              ", outside the vocabulary of " +
                                              std::to_string(limits_.vocab_size));
  }
  for (const std::string& w : r.bad_words) {
    if (w.find_first_not_of(" \t\r\n") == std::string::npos)
      return invalid("bad_words", "'bad_words' entries must not be empty or blank");
  }
  if (r.suffix && !r.messages.is_null()) return invalid("suffix", "'suffix' is for completions (a prompt)");
  if (r.messages.is_null() && (r.add_generation_prompt || r.continue_final_message))
    return invalid(r.continue_final_message ? "continue_final_message" : "add_generation_prompt",
                   "'add_generation_prompt' and 'continue_final_message' are for chat (messages)");
  if (r.continue_final_message && r.add_generation_prompt.value_or(false))
    return invalid("continue_final_message",
                   "'continue_final_message' and 'add_generation_prompt' cannot both be true");
  if (r.truncate_prompt_tokens && *r.truncate_prompt_tokens != -1 &&
      (*r.truncate_prompt_tokens < 1 || *r.truncate_prompt_tokens > limits_.max_model_len))
    return invalid("truncate_prompt_tokens",
                   "'truncate_prompt_tokens' must be -1 (the context window) or in [1, " +
                       std::to_string(limits_.max_model_len) + "]");
  if (r.best_of && (*r.best_of < r.n || *r.best_of > kMaxSamples))
    return invalid("best_of", "'best_of' must be in [n, " + std::to_string(kMaxSamples) + "] (n is " +
                                  std::to_string(r.n) + ")");
  if (auto e = check_beam_search(r)) return e;
  if (r.sampling.prompt_logprobs && r.best_of.value_or(1) != 1)
    return invalid("best_of", "'best_of' must be 1 with prompt_logprobs (or echo with logprobs)");
  if (r.sampling.prompt_logprobs && r.n != 1)
    return invalid("prompt_logprobs", "'prompt_logprobs' (or echo with logprobs) needs n = 1");
  if (r.echo && !r.messages.is_null()) return invalid("echo", "'echo' is for completions (a prompt)");
  if (r.messages.is_null() && (r.chat_template || !r.documents.is_null() || r.reasoning_effort))
    return invalid(
        r.chat_template ? "chat_template" : (r.reasoning_effort ? "reasoning_effort" : "documents"),
        "'chat_template', 'documents' and 'reasoning_effort' are for chat (messages)");
  if (!r.documents.is_null()) {
    auto strings = [](const auto& d) {
      return d.is_object() && std::all_of(d.begin(), d.end(), [](const auto& v) { return v.is_string(); });
    };
    if (!r.documents.is_array() || !std::all_of(r.documents.begin(), r.documents.end(), strings))
      return invalid("documents", "'documents' must be a list of objects of strings (e.g. title, text)");
  }
  if (r.reasoning_effort) {
    static constexpr std::string_view kEfforts[] = {"none", "minimal", "low", "medium", "high", "xhigh"};
    if (std::find(std::begin(kEfforts), std::end(kEfforts), *r.reasoning_effort) == std::end(kEfforts))
      return invalid("reasoning_effort",
                     "'reasoning_effort' must be one of none, minimal, low, medium, high, xhigh");
  }
  if (!r.chat_template_kwargs.is_null() && !r.chat_template_kwargs.is_object())
    return invalid("chat_template_kwargs", "'chat_template_kwargs' must be an object");
  if (r.messages.is_null() && r.prompts.empty())
    return invalid("prompt", "a prompt or messages are required");
  if (r.messages.is_null() && (!r.tools.is_null() || r.tool_choice))
    return invalid("tools", "'tools' are for chat (messages)");
  if (auto e = check_tools(r)) return e;
  if (r.structured_output && r.ignore_eos)
    return invalid("ignore_eos",
                   "'ignore_eos' cannot go with an output constraint (it ends where the grammar does)");
  if (static_cast<int64_t>(r.prompts.size()) > limits_.max_prompts)
    return invalid("prompt", "the request has " + std::to_string(r.prompts.size()) + " prompts; at most " +
                                 std::to_string(limits_.max_prompts) + " are accepted in one request");
  return std::nullopt;
}

// Beam search ranks continuations by the model's own log-probabilities and samples nothing: a
// field that would shape sampling or the output's tokens is refused with it, not ignored.
std::optional<InputError> InputProcessor::check_beam_search(const GenerationRequest& r) const {
  if (!r.use_beam_search) {
    if (r.length_penalty) return invalid("length_penalty", "'length_penalty' is for use_beam_search");
    return std::nullopt;
  }
  if (r.length_penalty && !std::isfinite(*r.length_penalty))
    return invalid("length_penalty", "'length_penalty' must be a finite number");
  const SamplingParams& s = r.sampling;
  const SamplingParams plain;
  const std::pair<bool, const char*> conflicts[] = {
      {s.temperature != plain.temperature, "temperature"},
      {s.top_p != plain.top_p, "top_p"},
      {s.top_k != plain.top_k, "top_k"},
      {s.min_p != plain.min_p, "min_p"},
      {s.repetition_penalty != plain.repetition_penalty, "repetition_penalty"},
      {s.presence_penalty != plain.presence_penalty, "presence_penalty"},
      {s.frequency_penalty != plain.frequency_penalty, "frequency_penalty"},
      {!s.logit_bias.empty(), "logit_bias"},
      {s.min_tokens != 0, "min_tokens"},
      {!s.allowed_token_ids.empty(), "allowed_token_ids"},
      {!r.bad_words.empty(), "bad_words"},
      {s.prompt_logprobs.has_value(), "prompt_logprobs"},
      {r.best_of.has_value(), "best_of"},
      {!r.stop.empty(), "stop"},
      {r.structured_output.has_value(), r.structured_output ? r.structured_output->field.c_str() : ""},
      {r.tools.is_array() && !r.tools.empty(), "tools"},
      {r.streaming.enabled(), "streaming_llm"},
      {!r.session_id.empty(), "session_id"},
  };
  for (const auto& [set, field] : conflicts) {
    if (set)
      return invalid(field, std::string("'") + field +
                                "' cannot go with use_beam_search (beam search ranks by the model's own "
                                "log-probabilities and samples nothing)");
  }
  return std::nullopt;
}

std::optional<InputError> InputProcessor::check_tools(const GenerationRequest& r) const {
  const bool has_tools = !r.tools.is_null() && !(r.tools.is_array() && r.tools.empty());
  if (!r.tools.is_null()) {
    if (auto e = check_tool_list(r.tools)) return e;
  }
  if (!r.tool_choice) return std::nullopt;
  const ToolChoice& c = *r.tool_choice;
  if (c.kind != ToolChoice::Kind::kNone && !has_tools)
    return invalid("tool_choice", "'tool_choice' needs 'tools'");
  if (c.kind == ToolChoice::Kind::kNamed) {
    const bool found = std::any_of(r.tools.begin(), r.tools.end(),
                                   [&](const auto& t) { return t["function"]["name"] == c.name; });
    if (!found)
      return invalid("tool_choice", "'tool_choice' names '" + c.name + "', which is not in 'tools'");
  }
  return std::nullopt;
}

// Whether the model is offered the tools and its output parsed for calls (vLLM's rules: "auto"
// needs --enable-auto-tool-choice and a parser; "none" offers no tools, so the model writes a
// message). Sets out->tool_calls.
std::optional<InputError> InputProcessor::plan_tool_calls(const GenerationRequest& r,
                                                          ProcessedInput* out) const {
  const bool has_tools = r.tools.is_array() && !r.tools.empty();
  const ToolChoice::Kind kind =
      r.tool_choice ? r.tool_choice->kind : (has_tools ? ToolChoice::Kind::kAuto : ToolChoice::Kind::kNone);
  if (kind == ToolChoice::Kind::kNone) return std::nullopt;
  if (!limits_.tool_call_parser)
    return InputError{InputError::Kind::kUnsupported, "tools",
                      "tool calls need the server started with --tool-call-parser (hermes or llama3_json)"};
  if (kind == ToolChoice::Kind::kAuto && !limits_.enable_auto_tool_choice)
    return InputError{InputError::Kind::kUnsupported, "tool_choice",
                      "\"auto\" tool choice needs the server started with --enable-auto-tool-choice"};
  if (kind == ToolChoice::Kind::kRequired || kind == ToolChoice::Kind::kNamed) {
    // The grammar makes the output a valid call (of the named function) in the parser's format.
    if (r.structured_output)
      return invalid(r.structured_output->field,
                     "'" + r.structured_output->field + "' cannot go with a required tool call");
    if (r.ignore_eos)
      return invalid("ignore_eos",
                     "'ignore_eos' cannot go with a required tool call (it ends after the call)");
    const std::string name = kind == ToolChoice::Kind::kNamed ? r.tool_choice->name : std::string();
    // A named function is called once (as vLLM and OpenAI do); "required" may call several.
    auto gbnf =
        tool_call_gbnf(*limits_.tool_call_parser, r.tools, name, r.parallel_tool_calls && name.empty());
    if (!gbnf) return invalid("tools", gbnf.status().message());
    if (auto e = constrain("tools", grammars_.get({GrammarKind::kGbnf, *gbnf}), out)) return e;
  }
  out->tool_calls = limits_.tool_call_parser;
  out->max_tool_calls = r.parallel_tool_calls ? 128 : 1;
  return std::nullopt;
}

Expected<std::shared_ptr<const GrammarVocab>> InputProcessor::grammar_vocab() const {
  std::call_once(vocab_once_, [&] {
    if (tokenizer_ == nullptr) {
      vocab_ = Expected<std::shared_ptr<const GrammarVocab>>(
          unsupported("output constraints need the model's tokenizer"));
      return;
    }
    GrammarVocabSpec spec;
    spec.token_bytes.resize(static_cast<size_t>(tokenizer_->vocab_size()));
    for (int32_t id = 0; id < tokenizer_->vocab_size(); ++id) {
      spec.token_bytes[static_cast<size_t>(id)] = tokenizer_->token_bytes(id);
      if (tokenizer_->is_special(id)) spec.special_ids.push_back(id);
    }
    spec.end_ids = tokenizer_->vocab().stop_ids;
    if (const auto eos = tokenizer_->vocab().eos_id;
        eos && std::find(spec.end_ids.begin(), spec.end_ids.end(), *eos) == spec.end_ids.end())
      spec.end_ids.push_back(*eos);
    vocab_ = GrammarVocab::create(std::move(spec));
  });
  return *vocab_;
}

std::optional<InputError> InputProcessor::constrain(const std::string& field,
                                                    Expected<std::shared_ptr<const Grammar>> grammar,
                                                    ProcessedInput* out) const {
  if (!grammar) return invalid(field, grammar.status().message());
  auto vocab = grammar_vocab();
  if (!vocab) return InputError{InputError::Kind::kUnsupported, field, vocab.status().message()};
  out->grammar = GrammarConstraint{*grammar, *vocab};
  return std::nullopt;
}

std::optional<InputError> InputProcessor::plan_structured_output(const GenerationRequest& r,
                                                                 ProcessedInput* out) const {
  if (!r.structured_output) return std::nullopt;
  return constrain(r.structured_output->field, compile_structured_output(*r.structured_output, grammars_),
                   out);
}

std::optional<InputError> InputProcessor::render_chat(const GenerationRequest& r, bool offer_tools,
                                                      ChatPrompt* out) const {
  if (tokenizer_ == nullptr)
    return InputError{InputError::Kind::kUnsupported, "messages",
                      "the model has no tokenizer: give token ids instead of messages"};
  // The request's own template: chat_template, or chat_template_kwargs.chat_template (vLLM
  // takes either).
  std::optional<std::string> source = r.chat_template;
  const char* source_field = "chat_template";
  nlohmann::ordered_json kwargs = r.chat_template_kwargs;
  if (kwargs.is_object() && kwargs.contains("chat_template")) {
    if (source || !kwargs["chat_template"].is_string())
      return invalid("chat_template_kwargs",
                     source ? "'chat_template' is given twice (and in chat_template_kwargs)"
                            : "'chat_template_kwargs.chat_template' must be a string");
    source = kwargs["chat_template"].get<std::string>();
    source_field = "chat_template_kwargs";
    kwargs.erase("chat_template");
  }
  std::optional<ChatTemplate> own;
  if (source) {
    if (!limits_.trust_request_chat_template)
      return InputError{InputError::Kind::kUnsupported, source_field,
                        "a chat template in the request needs the server started with "
                        "--trust-request-chat-template"};
    auto compiled = ChatTemplate::compile(*source);
    if (!compiled) return invalid(source_field, compiled.status().message());
    own = std::move(*compiled);
  } else if (chat_template_ == nullptr) {
    return InputError{InputError::Kind::kUnsupported, "messages",
                      "the model has no chat template: give a prompt instead of messages"};
  }
  const ChatTemplate& chat_template = own ? *own : *chat_template_;
  // Variables only some templates read: one the template never names would change nothing.
  auto put = [&](const char* name, const nlohmann::ordered_json& value) -> std::optional<InputError> {
    if (!chat_template.mentions(name))
      return invalid(name, std::string("'") + name + "': the chat template does not use " + name);
    if (!kwargs.is_object()) kwargs = nlohmann::ordered_json::object();
    if (kwargs.contains(name))
      return invalid(name, std::string("'") + name + "' is given twice (and in chat_template_kwargs)");
    kwargs[name] = value;
    return std::nullopt;
  };
  if (!r.documents.is_null()) {
    if (auto e = put("documents", r.documents)) return e;
  }
  if (r.reasoning_effort) {
    if (auto e = put("reasoning_effort", *r.reasoning_effort)) return e;
  }
  ChatOptions chat_options = chat_options_for(r.add_generation_prompt, r.continue_final_message,
                                              r.add_special_tokens, std::move(kwargs));
  if (offer_tools) chat_options.tools = r.tools;
  auto messages = template_messages(r.messages);
  if (!messages) return invalid("messages", messages.status().message());
  auto chat = encode_chat(*tokenizer_, chat_template, *messages, chat_options);
  if (!chat) return invalid(source ? source_field : "messages", chat.status().message());
  *out = std::move(*chat);
  return std::nullopt;
}

std::optional<InputError> InputProcessor::tokenize(const GenerationRequest& r, ProcessedInput* out) const {
  std::vector<std::vector<int32_t>> prompts;
  const char* field = r.messages.is_null() ? "prompt" : "messages";
  if (!r.messages.is_null()) {
    ChatPrompt chat;
    if (auto e = render_chat(r, out->tool_calls.has_value(), &chat)) return e;
    out->prompt_opens_think = opens_think(chat.text);
    prompts.push_back(std::move(chat.ids));
  } else {
    for (const PromptInput& in : r.prompts) {
      if (in.is_ids) {
        if (r.suffix) return invalid("suffix", "'suffix' needs text prompts, not token ids");
        if (r.echo)
          out->echo.push_back(tokenizer_ != nullptr ? tokenizer_->decode(in.ids) : ids_text(in.ids) + " ");
        prompts.push_back(in.ids);
        continue;
      }
      if (r.echo) out->echo.push_back(in.text);
      if (tokenizer_ == nullptr)
        return InputError{InputError::Kind::kUnsupported, "prompt",
                          "the model has no tokenizer: give the prompt as token ids"};
      if (r.suffix) {  // fill in the middle: prefix, suffix, then the model writes the middle
        const auto fim = fim_tokens(tokenizer_->vocab());
        if (!fim)
          return InputError{InputError::Kind::kUnsupported, "suffix",
                            "'suffix' needs a model with fill-in-the-middle tokens (<|fim_prefix|>, "
                            "<|fim_suffix|>, <|fim_middle|> or <fim_prefix>, ...); this one has none"};
        const Vocab& v = tokenizer_->vocab();
        std::vector<int32_t> ids;
        if (r.add_special_tokens.value_or(true) && v.add_bos && v.bos_id) ids.push_back(*v.bos_id);
        ids.push_back((*fim)[0]);
        for (int32_t t : tokenizer_->encode(in.text, true)) ids.push_back(t);
        ids.push_back((*fim)[1]);
        for (int32_t t : tokenizer_->encode(*r.suffix, true)) ids.push_back(t);
        ids.push_back((*fim)[2]);
        prompts.push_back(std::move(ids));
        continue;
      }
      prompts.push_back(r.add_special_tokens.value_or(true) ? tokenizer_->encode_prompt(in.text, true)
                                                            : tokenizer_->encode(in.text, true));
    }
  }
  for (size_t p = 0; p < prompts.size(); ++p) {
    auto& ids = prompts[p];
    if (r.truncate_prompt_tokens) {  // left truncation: the prompt's last k tokens
      const int64_t keep =
          *r.truncate_prompt_tokens == -1 ? limits_.max_model_len : *r.truncate_prompt_tokens;
      if (static_cast<int64_t>(ids.size()) > keep) {
        ids.erase(ids.begin(), ids.end() - keep);
        if (p < out->echo.size())
          out->echo[p] = tokenizer_ != nullptr ? tokenizer_->decode(ids) : ids_text(ids) + " ";
      }
    }
    const auto len = static_cast<int64_t>(ids.size());
    if (len == 0) return invalid(field, "the prompt is empty");
    for (int32_t t : ids) {
      if (t < 0 || t >= limits_.vocab_size)
        return invalid(field, "token id " + std::to_string(t) + " is outside the vocabulary of " +
                                  std::to_string(limits_.vocab_size));
    }
    if (r.pooling != Pooling::kNone) {  // an embedding: the prompt alone, no output
      if (len > limits_.max_model_len)
        return InputError{InputError::Kind::kContextLength, r.messages.is_null() ? "input" : "messages",
                          "this model's maximum context length is " + std::to_string(limits_.max_model_len) +
                              " tokens, but the input has " + std::to_string(len) + " tokens"};
      RequestSpec spec;
      spec.prompt = std::move(ids);
      spec.limits.max_tokens = 0;  // pooling and normalization: process() sets them on every spec
      out->num_prompt_tokens += len;
      out->requests.push_back(std::move(spec));
      continue;
    }
    // A StreamingLLM window holds at most its sink and window: the prompt and the output may run
    // past the context (without max_tokens: up to a context's worth of output).
    const int64_t want = r.max_tokens.value_or(
        r.streaming.enabled() ? limits_.max_model_len : std::max<int64_t>(1, limits_.max_model_len - len));
    if (!r.streaming.enabled() && len + want > limits_.max_model_len)
      return InputError{InputError::Kind::kContextLength, r.max_tokens ? "max_tokens" : field,
                        "this model's maximum context length is " + std::to_string(limits_.max_model_len) +
                            " tokens, but the prompt has " + std::to_string(len) +
                            " tokens and max_tokens is " + std::to_string(want) + " (" +
                            std::to_string(len + want) + " in total)"};
    if (r.sampling.min_tokens > want)
      return invalid("min_tokens", "'min_tokens' (" + std::to_string(r.sampling.min_tokens) +
                                       ") is more than the " + std::to_string(want) +
                                       " tokens the output can have");
    RequestSpec spec;
    spec.prompt = std::move(ids);
    spec.limits.max_tokens = want;
    out->num_prompt_tokens += len;
    out->requests.push_back(std::move(spec));
  }
  return std::nullopt;
}

std::optional<InputError> InputProcessor::tokenize_bad_words(const GenerationRequest& r,
                                                             std::vector<std::vector<int32_t>>* out) const {
  if (r.bad_words.empty()) return std::nullopt;
  if (tokenizer_ == nullptr)
    return InputError{InputError::Kind::kUnsupported, "bad_words", "'bad_words' needs the model's tokenizer"};
  // Each word at the start of the text and inside it (after a space), as vLLM tokenizes them: the
  // second form only where the space makes a word token of its own, with as many tokens.
  for (const std::string& word : r.bad_words) {
    const std::string bare = word.substr(word.find_first_not_of(" \t\r\n"));
    const std::vector<int32_t> alone = tokenizer_->encode(bare, /*allow_special=*/true);
    if (alone.empty()) continue;
    out->push_back(alone);
    const std::vector<int32_t> spaced = tokenizer_->encode(" " + bare, /*allow_special=*/true);
    if (!spaced.empty() && spaced[0] != alone[0] && spaced.size() == alone.size()) out->push_back(spaced);
  }
  return std::nullopt;
}

InputProcessed InputProcessor::process(GenerationRequest r) const {
  InputProcessed result;
  if (auto e = check_fields(r)) {
    result.error = std::move(*e);
    return result;
  }
  ProcessedInput in;
  if (auto e = plan_tool_calls(r, &in)) {
    result.error = std::move(*e);
    return result;
  }
  if (auto e = plan_structured_output(r, &in)) {
    result.error = std::move(*e);
    return result;
  }
  if (auto e = tokenize(r, &in)) {
    result.error = std::move(*e);
    return result;
  }
  std::vector<std::vector<int32_t>> bad_words;
  if (auto e = tokenize_bad_words(r, &bad_words)) {
    result.error = std::move(*e);
    return result;
  }
  // A prediction is plain text (a special token's text in it stays text, as in a message).
  std::shared_ptr<const std::vector<int32_t>> prediction;
  if (r.prediction) {
    if (tokenizer_ == nullptr) {
      result.error = InputError{InputError::Kind::kUnsupported, "prediction",
                                "'prediction' needs the model's tokenizer"};
      return result;
    }
    auto ids = std::make_shared<std::vector<int32_t>>(tokenizer_->encode(*r.prediction, false));
    if (static_cast<int64_t>(ids->size()) > limits_.max_model_len) {
      result.error = invalid("prediction", "'prediction' has " + std::to_string(ids->size()) +
                                               " tokens, more than the context window of " +
                                               std::to_string(limits_.max_model_len));
      return result;
    }
    prediction = std::move(ids);
  }
  const BlockHash cache_salt = cache_salt_key(r.cache_salt);  // the same for every prompt
  // The model's own stop tokens end every sample, besides the request's (unless ignore_eos).
  std::vector<int32_t> stop_ids = r.stop_token_ids;
  if (tokenizer_ != nullptr) {
    const auto& s = tokenizer_->vocab().stop_ids;
    stop_ids.insert(stop_ids.end(), s.begin(), s.end());
  }
  for (RequestSpec& spec : in.requests) {
    spec.sampling = r.sampling;
    spec.sampling.grammar = in.grammar;
    if (r.sampling.min_tokens > 0) spec.sampling.end_token_ids = stop_ids;
    spec.sampling.bad_words = bad_words;
    spec.limits.stop_token_ids = stop_ids;
    spec.limits.ignore_eos = r.ignore_eos;
    spec.priority = r.priority;
    spec.n = r.best_of.value_or(r.n);
    // best_of ranks the samples by their tokens' log-probabilities: the chosen token's at least.
    if (r.best_of && !spec.sampling.logprobs) spec.sampling.logprobs = 0;
    spec.session_id = r.session_id;
    spec.streaming = r.streaming;
    spec.prediction = prediction;
    spec.cache_salt = cache_salt;
    spec.pooling = r.pooling;
    spec.normalize_embedding = r.normalize_embedding;
  }
  in.stop = std::move(r.stop);
  in.include_stop_str_in_output = r.include_stop_str_in_output;
  in.skip_special_tokens = r.skip_special_tokens;
  in.min_tokens = r.sampling.min_tokens;
  if (r.best_of) in.answered = r.n;
  if (r.use_beam_search) in.beam_length_penalty = r.length_penalty.value_or(1.0f);
  result.input = std::move(in);
  return result;
}

}  // namespace inferd
