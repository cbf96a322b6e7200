// Perplexity: `inferd perplexity`, teacher-forced scoring of a text as llama.cpp's
// llama-perplexity does it: the tokens are cut into chunks of `context`, each chunk runs from an
// empty KV cache, and the second half of each chunk is scored (every token there has at least
// context / 2 tokens before it). With a reference model (the same weights on another matmul
// path), also the mean KL divergence of the next-token distributions and the top-1 agreement.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "common/status.h"
#include "kernels/attention.h"
#include "model/transformer.h"

namespace inferd {

struct PerplexityOptions {
  int64_t context = 512;             // tokens per chunk (-c)
  int64_t max_chunks = 0;            // 0 = every whole chunk of the text
  KvDType kv_dtype = KvDType::kF16;  // KV cache storage (model and reference)
  // LoRA adapters the model and the reference run with (null: none; need enable_lora()).
  const LoraAdapter* lora = nullptr;
  const LoraAdapter* reference_lora = nullptr;
  // The model (not the reference) attends through a StreamingLLM window (off: full attention).
  StreamingWindow streaming;
  Status validate() const;
};

struct PerplexityResult {
  int64_t chunks = 0;
  int64_t scored_tokens = 0;
  double mean_nll = 0;    // natural log
  double perplexity = 0;  // exp(mean_nll)
  // With a reference model:
  bool has_reference = false;
  double reference_perplexity = 0;
  double mean_kl = 0;  // KL(reference || model), nats per token
  double max_kl = 0;
  double top1_agreement = 0;  // share of positions whose argmax agrees
};

// Scores `tokens` with `model` (and `reference`, when given, on the same chunks). Needs at least
// one whole chunk. Models: not owned; both use f16 KV caches, as the engine does by default.
Expected<PerplexityResult> perplexity(Transformer& model, std::span<const int32_t> tokens,
                                      const PerplexityOptions& options, Transformer* reference = nullptr);

}  // namespace inferd
