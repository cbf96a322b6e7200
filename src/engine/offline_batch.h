// Offline batch generation (`inferd generate`): parse JSONL requests, run them all through the
// engine at once (continuous batching), and report text, token counts, finish reason and
// per-request TTFT / end-to-end latency. Runs on the calling thread.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "engine/engine.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace inferd {

struct BatchItem {
  std::string prompt;               // raw text (special tokens honoured), or
  std::vector<int32_t> prompt_ids;  // token ids, or
  nlohmann::ordered_json messages;  // a conversation, rendered with the chat template
  SamplingParams sampling;
  GenerationLimits limits;
  std::vector<std::string> stop;  // stop strings
  int32_t priority = 0;
  int32_t n = 1;  // samples
};

struct BatchSample {
  std::string text;
  std::vector<int32_t> token_ids;
  std::vector<float> logprobs;  // of each generated token, when asked
  std::string finish_reason;    // "stop", "length", "error"
  std::string error;
  double ttft_seconds = 0;
  double e2e_seconds = 0;
};

struct BatchResult {
  int64_t prompt_tokens = 0;
  std::vector<BatchSample> samples;  // n of them
};

// One JSONL line: {"prompt": "..."}, {"prompt_ids": [...]} or {"messages": [...]}, optional max_tokens,
// temperature, top_p, top_k, min_p, repetition_penalty, presence_penalty, frequency_penalty, logprobs, seed,
// stop (string or list), priority, ignore_eos, n. Errors name the field.
Expected<BatchItem> parse_batch_item(const nlohmann::ordered_json& line, int64_t default_max_tokens);

// The output line: sample 0's fields at the top level and, when n > 1, all samples in "choices".
nlohmann::json batch_result_json(const BatchResult& r, size_t index);

// Runs every item; progress(done, total) after each completion. Results in input order.
// tokenizer and chat_template may be null (then text prompts / messages fail per item).
std::vector<BatchResult> run_offline_batch(Engine& engine, const Tokenizer* tokenizer,
                                           const ChatTemplate* chat_template,
                                           const std::vector<BatchItem>& items,
                                           const std::function<void(size_t, size_t)>& progress);

}  // namespace inferd
