// The OpenAI-compatible request and response shapes: parsing and validating request bodies of
// /v1/chat/completions and /v1/completions (every error names its field, as OpenAI's do), and
// building the JSON of responses and stream chunks. No I/O, no engine: the HTTP layer
// (http_server) calls these; the fuzz target feeds parse_generate_request random bodies.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/input_processor.h"
#include "engine/output_processor.h"
#include "engine/request.h"
#include "tokenizer/tokenizer.h"

namespace inferd {

// An error answered to the client: HTTP status plus OpenAI's {"error": {...}} fields.
struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // the offending field, or empty
  std::string code;   // machine-readable code, or empty
};
std::string error_body(const ApiError& e);

enum class ApiEndpoint { kChat, kCompletion };

// kv_transfer_params (docs/disaggregation.md): to a prefill instance {"do_remote_decode": true};
// to a decode instance the prefill's answer's handle.
struct KvTransferParams {
  bool do_remote_decode = false;
  std::optional<RemoteKvRef> remote;  // decode: where the prompt's KV waits
  int32_t first_token = -1;           // decode: the token the prefill instance sampled
};
// 16 lower-case hex digits of a transfer id, and back (nullopt: not such a string).
std::string transfer_id_text(uint64_t id);
std::optional<uint64_t> parse_transfer_id(const std::string& text);

// A chat or completions request: what to generate (the front end's GenerationRequest, whose
// bounds InputProcessor checks) and how to answer (stream, usage, logprobs).
struct GenerateRequest {
  ApiEndpoint endpoint = ApiEndpoint::kChat;
  std::string model;
  GenerationRequest generation;  // chat: messages (shape checked here); completions: prompts
  bool stream = false;
  bool include_usage = false;
  bool logprobs = false;  // return logprobs (generation.sampling.logprobs holds how many alternatives)
  std::string user;
  std::optional<KvTransferParams> kv_transfer;
  std::string slo_class;  // inferd's extension: the SLO class (--slo-class) the request runs in
  bool return_tokens_as_token_ids = false;  // logprobs name tokens "token_id:N" (vLLM's option)
  bool prompt_logprobs_field = false;       // the body asked for vLLM's prompt_logprobs field
  // OpenAI's older function calling (functions, function_call): the answer's call goes in the
  // message's function_call, with finish_reason "function_call".
  bool legacy_functions = false;
  // vLLM's request_id (or the X-Request-Id header): the answer's id is "chatcmpl-" / "cmpl-" and
  // it, instead of a random one, so a client can find its request in the server's log.
  std::string request_id;
};
// A request id a client may choose: 1-128 letters, digits or . _ : -.
bool is_request_id(std::string_view id);

// Parses a request body: JSON types and shapes, OpenAI's rules between fields (top_logprobs
// needs logprobs, stream_options needs stream). Value bounds are InputProcessor's, checked once
// for every front end. Unknown fields are ignored; a wrong type is a 400 naming the field.
struct ParsedRequest {
  std::optional<GenerateRequest> request;
  ApiError error;  // when !request
};
ParsedRequest parse_generate_request(ApiEndpoint endpoint, std::string_view body);

// /tokenize and /detokenize bodies.
struct TokenizeRequest {
  std::string prompt;
  std::optional<bool> add_special_tokens;  // a prompt's BOS (absent: yes)
  // Instead of a prompt, a conversation rendered as a chat request renders it: chat.messages
  // with the same chat options and defaults (add_generation_prompt, continue_final_message,
  // add_special_tokens, chat_template, chat_template_kwargs, documents, reasoning_effort), and
  // chat.tools offered to the template when given.
  GenerationRequest chat;
};
struct ParsedTokenize {
  std::optional<TokenizeRequest> request;
  ApiError error;
};
ParsedTokenize parse_tokenize_request(std::string_view body);
struct ParsedDetokenize {
  std::optional<std::vector<int32_t>> tokens;
  ApiError error;
};
ParsedDetokenize parse_detokenize_request(std::string_view body);

