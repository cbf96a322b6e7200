#include "serve.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>

#include "common/byte_size.h"
#include "common/files.h"
#include "common/log.h"
#include "model/classifier_head.h"
#include "model/default_model.h"
#include "model/model_loader.h"
#include "model/transformer.h"
#include "server/batch_file.h"
#include "server/openai_api.h"
#include "tokenizer/tokenizer_loader.h"
#include "transfer/ucx_kv_transfer.h"
#include "version.h"

namespace inferd {

void add_serve_flags(CLI::App* cmd, ServeFlags* f) {
  ServerOptions& s = f->server;
  cmd->add_option("--profile", f->profile,
                  "scheduling parameters for a scenario: chat, code, summarize, long-context or batch (any "
                  "flag given overrides its value; docs/profiles.md)");
  cmd->add_flag("--print-config", f->print_config, "print the resolved scheduling configuration and exit");
  cmd->add_option("--host", s.host, "address to listen on");
  cmd->add_option("--port", s.port, "port to listen on (0: any free port)");
  cmd->add_option("--api-key", s.api_key, "require 'Authorization: Bearer KEY' on the API endpoints");
  cmd->add_flag(
      "--no-webui", [&s](int64_t) { s.webui = false; },
      "do not serve the web chat UI at / (it calls the API with the key entered on the page)");
  cmd->add_flag("--protect-metrics", s.protect_metrics,
                "with --api-key: /metrics needs the key too (/health stays open)");
  cmd->add_option("--served-model-name", s.served_model_name,
                  "model name in the API (default: the model file's name)");
  cmd->add_option("--metrics-prefix", s.metrics_prefix,
                  "metric name prefix: inferd, or vllm for vLLM dashboards")
      ->check(CLI::IsMember({"inferd", "vllm"}));
  cmd->add_option("--reasoning-parser", f->reasoning_parser,
                  "put the reasoning in reasoning_content: qwen3 (Qwen3's <think> rules) or deepseek_r1 "
                  "(QwQ, DeepSeek-R1: the output starts inside <think>)")
      ->check(CLI::IsMember({"qwen3", "deepseek_r1"}));
  cmd->add_option(
         "--tool-call-parser", f->tool_call_parser,
         "parse tool calls from the output: hermes (Qwen2.5, QwQ, Qwen3) or llama3_json (Llama 3.1/3.2)")
      ->check(CLI::IsMember({"hermes", "llama3_json"}));
  cmd->add_flag("--enable-auto-tool-choice", s.enable_auto_tool_choice,
                "let the model decide when to call a tool (tool_choice \"auto\"; needs --tool-call-parser)");
  cmd->add_option("--chat-template", f->chat_template,
                  "a Jinja chat template file to use instead of the model's")
      ->check(CLI::ExistingFile);
  cmd->add_flag("--trust-request-chat-template", s.trust_request_chat_template,
                "let requests bring their own chat template (chat_template; rendered in inferd's sandboxed, "
                "bounded Jinja interpreter)");
  cmd->add_option("--pooling", f->pooling,
                  "/v1/embeddings: the final hidden state of the last token (decoder embedding models), the "
                  "mean over the input's tokens, or the first token's (default: the GGUF's pooling_type or "
                  "the directory's 1_Pooling/config.json, else last)")
      ->check(CLI::IsMember({"last", "mean", "cls"}));
  cmd->add_option(
      "--hf-overrides", f->hf_overrides,
      "JSON over the model's config, as vLLM's: is_matryoshka (true: /v1/embeddings may ask for "
      "fewer dimensions) and matryoshka_dimensions (the sizes it may ask for); classifier_from_token "
      "(tokens whose vocabulary rows become a classifier head, e.g. [\"no\", \"yes\"]) with "
      "method from_2_way_softmax or no_post_processing (or is_original_qwen3_reranker: true) and "
      "architectures [\"...ForSequenceClassification\"]");
  cmd->add_option("--max-body", f->max_body, "largest request body (e.g. 8MiB)");
  cmd->add_option("--header-timeout", s.header_timeout_seconds,
                  "seconds to receive a request once it started")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--idle-timeout", s.idle_timeout_seconds, "seconds a kept-alive connection may idle")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--write-timeout", s.write_timeout_seconds, "seconds a client may stall one write")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--max-queue", s.max_queue,
                  "waiting sequences (each prompt x n) beyond which new requests get 429")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--max-prompts", s.max_prompts,
                  "prompts one /v1/completions request may carry (400 beyond)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--max-stored-responses", s.max_stored_responses,
                  "finished /v1/responses answers kept in memory for previous_response_id and GET "
                  "/v1/responses/{id}, the newest first (0: none)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_flag("--enable-prompt-tokens-details", s.enable_prompt_tokens_details,
                "completions and chat usage report prompt_tokens_details.cached_tokens: the prompt "
                "tokens the prefix cache (or a KV tier) supplied");
  cmd->add_option("--shutdown-grace", s.shutdown_grace_seconds,
                  "on SIGTERM, seconds in-flight requests get to finish before they are aborted")
      ->check(CLI::NonNegativeNumber);
  cmd->add_flag("--enable-lora", f->enable_lora,
                "serve LoRA adapters of the model (requests pick one by 'model'; /v1/load_lora_adapter)");
  cmd->add_option("--lora-modules", f->lora_modules,
                  "adapters offered from the start, as name=path (a PEFT directory or a GGUF adapter); "
                  "implies --enable-lora")
      ->expected(1, -1);
  cmd->add_option("--max-loras", f->max_loras,
                  "LoRA adapters resident in memory at once (the rest load on demand)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  cmd->add_option("--max-lora-rank", f->max_lora_rank, "the highest LoRA rank accepted")
      ->check(CLI::Range(int64_t{1}, int64_t{4096}));
  cmd->add_option("--role", f->role,
                  "both (prefill and decode here), prefill (keeps each prompt's KV for a decode instance to "
                  "pull), or decode (pulls prompt KV from prefill instances); see docs/disaggregation.md")
      ->check(CLI::IsMember({"both", "prefill", "decode"}));
  cmd->add_option(
      "--kv-host", f->kv_host,
      "prefill: address of the KV transfer listener, as decode instances reach it (default: --host)");
  cmd->add_option("--kv-port", f->kv_port, "prefill: port of the KV transfer listener (0: any free port)");
  cmd->add_option("--kv-lease", f->kv_lease_seconds,
                  "prefill: seconds a finished prompt's KV waits to be pulled before it is dropped")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--kv-export-buffer", f->kv_export_buffer,
                  "prefill: the most prompt KV kept for pulls at once (e.g. 1GiB); beyond, answers carry no "
                  "kv_transfer_params and decode instances compute the prompt");
}

