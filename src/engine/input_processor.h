// InputProcessor: the input side of the one request front end. Turns what a client asked for —
// from an HTTP body (server/openai_api), a JSONL line (`inferd generate`) or CLI flags
// (`inferd run`) — into validated engine requests: every bound checked here, once; the chat
// template rendered; prompts tokenized; the context window checked. Errors name the field.
//   GenerationRequest ──process()──▶ ProcessedInput {RequestSpec per prompt} ──▶ Engine
#pragma once

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "engine/output_constraint.h"
#include "engine/tool_call_parser.h"
#include "grammar/grammar_vocab.h"
#include "jinja/chat_template.h"
#include "tokenizer/chat_encoder.h"
#include "tokenizer/tokenizer.h"

namespace inferd {

// One prompt as a client gives it: text, or token ids.
struct PromptInput {
  std::string text;
  std::vector<int32_t> ids;
  bool is_ids = false;
};

// tool_choice: whether and which tools the model may call.
struct ToolChoice {
  enum class Kind { kAuto, kNone, kRequired, kNamed };
  Kind kind = Kind::kAuto;
  std::string name;  // kNamed: the function
};

// A constraint on the output's shape (OpenAI's response_format, vLLM's structured_outputs and
// guided_* fields), compiled by the grammar engine.
struct StructuredOutput {
  enum class Kind { kJsonObject, kJsonSchema, kRegex, kChoice, kGrammar };
  Kind kind = Kind::kJsonObject;
  nlohmann::ordered_json schema;     // kJsonSchema
  std::string text;                  // kRegex, kGrammar (GBNF)
  std::vector<std::string> choices;  // kChoice
  std::string field;                 // the request field it came from (for errors)
  JsonGrammarOptions json;           // kJsonSchema, kJsonObject: whitespace, additionalProperties
};

// Everything a front end may ask of one generation, before validation. Either `messages` (a
// chat, rendered with the model's template) or `prompts` (completions: one or more prompts).
struct GenerationRequest {
  nlohmann::ordered_json messages;  // null: use prompts
  std::vector<PromptInput> prompts;
  SamplingParams sampling;
  std::optional<int64_t> max_tokens;  // absent: up to the end of the context window
  StreamingWindow streaming;          // StreamingLLM window (off: full attention)
  std::vector<std::string> stop;      // stop strings (not part of the text)
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  int32_t n = 1;
  int32_t priority = 0;  // lower runs earlier
  std::string session_id;
  bool echo = false;                            // completions: the prompt's text before the output
  bool include_stop_str_in_output = false;      // a matched stop string stays at the end of the text
  nlohmann::ordered_json chat_template_kwargs;  // null or an object: extra template variables
  nlohmann::ordered_json tools;                 // null, or OpenAI's [{"type": "function", "function": {...}}]
  std::optional<ToolChoice> tool_choice;        // absent: auto with tools, none without
  bool parallel_tool_calls = true;
  std::optional<StructuredOutput> structured_output;
  // vLLM's fields of the same names:
  std::vector<std::string> bad_words;  // words the output must not contain (tokenized here)
  bool skip_special_tokens = true;     // special tokens' text left out of the output
  // Chat: absent means true, unless continue_final_message (which excludes it).
  std::optional<bool> add_generation_prompt;
  bool continue_final_message = false;  // chat: the prompt ends inside the last message
  // BOS in front of the prompt where the tokenizer asks for one; absent: completions yes, chat no.
  std::optional<bool> add_special_tokens;
  // Keep only the prompt's last k tokens (-1: the context window's worth).
  std::optional<int64_t> truncate_prompt_tokens;
  // Completions: the text after the one to write (fill in the middle): the prompt becomes
  // <fim_prefix> prompt <fim_suffix> suffix <fim_middle>, in the model's own FIM tokens.
  std::optional<std::string> suffix;
  // Chat, vLLM's fields: a Jinja chat template for this request instead of the model's (only
  // where the server trusts them), documents for a template that renders them (RAG templates),
  // and the reasoning effort for a template that reads `reasoning_effort`.
  std::optional<std::string> chat_template;
  nlohmann::ordered_json documents;  // null, or a list of objects of strings
  std::optional<std::string> reasoning_effort;
  // OpenAI's best_of: this many samples per prompt (>= n), of which the n with the highest mean
  // log-probability per token are answered.
  std::optional<int32_t> best_of;
  // vLLM's beam search: n beams (BeamSearch), ranked with this length penalty (absent: 1).
  bool use_beam_search = false;
  std::optional<float> length_penalty;
  // OpenAI's predicted outputs: text the output is expected to repeat (drafts for speculative
  // decoding; the output is the same with or without it).
  std::optional<std::string> prediction;
  // vLLM's cache_salt: the prompt's cached KV blocks are shared only with requests of the same
  // salt (multi-tenant isolation of the prefix cache). Empty: none.
  std::string cache_salt;
  // An embedding instead of a generation (/v1/embeddings): each prompt's final hidden states
  // pooled so, L2-normalized when normalize_embedding; the prompt may fill the context window.
  Pooling pooling = Pooling::kNone;
  bool normalize_embedding = true;
};

// Why a request was refused: the field at fault (empty when it is the request as a whole).
struct InputError {
  enum class Kind {
    kInvalid,        // a value out of range, an empty prompt, a bad conversation
    kContextLength,  // prompt + max_tokens beyond the context window
    kUnsupported,    // the model cannot serve this form (no tokenizer, no chat template)
  };
  Kind kind = Kind::kInvalid;
  std::string field;
  std::string message;
};

// A validated request: one engine request per prompt, each with n samples.
struct ProcessedInput {
  std::vector<RequestSpec> requests;
  std::vector<std::string> stop;  // for the output side
  bool include_stop_str_in_output = false;
  std::vector<std::string> echo;             // with echo: each prompt's text, to put before its outputs
  std::optional<GrammarConstraint> grammar;  // the output must match it (every prompt's)
  std::optional<ToolCallFormat> tool_calls;  // parse the output's tool calls in this format
  int32_t max_tool_calls = 0;                // calls beyond are dropped (1 without parallel calls)
  bool prompt_opens_think = false;           // chat: the rendered prompt ends in an open <think>
  bool skip_special_tokens = true;           // for the output side
  int32_t min_tokens = 0;                    // stop strings count only from this many tokens on
  // best_of: each prompt's requests[i].n samples are candidates, of which the `answered` best are
  // the answer (0: every sample is answered).
  int32_t answered = 0;
  // Beam search instead of sampling: each prompt's requests[i] (n beams, max_tokens, stop tokens)
  // is run by a BeamSearch with this length penalty, not submitted as it is.
  std::optional<float> beam_length_penalty;
  int64_t num_prompt_tokens = 0;  // all prompts together
  int64_t num_sequences() const {
    return static_cast<int64_t>(requests.size()) * (requests.empty() ? 0 : requests[0].n);
  }
};

struct InputProcessed {
  std::optional<ProcessedInput> input;
  InputError error;  // when !input
};

struct InputLimits {
  int64_t max_model_len = 0;  // prompt + generated tokens
  int32_t vocab_size = 0;
  int64_t max_prompts = 256;  // prompts in one request
  // Tool calling (vLLM's --tool-call-parser, --enable-auto-tool-choice): the format the model
  // writes calls in (absent: requests with tools the model may call are refused), and whether
  // it may decide itself to call one (tool_choice "auto").
  std::optional<ToolCallFormat> tool_call_parser;
  bool enable_auto_tool_choice = false;
  // vLLM's --trust-request-chat-template: requests may bring their own chat template.
  bool trust_request_chat_template = false;
};

class InputProcessor final {
 public:
  // tokenizer, chat_template: not owned, may be null (then only token-id prompts are served).
  InputProcessor(const Tokenizer* tokenizer, const ChatTemplate* chat_template, InputLimits limits);

