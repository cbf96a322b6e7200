// Offline batch generation (`inferd generate`): JSONL request lines through the one request
// front end (InputProcessor, OutputProcessor) and the engine, all at once (continuous batching);
// reports text, token counts, finish reason and per-request TTFT / end-to-end latency. Runs on
// the calling thread.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "engine/engine.h"
#include "engine/input_processor.h"

namespace inferd {

struct BatchSample {
  std::string text;
  std::vector<int32_t> token_ids;
  std::vector<float> logprobs;  // of each generated token, when asked
  FinishReason finish_reason = FinishReason::kError;
  std::string error;
  double ttft_seconds = 0;
  double e2e_seconds = 0;
};

struct BatchResult {
  int64_t prompt_tokens = 0;
  std::vector<BatchSample> samples;  // n of them (one when the request failed before running)
};

// One JSONL line: {"prompt": "..."}, {"prompt_ids": [...]} or {"messages": [...]}, optional
// max_tokens (default `default_max_tokens`), temperature, top_p, top_k, min_p,
// repetition_penalty, presence_penalty, frequency_penalty, logprobs, seed, stop (string or
// list), stop_token_ids, priority, ignore_eos, n. Checks JSON types (errors name the field);
// the bounds are InputProcessor's.
Expected<GenerationRequest> parse_batch_item(const nlohmann::ordered_json& line, int64_t default_max_tokens);

// The output line: sample 0's fields at the top level and, when n > 1, all samples in "choices".
nlohmann::json batch_result_json(const BatchResult& r, size_t index);

// Runs every request through `inputs` and the engine; progress(done, total) after each
// completion. Results in input order; a request the input side refuses fails alone.
// tokenizer: not owned, may be null (text is then the token ids).
std::vector<BatchResult> run_offline_batch(Engine& engine, const InputProcessor& inputs,
                                           const Tokenizer* tokenizer,
                                           const std::vector<GenerationRequest>& requests,
                                           const std::function<void(size_t, size_t)>& progress);

}  // namespace inferd