void add_batch_file_flags(CLI::App* cmd, BatchFileFlags* f) {
  cmd->add_option("-i,--input-file", f->input,
                  "JSONL, one request a line: {\"custom_id\", \"method\": \"POST\", \"url\", \"body\"}")
      ->required();
  cmd->add_option("-o,--output-file", f->output, "JSONL answers, in input order")->required();
  cmd->add_option("--max-concurrency", f->max_concurrency, "requests in flight at once")
      ->check(CLI::Range(int64_t{1}, int64_t{4096}));
}

namespace {

const char* policy_name(SchedulePolicy p) {
  switch (p) {
    case SchedulePolicy::kDecodeFirst: return "decode-first";
    case SchedulePolicy::kPrefillFirst: return "prefill-first";
    case SchedulePolicy::kAdaptive: break;
  }
  return "adaptive";
}

}  // namespace

const std::vector<ServeProfile>& serve_profiles() {
  // From scripts/bench/profile_sweep.py (docs/profiles.md has the table and the figures behind each
  // value). Batch window: off everywhere (auto measured equal to off on these CPUs, BENCHMARKS.md).
  // Swept: the policy and the token budget (the best of 3 x 3 per scenario). Not swept: max_num_seqs
  // (the default; the sweep's concurrency stayed below it), prefix caching (on: free on a miss) and
  // the session TTL (conversations and documents asked again keep their KV; one-shot work none).
  static const std::vector<ServeProfile> profiles = {
      {"chat", SchedulePolicy::kAdaptive, 512, 64, "off", true, 300},
      {"code", SchedulePolicy::kAdaptive, 512, 64, "off", true, 300},
      {"summarize", SchedulePolicy::kDecodeFirst, 8192, 64, "off", true, 0},
      {"long-context", SchedulePolicy::kDecodeFirst, 2048, 64, "off", true, 600},
      {"batch", SchedulePolicy::kDecodeFirst, 2048, 64, "off", true, 0},
  };
  return profiles;
}

