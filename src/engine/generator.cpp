#include "engine/generator.h"

#include <algorithm>
#include <chrono>
#include <numeric>

namespace inferd {

namespace {
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

Expected<GenerationStats> generate(Transformer& model, const std::vector<int32_t>& prompt,
                                   const GenerationOptions& options,
                                   const std::function<void(int32_t)>& on_token) {
  const ModelConfig& c = model.config();
  if (prompt.empty()) return invalid_argument("the prompt is empty");
  if (options.max_tokens < 1) return invalid_argument("max_tokens must be >= 1");
  INFERD_RETURN_IF_ERROR(options.sampling.validate());
  const auto prompt_len = static_cast<int64_t>(prompt.size());
  const int64_t total = prompt_len + options.max_tokens;
  if (total > c.max_position_embeddings) {
    return invalid_argument("prompt (" + std::to_string(prompt_len) + " tokens) + max_tokens (" +
                            std::to_string(options.max_tokens) + ") exceeds the context window of " +
                            std::to_string(c.max_position_embeddings));
  }
  const int64_t bs = options.block_size;
  const int64_t num_blocks = (total + bs - 1) / bs;
  KvCache cache(c.num_layers, num_blocks, bs, c.kv_dim(), options.kv_dtype);
  std::vector<int32_t> block_table(static_cast<size_t>(num_blocks));
  std::iota(block_table.begin(), block_table.end(), 0);

  Sampler sampler(options.sampling);
  std::vector<float> logits(static_cast<size_t>(c.vocab_size));
  std::vector<int32_t> positions(prompt.size());
  std::vector<int64_t> slots(prompt.size());
  std::iota(positions.begin(), positions.end(), 0);
  std::iota(slots.begin(), slots.end(), 0);
  std::vector<int32_t> token_sequence(prompt.size(), 0);
  AttentionSequence seq{0, prompt_len, prompt_len, block_table};
  int32_t last_row = static_cast<int32_t>(prompt_len - 1);

  GenerationStats stats;
  stats.prompt_tokens = prompt_len;
  auto t0 = std::chrono::steady_clock::now();
  ForwardBatch batch{prompt, positions, slots, token_sequence, {&seq, 1}, {&last_row, 1}};
  INFERD_RETURN_IF_ERROR(model.forward(batch, cache, logits));

  int32_t token = sampler.sample(logits);
  stats.prefill_seconds = seconds_since(t0);
  auto t1 = std::chrono::steady_clock::now();
  int32_t zero = 0;
  for (int64_t i = 0;; ++i) {
    on_token(token);
    ++stats.generated_tokens;
    const bool stop = std::find(options.stop_token_ids.begin(), options.stop_token_ids.end(), token) !=
                      options.stop_token_ids.end();
    if (stop || stats.generated_tokens >= options.max_tokens) break;
    const int64_t pos = prompt_len + i;
    int32_t position = static_cast<int32_t>(pos);
    int64_t slot = pos;
    AttentionSequence step{0, 1, pos + 1, block_table};
    ForwardBatch one{{&token, 1}, {&position, 1}, {&slot, 1}, {&zero, 1}, {&step, 1}, {&zero, 1}};
    INFERD_RETURN_IF_ERROR(model.forward(one, cache, logits));
    token = sampler.sample(logits);
  }
  stats.decode_seconds = seconds_since(t1);
  return stats;
}

}  // namespace inferd