// A /v1/embeddings body (OpenAI's, with vLLM's additions): `input` (a string, strings, token ids
// or arrays of them) as prompts, or vLLM's chat form (`messages`, rendered with the chat template,
// add_generation_prompt false unless asked); add_special_tokens, truncate_prompt_tokens and
// priority in `generation` as for completions.
struct EmbeddingRequest {
  std::string model;
  GenerationRequest generation;
  bool base64 = false;                // encoding_format "base64": little-endian float32, base64
  std::optional<int64_t> dimensions;  // must be the model's hidden size (no Matryoshka models)
  std::optional<bool> normalize;      // L2-normalize (absent: yes)
  // vLLM's use_activation (/classify, and /score, /rerank of a classification model): false
  // answers the head's raw logits instead of probabilities. Absent: true.
  std::optional<bool> use_activation;
  std::string user;
  std::string request_id;
};
struct ParsedEmbedding {
  std::optional<EmbeddingRequest> request;
  ApiError error;
};
// With `classify`, vLLM's /classify body: the same inputs (or messages), use_activation, and no
// encoding_format, dimensions or normalize.
ParsedEmbedding parse_embedding_request(std::string_view body, bool classify = false);
// The answer: {"object": "list", "data": [{"object": "embedding", "index", "embedding"}], ...}.
std::string embedding_body(const std::string& id, const std::string& model,
                           const std::vector<std::vector<float>>& embeddings, bool base64,
                           int64_t prompt_tokens);
// vLLM's /score (text_1, text_2: a text or texts; one text_1 against every text_2, or pair by
// pair) and the Jina / Cohere /rerank (query, documents, top_n, return_documents) bodies. Served
// on the embedding of each text: a pair's score is the cosine similarity of its two embeddings,
// as vLLM scores with an embedding model.
struct ScoreRequest {
  bool rerank = false;
  EmbeddingRequest embedding;  // the texts as prompts: the queries first, then the documents
  size_t num_queries = 0;
  std::vector<std::string> documents;  // rerank: the documents' texts (return_documents)
  std::optional<int64_t> top_n;        // rerank: the best n only (absent or 0: all)
  bool return_documents = true;
};
struct ParsedScore {
  std::optional<ScoreRequest> request;
  ApiError error;
};
ParsedScore parse_score_request(bool rerank, std::string_view body);
// The pairs' cosine similarities, document by document, from the embeddings of the request's
// texts in its order (the queries first).
std::vector<double> cosine_scores(const ScoreRequest& request,
                                  const std::vector<std::vector<float>>& embeddings);
// The pairs' scores ({"object": "list", "data": [{"index", "object": "score", "score"}]}) or the
// rerank results (best first: {"results": [{"index", "document", "relevance_score"}]}), from one
// score per document.
std::string score_body(const std::string& id, const std::string& model, const ScoreRequest& request,
                       const std::vector<double>& scores, int64_t prompt_tokens);

// Why an embedding of `dimensions` cannot be given (nullopt: it can): the model's own size always;
// a shorter one only from a Matryoshka model (`matryoshka`: its sizes, empty for any).
std::optional<std::string> check_dimensions(int64_t dimensions, int64_t hidden_size,
                                            const std::optional<std::vector<int64_t>>& matryoshka);
// A Matryoshka embedding cut to its first `dimensions` values, L2-normalized again when asked (the
// pooled state cut, then normalized, as sentence-transformers and vLLM do).
void shorten_embedding(std::vector<float>* v, int64_t dimensions, bool normalize);

// An id for an answer or an item: the prefix, then 16 random hex digits.
std::string random_id(const char* prefix);

// A logprobs entry {"token", "logprob", "bytes"} naming token `id` by its bytes (tokenizer may be
// null: its number, with no bytes), or as "token_id:N" when as_ids (vLLM's return_tokens_as_token_ids).
nlohmann::json token_logprob_json(const Tokenizer* tokenizer, int32_t id, float logprob, bool as_ids = false);

// Standard base64 (RFC 4648, padded) of bytes.
std::string base64_encode(std::string_view bytes);