Status apply_profile(const std::string& name, const CLI::App& cmd, EngineFlags* f) {
  const ServeProfile* p = nullptr;
  std::string names;
  for (const ServeProfile& q : serve_profiles()) {
    if (q.name == name) p = &q;
    names += (names.empty() ? "" : ", ") + q.name;
  }
  if (p == nullptr) return invalid_argument("--profile " + name + ": no such profile (" + names + ")");
  auto unset = [&](const char* flag) { return cmd.count(flag) == 0; };
  if (unset("--schedule-policy")) f->schedule_policy = p->policy;
  if (unset("--max-num-batched-tokens")) f->max_num_batched_tokens = p->max_num_batched_tokens;
  if (unset("--max-prefill-tokens")) f->max_prefill_tokens = p->max_num_batched_tokens;
  if (unset("--max-num-seqs")) f->max_num_seqs = p->max_num_seqs;
  if (unset("--batch-window")) f->batch_window = p->batch_window;
  if (unset("--no-prefix-caching")) f->no_prefix_caching = !p->prefix_caching;
  if (unset("--session-ttl")) f->session_ttl = p->session_ttl;
  return Status::ok();
}

std::string describe_config(const std::string& profile, const CLI::App& cmd, const EngineFlags& f) {
  nlohmann::ordered_json j;
  j["profile"] = profile.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(profile);
  auto put = [&](const char* key, const char* flag, nlohmann::ordered_json value) {
    const char* source = cmd.count(flag) > 0 ? "flag" : profile.empty() ? "default" : "profile";
    j[key] = {{"value", std::move(value)}, {"from", source}};
  };
  put("schedule_policy", "--schedule-policy", policy_name(f.schedule_policy));
  put("max_num_batched_tokens", "--max-num-batched-tokens", f.max_num_batched_tokens);
  put("max_prefill_tokens", "--max-prefill-tokens", f.max_prefill_tokens);
  put("max_num_seqs", "--max-num-seqs", f.max_num_seqs);
  put("batch_window", "--batch-window", f.batch_window);
  put("prefix_caching", "--no-prefix-caching", !f.no_prefix_caching);
  put("session_ttl", "--session-ttl", f.session_ttl);
  return j.dump(2);
}

