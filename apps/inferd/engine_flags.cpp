#include "engine_flags.h"

#include <cstdio>
#include <cstdlib>
#include <map>

#include "common/byte_size.h"
#include "engine/speculative_config.h"
#include "kernels/backend.h"
#include "kernels/onednn_matmul.h"
#include "kv/disk_kv_tier.h"
#include "kv/kv_cache.h"
#include "model/model_loader.h"
#include "tokenizer/tokenizer_loader.h"

namespace inferd {

void add_matmul_flag(CLI::App* cmd, BackendKind* matmul) {
  cmd->add_option(
         "--matmul", *matmul,
         "packed (default: weights repacked for the int8 / f16 kernels, activations rounded to 8 bits "
         "for quantized weights), f32 (weights expanded to f32: slower, closest to an f32 reference) or "
         "onednn (BF16 weights through oneDNN: faster prefill, not batch-invariant) or cuda (an NVIDIA GPU, "
         "in a build with -DINFERD_CUDA=ON)")
      ->transform(CLI::Validator(
          [](std::string& v) {
            // The name onto the enum's number, refusing a backend this build or machine lacks.
            static const std::map<std::string, BackendKind> names{{"packed", BackendKind::kPacked},
                                                                  {"f32", BackendKind::kF32},
                                                                  {"onednn", BackendKind::kOneDnn},
                                                                  {"cuda", BackendKind::kCuda}};
            const auto it = names.find(v);
            if (it == names.end()) return "must be packed, f32, onednn or cuda, not '" + v + "'";
            if (it->second == BackendKind::kOneDnn && !OneDnnWeight::available())
              return std::string(
                  "this build has no oneDNN (scripts/setup installs libdnnl-dev with the OpenCL "
                  "headers and loader its CMake config needs; then rebuild)");
            if (it->second == BackendKind::kCuda) {
              if (Status s = cuda_backend_available(); !s.is_ok()) return s.message();
            }
            v = std::to_string(static_cast<int>(it->second));
            return std::string();
          },
          "packed|f32|onednn|cuda", "backend"));
}

TransformerOptions transformer_options(BackendKind matmul) {
  return {.backend = matmul};
}

void add_kv_dtype_flag(CLI::App* cmd, KvDType* dtype) {
  cmd->add_option("--kv-cache-dtype", *dtype,
                  "KV storage: f16, bf16, f32, or int8 / fp8 (one byte per element and a scale per token "
                  "and head: half of f16's memory)")
      ->transform(CLI::CheckedTransformer(std::map<std::string, KvDType>{{"f16", KvDType::kF16},
                                                                         {"bf16", KvDType::kBF16},
                                                                         {"f32", KvDType::kF32},
                                                                         {"int8", KvDType::kInt8},
                                                                         {"fp8", KvDType::kFp8},
                                                                         {"fp8_e4m3", KvDType::kFp8}}));
}

void add_streaming_flag(CLI::App* cmd, StreamingWindow* window) {
  cmd->add_option_function<std::string>(
      "--streaming-llm",
      [window](const std::string& v) {
        const auto comma = v.find(',');
        StreamingWindow w;
        try {
          if (comma == std::string::npos) throw std::invalid_argument(v);
          size_t used = 0;
          w.sink_tokens = std::stoll(v.substr(0, comma), &used);
          if (used != comma) throw std::invalid_argument(v);
          const std::string rest = v.substr(comma + 1);
          w.window_tokens = std::stoll(rest, &used);
          if (used != rest.size()) throw std::invalid_argument(v);
        } catch (const std::exception&) {
          throw CLI::ValidationError("--streaming-llm",
                                     "expected SINK,WINDOW tokens (e.g. 4,1024), got '" + v + "'");
        }
        if (w.sink_tokens < 0 || w.window_tokens < 16)
          throw CLI::ValidationError("--streaming-llm",
                                     "SINK must be >= 0 and WINDOW >= 16, got '" + v + "'");
        *window = w;
      },
      "StreamingLLM: each token attends to the first SINK tokens and the last WINDOW, as SINK,WINDOW "
      "(e.g. 4,1024); the KV cache in between is given back");
}

void add_engine_flags(CLI::App* cmd, EngineFlags* f) {
  add_matmul_flag(cmd, &f->matmul);
  cmd->add_option("--kv-cache-memory", f->kv_cache_memory,
                  "KV cache size: bytes (2GiB, 512MB) or a fraction of free RAM (0.3)");
  add_kv_dtype_flag(cmd, &f->kv_cache_dtype);
  cmd->add_option("--block-size", f->block_size, "tokens per KV block")->check(CLI::Range(1, 1024));
  cmd->add_option("--max-num-batched-tokens", f->max_num_batched_tokens, "token budget per step")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--max-num-seqs", f->max_num_seqs, "running requests at once")->check(CLI::PositiveNumber);
  cmd->add_option("--max-prefill-tokens", f->max_prefill_tokens, "prefill tokens per step (prefill-first)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--schedule-policy", f->schedule_policy, "decode-first, prefill-first or adaptive")
      ->transform(CLI::CheckedTransformer(
          std::map<std::string, SchedulePolicy>{{"decode-first", SchedulePolicy::kDecodeFirst},
                                                {"prefill-first", SchedulePolicy::kPrefillFirst},
                                                {"adaptive", SchedulePolicy::kAdaptive}}));
  cmd->add_option("--slo-class", f->slo_classes,
                  "an SLO class, name:ttft=500ms,tpot=50ms,weight=4 (repeatable; requests pick one by the "
                  "slo_class field or the X-SLO-Class header; heavier classes run first; a request whose "
                  "class's TTFT the load would miss gets 429)")
      ->take_all();
  cmd->add_option("--batch-window", f->batch_window,
                  "how long a step that would only prefill new arrivals may wait for more: off, auto (from "
                  "the measured arrival rate and step-time model), or milliseconds");
  cmd->add_option("--slo-default-class", f->slo_default_class,
                  "the class of requests that name none and give no priority (default: the lightest)");
  cmd->add_flag("--no-prefix-caching", f->no_prefix_caching, "do not reuse KV blocks of earlier requests");
  cmd->add_option("--session-ttl", f->session_ttl,
                  "seconds a session's last turn stays pinned in the KV cache")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--session-max-share", f->session_max_share, "share of the KV pool session pins may hold")
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--kv-offload-dir", f->kv_offload_dir,
                  "keep cold cached KV blocks in files under this folder (disk tier)");
  cmd->add_option("--kv-offload-disk-gb", f->kv_offload_disk_gb, "size limit of the disk tier, in GB")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--kv-offload-redis", f->kv_offload_redis,
                  "keep cold cached KV blocks in Redis, shared by every inferd serving this model "
                  "(redis://[:password@]host[:port][/db])");
  cmd->add_option("--kv-offload-watermark", f->kv_offload_watermark,
                  "KV pool share holding content above which cold cached blocks are offloaded")
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--kv-load-timeout", f->kv_load_timeout,
                  "seconds a request waits for its KV to arrive (offload tier) before the policy below")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--kv-load-failure", f->kv_load_failure,
                  "what a KV load that fails or times out does: recompute (the request computes what did "
                  "not arrive) or fail (the request ends with an error)")
      ->transform(CLI::CheckedTransformer(std::map<std::string, KvLoadFailure>{
          {"recompute", KvLoadFailure::kRecompute}, {"fail", KvLoadFailure::kFail}}));
  cmd->add_option("--max-model-len", f->max_model_len,
                  "longest prompt + output (default: the model's context)");
  cmd->add_option(
      "--speculative-config", f->speculative_config,
      "speculative decoding as vLLM's JSON: '{\"method\": \"ngram\", \"num_speculative_tokens\": 5, "
      "\"prompt_lookup_min\": 2, \"prompt_lookup_max\": 4, \"disable_by_batch_size\": 4}' (prompt lookup), "
      "or "
      "'{\"method\": \"draft_model\", \"model\": PATH, \"num_speculative_tokens\": 3}' (a smaller model of "
      "the "
      "same vocabulary proposes)");
}