  // Validates every field, renders and tokenizes the prompts (text prompts with their special
  // tokens honoured, as llama.cpp and vLLM do), checks each against the context window and
  // adds the model's stop tokens. Thread-safe: const, shares nothing between calls.
  InputProcessed process(GenerationRequest request) const;

  const InputLimits& limits() const { return limits_; }

  // A chat request's conversation rendered (with its chat_template, documents, reasoning_effort,
  // chat options, and `tools` when offer_tools) and tokenized: what process() does for
  // messages, for /tokenize. The error names the field at fault.
  std::optional<InputError> render_chat(const GenerationRequest& r, bool offer_tools, ChatPrompt* out) const;

 private:
  std::optional<InputError> check_fields(const GenerationRequest& r) const;
  std::optional<InputError> check_tools(const GenerationRequest& r) const;
  std::optional<InputError> check_beam_search(const GenerationRequest& r) const;
  std::optional<InputError> plan_tool_calls(const GenerationRequest& r, ProcessedInput* out) const;
  std::optional<InputError> plan_structured_output(const GenerationRequest& r, ProcessedInput* out) const;
  // The tokenizer's vocabulary as grammars see it, built on first use.
  Expected<std::shared_ptr<const GrammarVocab>> grammar_vocab() const;
  std::optional<InputError> constrain(const std::string& field,
                                      Expected<std::shared_ptr<const Grammar>> grammar,
                                      ProcessedInput* out) const;
  std::optional<InputError> tokenize(const GenerationRequest& r, ProcessedInput* out) const;
  // bad_words as token sequences (each word alone and after a space, as vLLM tokenizes them).
  std::optional<InputError> tokenize_bad_words(const GenerationRequest& r,
                                               std::vector<std::vector<int32_t>>* out) const;

  const Tokenizer* tokenizer_;
  const ChatTemplate* chat_template_;
  InputLimits limits_;
  mutable GrammarCache grammars_;
  mutable std::once_flag vocab_once_;
  mutable std::optional<Expected<std::shared_ptr<const GrammarVocab>>> vocab_;
};

}  // namespace inferd