namespace {

std::string name_of(const std::string& path) {
  std::filesystem::path p(path);
  if (p.filename().empty()) p = p.parent_path();
  return p.extension() == ".gguf" ? p.stem().string() : p.filename().string();
}

// Everything the loaded model consists of, destroyed engine first.
struct Loaded {
  std::unique_ptr<ModelWeights> weights;
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<ChatTemplate> chat_template;
  std::unique_ptr<ThreadPool> pool;
  std::unique_ptr<Transformer> model;
  std::unique_ptr<DraftModel> draft;  // speculative decoding by draft model only
  std::unique_ptr<LoraRegistry> lora;
  std::unique_ptr<ClassifierHead> classifier;  // a classification model's head
  std::unique_ptr<KvExportStore> kv_export;
  std::unique_ptr<AsyncEngine> engine;
  std::unique_ptr<UcxKvServer> kv_server;  // serves kv_export from the engine's cache layout
  Parallel* parallel = nullptr;            // its before-abort hook points at engine
  ~Loaded() {
    kv_server.reset();
    engine.reset();  // joins the engine thread, the only one that calls the hook
    if (parallel != nullptr) parallel->set_before_abort(nullptr);
  }
};

// The pooling of /v1/embeddings: the flag's; else the GGUF's `<arch>.pooling_type` (llama.cpp's
// numbering: 1 mean, 2 cls, 3 last), or a Hugging Face directory's sentence-transformers pooling
// (1_Pooling/config.json, as vLLM reads it); else last.
Expected<Pooling> resolve_pooling(const std::string& flag, const ModelWeights& w) {
  if (flag == "mean") return Pooling::kMean;
  if (flag == "cls") return Pooling::kCls;
  if (flag == "last") return Pooling::kLast;
  if (w.gguf != nullptr) {
    INFERD_ASSIGN_OR_RETURN(std::optional<int64_t> type,
                            w.gguf->get_int(w.config.arch_name + ".pooling_type"));
    if (type == 1) return Pooling::kMean;
    if (type == 2) return Pooling::kCls;
    return Pooling::kLast;
  }
  const std::filesystem::path st = std::filesystem::path(w.source_path) / "1_Pooling" / "config.json";
  if (!std::filesystem::is_regular_file(st)) return Pooling::kLast;
  Expected<std::string> text = read_text_file(st.string());
  if (!text) return text.status();
  const nlohmann::json j = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return corrupt_file(st.string() + ": not a JSON object");
  auto on = [&](const char* key) {
    auto it = j.find(key);
    return it != j.end() && it->is_boolean() && it->get<bool>();
  };
  if (on("pooling_mode_lasttoken")) return Pooling::kLast;
  if (on("pooling_mode_mean_tokens")) return Pooling::kMean;
  if (on("pooling_mode_cls_token")) return Pooling::kCls;
  return unsupported(st.string() +
                     ": a pooling mode other than last token, mean or cls (inferd serve --pooling)");
}

// vLLM's --hf-overrides keys that turn a causal LM into a classifier (resolve_classifier).
bool is_classifier_override(const std::string& key) {
  return key == "architectures" || key == "classifier_from_token" || key == "method" ||
         key == "is_original_qwen3_reranker";
}

// The model's classification head (model/classifier_head.h): the one its file carries, or, with
// vLLM's --hf-overrides '{"architectures": ["...ForSequenceClassification"], "classifier_from_token":
// [tokens], "method": "from_2_way_softmax" | "no_post_processing"}' (or "is_original_qwen3_reranker":
// true for the two-way head of the original Qwen3-Reranker), one built from the vocabulary
// projection's rows of those tokens (looked up in the vocabulary as transformers'
// convert_tokens_to_ids does). nullopt: a generative model.
Expected<std::optional<ClassifierHead>> resolve_classifier(const std::string& overrides,
                                                           const ModelWeights& w,
                                                           const Tokenizer* tokenizer) {
  INFERD_ASSIGN_OR_RETURN(std::optional<ClassifierHead> own, load_classifier_head(w));
  if (overrides.empty()) return own;
  const nlohmann::json j = nlohmann::json::parse(overrides, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return invalid_argument("--hf-overrides must be a JSON object");
  const auto tokens = j.find("classifier_from_token");
  const bool any = std::any_of(j.items().begin(), j.items().end(),
                               [](const auto& kv) { return is_classifier_override(kv.key()); });
  if (!any) return own;
  if (tokens == j.end())
    return invalid_argument(
        "--hf-overrides: architectures, method and is_original_qwen3_reranker go with "
        "classifier_from_token (the tokens whose rows become the classifier)");
  if (own)
    return invalid_argument("--hf-overrides: classifier_from_token on a model that has a classifier head (" +
                            own->origin + ")");
  if (auto a = j.find("architectures"); a != j.end()) {
    if (!a->is_array() || a->size() != 1 || !(*a)[0].is_string() ||
        !is_sequence_classification((*a)[0].get<std::string>()))
      return invalid_argument("--hf-overrides: architectures must be one ...ForSequenceClassification name");
  }
  bool two_way = false;
  if (auto o = j.find("is_original_qwen3_reranker"); o != j.end()) {
    if (!o->is_boolean())
      return invalid_argument("--hf-overrides: is_original_qwen3_reranker must be true or false");
    two_way = o->get<bool>();
  }
  if (auto m = j.find("method"); m != j.end()) {
    if (!m->is_string() ||
        (m->get<std::string>() != "from_2_way_softmax" && m->get<std::string>() != "no_post_processing"))
      return invalid_argument(
          "--hf-overrides: method must be \"from_2_way_softmax\" or \"no_post_processing\"");
    two_way = m->get<std::string>() == "from_2_way_softmax";
  }
  if (!tokens->is_array() || tokens->empty() ||
      !std::all_of(tokens->begin(), tokens->end(), [](const nlohmann::json& t) { return t.is_string(); }))
    return invalid_argument("--hf-overrides: classifier_from_token must be a list of tokens");
  if (tokenizer == nullptr)
    return invalid_argument("--hf-overrides: classifier_from_token needs the model's tokenizer");
  std::vector<int32_t> ids;
  std::vector<std::string> names;
  for (const nlohmann::json& t : *tokens) {
    const std::string name = t.get<std::string>();
    std::optional<int32_t> id = tokenizer->token_id(name);
    if (!id)
      return invalid_argument("--hf-overrides: classifier_from_token '" + name +
                              "' is not a token of the vocabulary");
    ids.push_back(*id);
    names.push_back(name);
  }
  INFERD_ASSIGN_OR_RETURN(ClassifierHead head, classifier_from_tokens(w, ids, std::move(names), two_way));
  return std::optional<ClassifierHead>(std::move(head));
}

// Whether the model is a Matryoshka embedding model, and its sizes (empty: any): from a Hugging
// Face directory's config.json (is_matryoshka, matryoshka_dimensions, as vLLM reads them), then
// --hf-overrides, which may set those two keys only.
Expected<std::optional<std::vector<int64_t>>> resolve_matryoshka(const std::string& overrides,
                                                                 const ModelWeights& w) {
  std::optional<std::vector<int64_t>> out;
  auto apply = [&](const nlohmann::json& j, const std::string& where, bool strict) -> Status {
    for (const auto& [key, value] : j.items()) {
      if (key == "is_matryoshka") {
        if (!value.is_boolean()) return invalid_argument(where + ": is_matryoshka must be true or false");
        if (!value.get<bool>()) out.reset();
        if (value.get<bool>() && !out) out.emplace();
      } else if (key == "matryoshka_dimensions") {
        if (!value.is_array() || value.empty() ||
            !std::all_of(value.begin(), value.end(), [&](const nlohmann::json& d) {
              return d.is_number_integer() && d.get<int64_t>() >= 1 &&
                     d.get<int64_t>() <= w.config.hidden_size;
            }))
          return invalid_argument(where + ": matryoshka_dimensions must be a list of sizes in [1, " +
                                  std::to_string(w.config.hidden_size) + "]");
        out = value.get<std::vector<int64_t>>();
      } else if (strict && !is_classifier_override(key)) {
        return unsupported(where + ": '" + key +
                           "' is not supported (only is_matryoshka, matryoshka_dimensions, architectures, "
                           "classifier_from_token, method and is_original_qwen3_reranker)");
      }
    }
    return Status::ok();
  };
  if (w.gguf == nullptr) {
    const std::string config = (std::filesystem::path(w.source_path) / "config.json").string();
    Expected<std::string> text = read_text_file(config);
    if (!text) return text.status();
    const nlohmann::json j = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
    if (j.is_object()) INFERD_RETURN_IF_ERROR(apply(j, config, false));
  }
  if (!overrides.empty()) {
    const nlohmann::json j = nlohmann::json::parse(overrides, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object()) return invalid_argument("--hf-overrides must be a JSON object");
    INFERD_RETURN_IF_ERROR(apply(j, "--hf-overrides", true));
  }
  return out;
}

// A classification model's head and, from a GGUF, its rerank template (before the weights are
// split: a classifier is served by one process).
Status load_classifier(const ServeFlags& flags, Parallel* parallel, Loaded* out, ServingContext* ctx) {
  INFERD_ASSIGN_OR_RETURN(std::optional<ClassifierHead> head,
                          resolve_classifier(flags.hf_overrides, *out->weights, out->tokenizer.get()));
  if (!head) return Status::ok();
  if (parallel != nullptr)
    return unsupported("a classification model (" + head->origin +
                       ") with tensor or pipeline parallelism is not supported: serve it from one process");
  if (flags.role != "both")
    return unsupported("a classification model (" + head->origin +
                       ") generates nothing to disaggregate (--role)");
  out->classifier = std::make_unique<ClassifierHead>(std::move(*head));
  ctx->classifier = out->classifier.get();
  if (out->weights->gguf != nullptr) {
    INFERD_ASSIGN_OR_RETURN(std::optional<std::string> tmpl,
                            out->weights->gguf->get_string("tokenizer.chat_template.rerank"));
    ctx->rerank_template = tmpl.value_or("");
  }
  std::string labels;
  for (const std::string& l : out->classifier->labels) labels += (labels.empty() ? "" : ", ") + l;
  log_info("classification model: " + out->classifier->origin + "; labels: " + labels +
           (ctx->rerank_template.empty() ? "" : "; pairs use the GGUF's rerank template") +
           "; generation is refused");
  return Status::ok();
}

// Seconds since `start`, as "1.23".
std::string seconds_since(std::chrono::steady_clock::time_point start) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2f",
                std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  return text;
}

Status load_all(const std::string& path, const ServeFlags& flags, int threads,
                const EngineFlags& engine_flags, Parallel* parallel, Loaded* out, ServingContext* ctx) {
  const std::string& chat_template_file = flags.chat_template;
  INFERD_ASSIGN_OR_RETURN(out->weights, load_model(path));
  if (parallel != nullptr) INFERD_RETURN_IF_ERROR(parallel->split(*out->weights));
  auto tok =
      load_tokenizer(out->weights->gguf.get(), out->weights->source_path, out->weights->config.vocab_size);
  if (tok) {
    out->tokenizer = std::move(*tok);
    if (chat_template_file.empty()) {
      INFERD_ASSIGN_OR_RETURN(out->chat_template,
                              load_chat_template(out->weights->source_path, *out->tokenizer));
    } else {
      INFERD_ASSIGN_OR_RETURN(std::string source, read_text_file(chat_template_file));
      auto compiled = ChatTemplate::compile(source);
      if (!compiled) return compiled.status().with_context(chat_template_file);
      out->chat_template = std::make_unique<ChatTemplate>(std::move(*compiled));
    }
  } else {
    log_warning("no tokenizer (" + tok.status().message() + "): token-id prompts only");
  }
  INFERD_RETURN_IF_ERROR(load_classifier(flags, parallel, out, ctx));
  INFERD_ASSIGN_OR_RETURN(EngineOptions options, engine_options(engine_flags, out->weights->config));
  log_info(describe_kv_cache(options, engine_flags, out->weights->config));
  out->pool = std::make_unique<ThreadPool>(threads);
  const auto packing = std::chrono::steady_clock::now();
  out->model =
      std::make_unique<Transformer>(*out->weights, *out->pool, transformer_options(engine_flags.matmul));
  log_info("weights prepared for the " + std::string(backend_name(out->model->backend().kind())) +
           " backend in " + seconds_since(packing) + " s");
  if (flags.role == "prefill") {
    auto bytes = parse_byte_size(flags.kv_export_buffer, 0);
    if (!bytes || *bytes < 1)
      return invalid_argument("--kv-export-buffer " + flags.kv_export_buffer + ": give a size");
    out->kv_export = std::make_unique<KvExportStore>(flags.kv_lease_seconds, *bytes);
    if (const char* fault = std::getenv("INFERD_FAULT_CORRUPT_KV_EXPORT");
        fault != nullptr && *fault == '1') {
      log_warning(
          "INFERD_FAULT_CORRUPT_KV_EXPORT=1: every exported prompt's last KV block is corrupted (tests)");
      out->kv_export->set_corrupt_for_tests(true);
    }
    options.kv_export = out->kv_export.get();
  }
  if (flags.role == "decode") {
    options.remote_kv = [](KvCache& cache,
                           const KvStoreIdentity& id) -> Expected<std::unique_ptr<RemoteKvSource>> {
      INFERD_ASSIGN_OR_RETURN(auto client, UcxKvClient::create(cache, id));
      return std::unique_ptr<RemoteKvSource>(std::move(client));
    };
  }
  if (parallel != nullptr) INFERD_RETURN_IF_ERROR(parallel->attach(*out->model, options));
  INFERD_ASSIGN_OR_RETURN(out->draft,
                          load_draft_model(&options, *out->weights, *out->pool, engine_flags.matmul));
  if (out->draft) {
    if (parallel != nullptr)
      return unsupported(
          "--speculative-config: a draft model with tensor or pipeline parallelism is not supported yet");
    log_info("draft model: " + options.scheduler.speculative.draft_model + " (" +
             out->draft->weights->config.arch_name + ", " +
             std::to_string(out->draft->weights->config.num_layers) + " layers)");
  }
  if (flags.enable_lora || !flags.lora_modules.empty()) {
    INFERD_RETURN_IF_ERROR(out->model->enable_lora().with_context("--enable-lora"));
    out->lora = std::make_unique<LoraRegistry>(*out->weights,
                                               LoraRegistryOptions{flags.max_loras, flags.max_lora_rank});
    for (const std::string& module : flags.lora_modules) {
      const size_t eq = module.find('=');
      if (eq == std::string::npos || eq == 0 || eq + 1 == module.size())
        return invalid_argument("--lora-modules " + module + ": give name=path");
      INFERD_RETURN_IF_ERROR(
          out->lora->add(module.substr(0, eq), module.substr(eq + 1), flags.server.served_model_name)
              .with_context("--lora-modules " + module));
      log_info("LoRA adapter '" + module.substr(0, eq) + "': " + module.substr(eq + 1));
    }
    ctx->lora = out->lora.get();
  }
  const auto engine_start = std::chrono::steady_clock::now();
  out->engine = std::make_unique<AsyncEngine>(*out->model, options);
  log_info("engine and KV cache set up in " + seconds_since(engine_start) + " s");
  if (parallel != nullptr) {
    // A rank that stops answering ends the job: first every open request gets the reason (500),
    // with a moment for the HTTP threads to write it.
    out->parallel = parallel;
    parallel->set_before_abort([engine = out->engine.get()](const std::string& why) {
      engine->fail_all("the tensor-parallel job is ending: " + why);
      std::this_thread::sleep_for(std::chrono::seconds(1));
    });
  }
  if (!out->engine->remote_kv_status().is_ok())
    return out->engine->remote_kv_status().with_context("--role decode: the KV transfer client");
  if (out->kv_export) {
    const std::string host = flags.kv_host.empty() ? flags.server.host : flags.kv_host;
    INFERD_ASSIGN_OR_RETURN(
        out->kv_server, UcxKvServer::start(host, flags.kv_port, *out->kv_export, out->engine->kv_identity()));
    ctx->kv_export = out->kv_export.get();
    ctx->kv_host = host;
    ctx->kv_port = out->kv_server->port();
    ctx->kv_server_stats = &out->kv_server->stats();
    log_info("KV transfer (prefill): listening on " + host + ":" + std::to_string(ctx->kv_port) +
             " over UCX");
  }
  ctx->role = flags.role;
  ctx->engine = out->engine.get();
  ctx->tokenizer = out->tokenizer.get();
  ctx->chat_template = out->chat_template.get();
  ctx->max_model_len = options.scheduler.max_model_len;
  ctx->vocab_size = static_cast<int32_t>(out->weights->config.vocab_size);
  ctx->hidden_size = out->weights->config.hidden_size;
  INFERD_ASSIGN_OR_RETURN(ctx->pooling, resolve_pooling(flags.pooling, *out->weights));
  INFERD_ASSIGN_OR_RETURN(ctx->matryoshka, resolve_matryoshka(flags.hf_overrides, *out->weights));
  return Status::ok();
}

}  // namespace