KvOffloadOptions offload_options(const EngineFlags& f) {
  KvOffloadOptions o;
  o.disk_dir = f.kv_offload_dir;
  o.disk_gb = f.kv_offload_disk_gb;
  o.redis_url = f.kv_offload_redis;
  o.watermark = f.kv_offload_watermark;
  return o;
}

Expected<EngineOptions> engine_options(const EngineFlags& f, const ModelConfig& model) {
  EngineOptions o;
  o.kv_dtype = f.kv_cache_dtype;
  o.block_size = f.block_size;
  o.prefix_caching = !f.no_prefix_caching;
  o.offload = offload_options(f);
  if (!o.offload.disk_dir.empty())
    INFERD_RETURN_IF_ERROR(check_writable_dir(o.offload.disk_dir, "--kv-offload-dir"));
  INFERD_ASSIGN_OR_RETURN(int64_t bytes, parse_byte_size(f.kv_cache_memory, available_memory_bytes()));
  const int64_t per_block =
      KvCache::bytes_per_token(model.num_layers, model.kv_dim(), model.head_dim, o.kv_dtype) * f.block_size;
  o.num_kv_blocks = bytes / per_block;
  if (o.num_kv_blocks < 1) {
    return invalid_argument("--kv-cache-memory " + f.kv_cache_memory + " is smaller than one KV block (" +
                            std::to_string(per_block) + " bytes)");
  }
  o.scheduler.max_num_batched_tokens = f.max_num_batched_tokens;
  o.scheduler.max_num_seqs = f.max_num_seqs;
  o.scheduler.max_prefill_tokens = f.max_prefill_tokens;
  o.scheduler.session_ttl_seconds = f.session_ttl;
  o.scheduler.kv_load_timeout_seconds = f.kv_load_timeout;
  o.scheduler.kv_load_failure = f.kv_load_failure;
  o.scheduler.session_max_share = f.session_max_share;
  o.scheduler.policy = f.schedule_policy;
  if (f.batch_window == "off") {
    o.batch_window = BatchWindowMode::kOff;
  } else if (f.batch_window == "auto") {
    o.batch_window = BatchWindowMode::kAuto;
  } else {
    char* end = nullptr;
    const double ms = std::strtod(f.batch_window.c_str(), &end);
    if (f.batch_window.empty() || end != f.batch_window.c_str() + f.batch_window.size() || !(ms >= 0) ||
        ms > 10000)
      return invalid_argument("--batch-window " + f.batch_window +
                              ": give off, auto or milliseconds in [0, 10000]");
    o.batch_window = ms > 0 ? BatchWindowMode::kFixed : BatchWindowMode::kOff;
    o.batch_window_seconds = ms / 1000;
  }
  {
    std::vector<SloClass> classes;
    for (const std::string& spec : f.slo_classes) {
      INFERD_ASSIGN_OR_RETURN(SloClass c, parse_slo_class(spec));
      classes.push_back(std::move(c));
    }
    INFERD_ASSIGN_OR_RETURN(o.scheduler.slo, SloClasses::create(std::move(classes), f.slo_default_class));
  }
  INFERD_ASSIGN_OR_RETURN(o.scheduler.speculative, parse_speculative_config(f.speculative_config));
  o.scheduler.max_model_len = f.max_model_len > 0 ? std::min(f.max_model_len, model.max_position_embeddings)
                                                  : model.max_position_embeddings;
  INFERD_RETURN_IF_ERROR(o.validate());
  return o;
}

