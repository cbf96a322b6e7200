// Generator: runs one prompt through the transformer token by token (prefill, then decode),
// with a KV cache sized for prompt + max_tokens. The simple path of `inferd run`; the engine
// of a later stage batches many requests instead.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "common/status.h"
#include "engine/sampler.h"
#include "model/transformer.h"

namespace inferd {

struct GenerationStats {
  int64_t prompt_tokens = 0;
  int64_t generated_tokens = 0;
  double prefill_seconds = 0;  // prompt forward, until the first token is sampled
  double decode_seconds = 0;   // the rest
};

struct GenerationOptions {
  int64_t max_tokens = 16;
  std::vector<int32_t> stop_token_ids;  // generation ends after emitting one of these
  SamplingParams sampling;
  int64_t block_size = 16;
  // The engine's default, so `inferd run` computes what `generate` / `serve` compute.
  KvDType kv_dtype = KvDType::kF16;
};

// Generates up to max_tokens tokens after `prompt`, calling on_token(id) as each is sampled.
// Errors: empty prompt, prompt + max_tokens beyond the model's context, bad token ids.
Expected<GenerationStats> generate(Transformer& model, const std::vector<int32_t>& prompt,
                                   const GenerationOptions& options,
                                   const std::function<void(int32_t)>& on_token);

}  // namespace inferd