namespace {

// What serve and run-batch resolve before the server starts: the model's path and the server's
// options from the flags. Returns the exit code on an error (printed), else 0.
int prepare_serve(const std::string& model_path, ServeFlags& flags, std::string* path) {
  *path = model_path;
  if (path->empty()) {
    auto p = default_model_path();
    if (!p) {
      std::fprintf(stderr, "inferd: error: %s\n", p.status().message().c_str());
      return 1;
    }
    *path = *p;
  }
  auto body = parse_byte_size(flags.max_body, 0);
  if (!body || *body < 1024) {
    std::fprintf(stderr, "inferd: error: --max-body %s: give a size of at least 1KiB\n",
                 flags.max_body.c_str());
    return 1;
  }
  flags.server.max_body_bytes = *body;
  if (flags.reasoning_parser == "qwen3") flags.server.reasoning_parser = ReasoningParser::kQwen3;
  if (flags.reasoning_parser == "deepseek_r1") flags.server.reasoning_parser = ReasoningParser::kDeepSeekR1;
  if (flags.tool_call_parser == "hermes") flags.server.tool_call_parser = ToolCallFormat::kHermes;
  if (flags.tool_call_parser == "llama3_json") flags.server.tool_call_parser = ToolCallFormat::kLlama3Json;
  if (flags.server.enable_auto_tool_choice && !flags.server.tool_call_parser) {
    std::fprintf(stderr, "inferd: error: --enable-auto-tool-choice needs --tool-call-parser\n");
    return 2;
  }
  if (flags.server.served_model_name.empty()) flags.server.served_model_name = name_of(*path);
  flags.server.version = build_version();
  return 0;
}

}  // namespace

