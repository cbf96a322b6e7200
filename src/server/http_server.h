// HttpServer: the OpenAI-compatible HTTP front of the engine (`inferd serve`).
// Boost.Beast on Asio with C++20 coroutines: one I/O thread serves every connection (no thread
// per connection); the engine runs on its own thread (AsyncEngine) and hands outputs back by
// posting to the I/O thread. Listens before the model is loaded (/health answers 503 until
// set_ready). SIGTERM / SIGINT: stop accepting, let in-flight requests finish within the grace
// period, abort the rest, return 0.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "common/status.h"
#include "engine/async_engine.h"
#include "engine/lora_registry.h"
#include "engine/reasoning_splitter.h"
#include "engine/tool_call_parser.h"
#include "jinja/chat_template.h"
#include "kv/kv_export_store.h"
#include "model/classifier_head.h"
#include "tokenizer/tokenizer.h"

namespace inferd {

struct ServerOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 8000;          // 0: any free port (tests)
  std::string api_key;           // empty: no authentication
  bool protect_metrics = false;  // with api_key: /metrics needs it too (/health stays open for probes)
  bool webui = true;             // the web chat UI at / (webui/); its API calls carry the key
  std::string served_model_name;
  std::string version;  // the build's, for GET /v2 (KServe v2 server metadata)
  std::string metrics_prefix = "inferd";
  std::optional<ReasoningParser> reasoning_parser;  // chat: the reasoning -> reasoning_content
  std::optional<ToolCallFormat> tool_call_parser;   // chat: the output's tool calls -> tool_calls
  bool enable_auto_tool_choice = false;             // tool_choice "auto" allowed
  bool trust_request_chat_template = false;         // requests may bring their own chat_template
  int64_t max_body_bytes = 8 << 20;
  int64_t max_header_bytes = 16 << 10;
  double header_timeout_seconds = 10;  // to receive a whole request once its first byte arrived
  double idle_timeout_seconds = 60;    // keep-alive wait for the next request
  double write_timeout_seconds = 30;   // for each write to a client that stopped reading
  int64_t max_queue = 1024;            // waiting sequences (prompts x n) beyond which new ones get 429
  int64_t max_prompts = 256;           // prompts in one /v1/completions request (400 beyond)
  double shutdown_grace_seconds = 30;
  int64_t max_stored_responses = 1000;  // /v1/responses kept for previous_response_id (0: none)
  // Completions and chat usage carry prompt_tokens_details.cached_tokens (vLLM's flag).
  bool enable_prompt_tokens_details = false;
};

// What the server needs once the model is loaded; all not owned.
struct ServingContext {
  AsyncEngine* engine = nullptr;
  const Tokenizer* tokenizer = nullptr;         // may be null: token-id prompts only
  const ChatTemplate* chat_template = nullptr;  // may be null: no chat endpoint
  int64_t max_model_len = 0;
  int32_t vocab_size = 0;
  int64_t hidden_size = 0;           // the size of an embedding
  Pooling pooling = Pooling::kLast;  // /v1/embeddings: what the prompt's final hidden states become
  // A Matryoshka embedding model (its first k dimensions are an embedding of their own): the
  // `dimensions` a request may ask for (empty: any up to hidden_size). Absent: only the full size.
  std::optional<std::vector<int64_t>> matryoshka;
  // A classification model's head (model/classifier_head.h; null: none): /classify answers from
  // it, /score and /rerank score each query-document pair through it (a cross-encoder), and
  // generation requests are refused.
  const ClassifierHead* classifier = nullptr;
  // A GGUF's `tokenizer.chat_template.rerank`: the prompt of a pair (server/cross_encoder.h).
  std::string rerank_template;
  // Disaggregation (docs/disaggregation.md): "both", "prefill" or "decode".
  std::string role = "both";
  KvExportStore* kv_export = nullptr;  // prefill: where prompts' KV waits for a pull
  std::string kv_host;                 // prefill: the UCX listener, as answers name it
  uint16_t kv_port = 0;
  const KvTransferStats* kv_server_stats = nullptr;  // prefill: pulls served
  // LoRA adapters a request may pick by `model` (null: LoRA not enabled, only the base).
  LoraRegistry* lora = nullptr;
};

class HttpServer final {
 public:
  explicit HttpServer(ServerOptions options);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds and listens; an error names the address (e.g. the port is in use).
  Status listen();
  uint16_t port() const;
  // The model is loaded: endpoints start answering. Thread-safe.
  void set_ready(const ServingContext& context);
  // The model failed to load: /health stays 503 and run() returns 1. Thread-safe.
  void set_failed(const std::string& message);
  // Serves on the calling thread until SIGTERM / SIGINT (or a failed load); returns the exit code.
  int run();
  // Makes run() return at once (thread-safe): for a caller with no request left in flight.
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace inferd