// Token counts of an answer.
struct Usage {
  int64_t prompt_tokens = 0, completion_tokens = 0;
  // With a prediction: the prediction's drafts the output kept and those it did not (OpenAI's
  // completion_tokens_details).
  std::optional<std::pair<int64_t, int64_t>> prediction;
  // With --enable-prompt-tokens-details: the prompt tokens whose KV came from the prefix cache or
  // a KV tier (prompt_tokens_details.cached_tokens).
  std::optional<int64_t> cached_tokens;
};

// best_of: candidates hold each prompt's `per_prompt` samples in turn; returns the indices of the
// `answered` best of each prompt's, best first, ranked by mean log-probability per token (OpenAI's
// definition; a candidate without tokens ranks last; ties keep sample order).
std::vector<size_t> best_of_choices(const std::vector<OutputProcessor>& candidates, size_t per_prompt,
                                    size_t answered);

// The JSON of one request's answer, in OpenAI's shapes: stream chunks (SSE events) and the
// whole body. One per HTTP request; the transport only sends what it builds.
class OpenAiAnswer final {
 public:
  // tokenizer: not owned, may be null (token ids then stand for the token text).
  OpenAiAnswer(ApiEndpoint endpoint, std::string id, int64_t created, std::string model,
               const Tokenizer* tokenizer, bool logprobs, bool split_reasoning);

  // Logprobs entries name each token "token_id:N" instead of its text (vLLM's
  // return_tokens_as_token_ids: for tokens that are not whole UTF-8 characters).
  void set_tokens_as_ids(bool on) { tokens_as_ids_ = on; }
  // Prompt log-probabilities in the body: vLLM's `prompt_logprobs` field (per choice for
  // completions, once for chat), and, for completions' echo with logprobs, the prompt's tokens
  // before the output's in `logprobs` (the first with null, as OpenAI's API had them).
  void set_prompt_logprobs(bool field, bool echo) {
    prompt_field_ = field;
    echo_logprobs_ = echo;
  }

  // OpenAI's older function calling: a call is the message's function_call (one at most), and
  // the choice finishes with "function_call".
  void set_legacy_functions(bool on) { legacy_functions_ = on; }

  const std::string& id() const { return id_; }
  // The events one output of choice `index` produces: the role chunk first (chat, when
  // `first_output`), the delta (text, reasoning, logprobs) if any, the finish chunk when the
  // choice ended without error. Each is "data: {...}\n\n".
  std::string stream_events(size_t index, const ChoiceDelta& delta, const OutputProcessor& choice,
                            bool first_output) const;
  std::string usage_event(const Usage& usage) const;
  static std::string done_event() { return "data: [DONE]\n\n"; }
  // internal: the server failed (type server_error), not the request (invalid_request_error).
  static std::string error_event(const std::string& message, bool internal = false);
  // The non-streamed body: every choice, in index order, and the usage.
  std::string body(const std::vector<OutputProcessor>& choices, const Usage& usage) const;

 private:
  nlohmann::json chunk(size_t index, nlohmann::json delta_or_text, const nlohmann::json& logprobs,
                       const nlohmann::json& finish) const;
  // prompt: the choice whose prompt entries come first (echo with logprobs), or null.
  nlohmann::json logprobs_json(const std::vector<TokenLogprob>& entries,
                               const OutputProcessor* prompt = nullptr) const;
  nlohmann::json prompt_logprobs_json(const OutputProcessor& choice) const;
  nlohmann::json token_entry(int32_t id, float logprob) const;
  static nlohmann::json usage_json(const Usage& u);
  const char* finish_name(const OutputProcessor& choice) const;

  ApiEndpoint endpoint_;
  std::string id_;
  int64_t created_;
  std::string model_;
  const Tokenizer* tokenizer_;
  bool tokens_as_ids_ = false;
  bool prompt_field_ = false, echo_logprobs_ = false;
  bool legacy_functions_ = false;
  bool logprobs_;
  bool split_reasoning_;
};

}  // namespace inferd