int run_serve(const std::string& model_path, int threads, const EngineFlags& engine_flags, ServeFlags flags,
              Parallel* parallel) {
  std::string path;
  if (const int rc = prepare_serve(model_path, flags, &path); rc != 0) return rc;
  HttpServer server(flags.server);
  if (Status s = server.listen(); !s.is_ok()) {
    std::fprintf(stderr, "inferd: error: %s\n", s.message().c_str());
    return 1;
  }
  log_info("listening on http://" + flags.server.host + ":" + std::to_string(server.port()) + ", loading " +
           path);
  Loaded loaded;
  const auto started = std::chrono::steady_clock::now();
  std::thread loader([&] {
    ServingContext ctx;
    Status s = load_all(path, flags, threads, engine_flags, parallel, &loaded, &ctx);
    if (!s.is_ok()) {
      server.set_failed(s.message());
      return;
    }
    server.set_ready(ctx);
    log_info("ready: serving '" + flags.server.served_model_name + "' on http://" + flags.server.host + ":" +
             std::to_string(server.port()) + " (" + seconds_since(started) + " s after start)");
  });
  const int rc = server.run();
  loader.join();
  return rc;
}

namespace {

// One POST to the server on loopback; the status and body, or a transport error.
struct LoopbackAnswer {
  int status = 0;
  std::string body;
  std::string error;  // non-empty: no answer
};

LoopbackAnswer post_loopback(uint16_t port, const std::string& key, const BatchLine& line) {
  namespace net = boost::asio;
  namespace http = boost::beast::http;
  LoopbackAnswer out;
  try {
    net::io_context io;
    net::ip::tcp::socket socket(io);
    socket.connect({net::ip::address_v4::loopback(), port});
    http::request<http::string_body> req{http::verb::post, line.url, 11};
    req.set(http::field::host, "127.0.0.1");
    req.set(http::field::authorization, "Bearer " + key);
    req.set(http::field::content_type, "application/json");
    req.keep_alive(false);
    req.body() = line.body;
    req.prepare_payload();
    http::write(socket, req);
    boost::beast::flat_buffer buffer;
    http::response_parser<http::string_body> parser;
    parser.body_limit(std::numeric_limits<std::uint64_t>::max());
    http::read(socket, buffer, parser);
    out.status = static_cast<int>(parser.get().result_int());
    out.body = std::move(parser.get().body());
  } catch (const std::exception& e) {
    out.error = e.what();
  }
  return out;
}

}  // namespace

