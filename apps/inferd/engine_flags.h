// Engine flags shared by every subcommand that runs the engine, mapped onto EngineOptions in
// this one place.
#pragma once

#include <CLI/CLI.hpp>
#include <memory>
#include <string>

#include "common/status.h"
#include "engine/engine.h"
#include "model/model_config.h"
#include "model/transformer.h"

namespace inferd {

struct EngineFlags {
  std::string kv_cache_memory = "1GiB";
  KvDType kv_cache_dtype = KvDType::kF16;
  int32_t block_size = 16;
  int64_t max_num_batched_tokens = 2048;
  int64_t max_num_seqs = 64;
  int64_t max_prefill_tokens = 2048;
  SchedulePolicy schedule_policy = SchedulePolicy::kDecodeFirst;
  std::vector<std::string> slo_classes;  // --slo-class name:ttft=...,tpot=...,weight=...
  std::string slo_default_class;
  std::string batch_window = "off";  // --batch-window auto|off|<ms>
  int64_t max_model_len = 0;         // 0 = the model's context length
  bool no_prefix_caching = false;
  double session_ttl = 300;
  double session_max_share = 0.5;
  std::string kv_offload_dir;
  double kv_offload_disk_gb = 8;
  std::string kv_offload_redis;
  double kv_offload_watermark = 0.8;
  double kv_load_timeout = 5;
  KvLoadFailure kv_load_failure = KvLoadFailure::kRecompute;
  BackendKind matmul = BackendKind::kPacked;
  std::string speculative_config;  // JSON (engine/speculative_config.h); empty: off
};

// --matmul packed|f32|onednn: the backend the transformer's ops run on (see BackendKind).
void add_matmul_flag(CLI::App* cmd, BackendKind* matmul);
TransformerOptions transformer_options(BackendKind matmul);

// --kv-cache-dtype (serve, generate, bench, perplexity).
void add_kv_dtype_flag(CLI::App* cmd, KvDType* dtype);
// --streaming-llm SINK,WINDOW: attention sinks + a sliding window (StreamingLLM).
void add_streaming_flag(CLI::App* cmd, StreamingWindow* window);

void add_engine_flags(CLI::App* cmd, EngineFlags* flags);

// Validated options for `model`; the KV cache block count comes from the memory budget.
Expected<EngineOptions> engine_options(const EngineFlags& flags, const ModelConfig& model);

// The offload tiers the flags ask for (the other ranks of a parallel job open their own).
KvOffloadOptions offload_options(const EngineFlags& flags);

// The draft model of --speculative-config '{"method": "draft_model", "model": PATH}', loaded on
// the target's thread pool and checked against it: the same vocabulary size, and where both carry
// a tokenizer the same token for every id (a draft of another vocabulary proposes nonsense). Null
// when the options name none; sets options->draft_model to it.
struct DraftModel {
  std::unique_ptr<ModelWeights> weights;
  std::unique_ptr<Transformer> model;
};
Expected<std::unique_ptr<DraftModel>> load_draft_model(EngineOptions* options, const ModelWeights& target,
                                                       ThreadPool& pool, BackendKind matmul);

// The start-up line every engine command prints: blocks, tokens that fit, bytes, dtype.
std::string describe_kv_cache(const EngineOptions& options, const EngineFlags& flags,
                              const ModelConfig& model);

}  // namespace inferd