Expected<std::unique_ptr<DraftModel>> load_draft_model(EngineOptions* options, const ModelWeights& target,
                                                       ThreadPool& pool, BackendKind matmul) {
  const SpeculativeOptions& spec = options->scheduler.speculative;
  if (!spec.enabled || spec.method != SpeculativeMethod::kDraftModel) return std::unique_ptr<DraftModel>();
  auto d = std::make_unique<DraftModel>();
  const std::string where = "--speculative-config model " + spec.draft_model;
  auto weights = load_model(spec.draft_model);
  if (!weights) return weights.status().with_context(where);
  d->weights = std::move(*weights);
  const ModelConfig& dc = d->weights->config;
  if (dc.vocab_size != target.config.vocab_size)
    return invalid_argument(where + ": its vocabulary has " + std::to_string(dc.vocab_size) +
                            " tokens, the model's " + std::to_string(target.config.vocab_size));
  auto dt = load_tokenizer(d->weights->gguf.get(), d->weights->source_path, dc.vocab_size);
  auto tt = load_tokenizer(target.gguf.get(), target.source_path, target.config.vocab_size);
  if (dt && tt) {
    const int32_t n = std::min((*dt)->vocab_size(), (*tt)->vocab_size());
    if ((*dt)->vocab_size() != (*tt)->vocab_size())
      return invalid_argument(where + ": its tokenizer has " + std::to_string((*dt)->vocab_size()) +
                              " tokens, the model's " + std::to_string((*tt)->vocab_size()));
    for (int32_t id = 0; id < n; ++id) {
      if ((*dt)->token_bytes(id) != (*tt)->token_bytes(id))
        return invalid_argument(where + ": token " + std::to_string(id) +
                                " differs from the model's (another tokenizer)");
    }
  }
  d->model = std::make_unique<Transformer>(*d->weights, pool, transformer_options(matmul));
  options->draft_model = d->model.get();
  return d;
}

std::string describe_kv_cache(const EngineOptions& options, const EngineFlags& flags,
                              const ModelConfig& model) {
  const int64_t tokens = options.num_kv_blocks * options.block_size;
  const double mib =
      static_cast<double>(tokens * KvCache::bytes_per_token(model.num_layers, model.kv_dim(), model.head_dim,
                                                            options.kv_dtype)) /
      (1024.0 * 1024.0);
  char line[256];
  std::snprintf(line, sizeof line, "KV cache: %lld blocks of %d tokens = %lld tokens max, %.1f MiB as %s",
                static_cast<long long>(options.num_kv_blocks), options.block_size,
                static_cast<long long>(tokens), mib,
                std::string(kv_dtype_name(flags.kv_cache_dtype)).c_str());
  std::string out = line;
  if (options.offload.enabled()) {
    out += "\nKV offload (content usage >= " + std::to_string(options.offload.watermark).substr(0, 4) + "):";
    if (!options.offload.disk_dir.empty()) {
      std::snprintf(line, sizeof line, " disk %s (%.1f GB)", options.offload.disk_dir.c_str(),
                    options.offload.disk_gb);
      out += line;
    }
    if (!options.offload.redis_url.empty()) {
      std::string url = options.offload.redis_url;  // a password is not for logs
      if (const auto at = url.rfind('@'); at != std::string::npos) url = "redis://***" + url.substr(at);
      out += " redis " + url;
    }
  }
  return out;
}

}  // namespace inferd