int run_batch_file(const std::string& model_path, int threads, const EngineFlags& engine_flags,
                   ServeFlags flags, const BatchFileFlags& batch, Parallel* parallel) {
  std::string path;
  if (const int rc = prepare_serve(model_path, flags, &path); rc != 0) return rc;
  auto input = read_text_file(batch.input);
  if (!input) {
    std::fprintf(stderr, "inferd: error: %s\n", input.status().message().c_str());
    return 1;
  }
  std::vector<BatchLine> lines;
  {
    size_t start = 0;
    const std::string& text = *input;
    while (start < text.size()) {
      size_t end = text.find('\n', start);
      if (end == std::string::npos) end = text.size();
      std::string_view l(text.data() + start, end - start);
      if (!l.empty() && l.back() == '\r') l.remove_suffix(1);
      if (l.find_first_not_of(" \t") != std::string_view::npos) lines.push_back(parse_batch_line(l));
      start = end + 1;
    }
  }
  std::FILE* out = std::fopen(batch.output.c_str(), "w");
  if (out == nullptr) {
    std::fprintf(stderr, "inferd: error: cannot write %s\n", batch.output.c_str());
    return 1;
  }
  // The server's own endpoints on a loopback port that only this process knows the key of.
  flags.server.host = "127.0.0.1";
  flags.server.port = 0;
  flags.server.api_key = random_id("batch-");
  flags.server.max_queue = std::max<int64_t>(flags.server.max_queue, batch.max_concurrency * 64);
  HttpServer server(flags.server);
  if (Status s = server.listen(); !s.is_ok()) {
    std::fclose(out);
    std::fprintf(stderr, "inferd: error: %s\n", s.message().c_str());
    return 1;
  }
  const uint16_t port = server.port();
  int server_rc = 0;
  std::thread serving([&] { server_rc = server.run(); });
  Loaded loaded;
  ServingContext ctx;
  if (Status s = load_all(path, flags, threads, engine_flags, parallel, &loaded, &ctx); !s.is_ok()) {
    server.set_failed(s.message());
    serving.join();
    std::fclose(out);
    std::fprintf(stderr, "inferd: error: %s\n", s.message().c_str());
    return 1;
  }
  server.set_ready(ctx);
  log_info("run-batch: " + std::to_string(lines.size()) + " requests from " + batch.input);
  const auto started = std::chrono::steady_clock::now();
  std::vector<std::string> results(lines.size());
  std::atomic<size_t> next{0};
  std::atomic<int64_t> ok{0}, failed{0};
  std::vector<std::thread> workers;
  const size_t n_workers = std::min<size_t>(static_cast<size_t>(batch.max_concurrency), lines.size());
  for (size_t w = 0; w < n_workers; ++w) {
    workers.emplace_back([&] {
      for (size_t i = next++; i < lines.size(); i = next++) {
        const BatchLine& line = lines[i];
        if (!line.error.empty()) {
          results[i] = batch_error_line(line, "invalid_request", line.error);
          ++failed;
          continue;
        }
        const LoopbackAnswer a = post_loopback(port, flags.server.api_key, line);
        if (!a.error.empty()) {
          results[i] = batch_error_line(line, "server_error", a.error);
          ++failed;
        } else {
          results[i] = batch_answer_line(line, a.status, a.body);
          ++(a.status == 200 ? ok : failed);
        }
      }
    });
  }
  for (std::thread& t : workers) t.join();
  server.stop();
  serving.join();
  bool written = true;
  for (const std::string& r : results) written = written && std::fprintf(out, "%s\n", r.c_str()) >= 0;
  written = std::fclose(out) == 0 && written;
  if (!written) {
    std::fprintf(stderr, "inferd: error: cannot write %s\n", batch.output.c_str());
    return 1;
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  log_info("run-batch: done", {{"requests", static_cast<int64_t>(lines.size())},
                               {"succeeded", ok.load()},
                               {"failed", failed.load()},
                               {"seconds", seconds},
                               {"output", batch.output}});
  return server_rc;
}

}  // namespace inferd
