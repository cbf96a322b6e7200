// BenchDataset: the requests of a serving benchmark, made of real token text of the target
// model's vocabulary (random ids of non-special tokens, decoded, re-encoded and cut to length)
// so the server sees prompts of the asked token counts. Datasets: random, shared-prefix,
// multi-turn, the three service scenarios, and jsonl files.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "common/status.h"
#include "tokenizer/tokenizer.h"

namespace inferd {

// One conversation: a single request, or (multi-turn) several sent one after the other, each
// resending the history with the server's previous answers.
struct BenchItem {
  std::string system;              // a system prompt (shared-prefix), prepended on completions
  std::vector<std::string> turns;  // user texts, one per request
  std::string messages_json;       // jsonl "messages" given as-is (chat only, one request)
  int64_t output_len = 0;          // max_tokens (with ignore_eos)
  int64_t prompt_tokens = 0;       // local count of the first turn's text (system + user)
};

struct DatasetOptions {
  std::string name = "random";  // random, shared-prefix, multi-turn, scenario:chat|summarize|code, jsonl:FILE
  int64_t num_prompts = 100;
  int64_t input_len = 1024, output_len = 128;
  double range_ratio = 0.0;  // lengths drawn uniformly from [len * (1 - r), len * (1 + r)]
  int64_t prefix_len = 1024, num_prefixes = 4, suffix_len = 128;
  int64_t turns = 4;  // multi-turn: requests per conversation
  uint64_t seed = 0;
};

Status validate(const DatasetOptions& options);

// Builds the items; num_prompts requests in all (multi-turn: num_prompts / turns conversations).
Expected<std::vector<BenchItem>> make_dataset(const DatasetOptions& options, const Tokenizer& tokenizer);

// Text of exactly about `len` tokens of `tokenizer`'s vocabulary (random non-special ids).
std::string random_token_text(const Tokenizer& tokenizer, int64_t len, std::mt19937_64& rng);

}  // namespace inferd
