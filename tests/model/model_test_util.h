// Running whole prompts through a Transformer for tests: all positions' logits, any batching.
#pragma once

#include <numeric>
#include <vector>

#include "model/transformer.h"

namespace inferd::test {

// Logits of every position of every prompt ([sum of lengths, vocab]), computed in steps: each
// step takes the next `chunk` tokens of every unfinished prompt (chunk 0 = whole prompts), all
// prompts together in one flattened batch when `together`, else one prompt at a time.
// `adapters`: empty, or each prompt's LoRA adapter (null: the base; needs enable_lora()).
inline std::vector<float> all_logits(Transformer& model, const std::vector<std::vector<int32_t>>& prompts,
                                     int64_t chunk, bool together, int64_t block_size = 16,
                                     KvDType kv_dtype = KvDType::kF32,
                                     const std::vector<const LoraAdapter*>& adapters = {}) {
  const ModelConfig& c = model.config();
  int64_t max_len = 0, total = 0;
  for (const auto& p : prompts) {
    max_len = std::max<int64_t>(max_len, static_cast<int64_t>(p.size()));
    total += static_cast<int64_t>(p.size());
  }
  const int64_t blocks_per_seq = (max_len + block_size - 1) / block_size;
  KvCache cache(c.num_layers, blocks_per_seq * static_cast<int64_t>(prompts.size()), block_size, c.kv_dim(),
                kv_dtype, c.head_dim, model.backend().reads_key_groups());
  // Sequence s owns blocks s, s + n, s + 2n, ...: interleaved, so tables are not contiguous.
  std::vector<std::vector<int32_t>> tables(prompts.size());
  for (size_t s = 0; s < prompts.size(); ++s) {
    for (int64_t b = 0; b < blocks_per_seq; ++b)
      tables[s].push_back(
          static_cast<int32_t>(b * static_cast<int64_t>(prompts.size()) + static_cast<int64_t>(s)));
  }
  std::vector<int64_t> offsets(prompts.size(), 0);  // row of each prompt's first logit
  for (size_t s = 1; s < prompts.size(); ++s)
    offsets[s] = offsets[s - 1] + static_cast<int64_t>(prompts[s - 1].size());
  std::vector<float> out(static_cast<size_t>(total * c.vocab_size));
  std::vector<int64_t> done(prompts.size(), 0);
  auto unfinished = [&](size_t s) { return done[s] < static_cast<int64_t>(prompts[s].size()); };
  for (;;) {
    std::vector<size_t> members;
    for (size_t s = 0; s < prompts.size(); ++s) {
      if (unfinished(s) && (together || members.empty())) members.push_back(s);
    }
    if (members.empty()) break;
    std::vector<int32_t> ids, positions, token_seq, rows;
    std::vector<int64_t> slots;
    std::vector<AttentionSequence> seqs;
    std::vector<const LoraAdapter*> seq_lora;
    std::vector<std::pair<size_t, int64_t>> row_owner;  // (prompt, position)
    for (size_t m = 0; m < members.size(); ++m) {
      const size_t s = members[m];
      const int64_t len = static_cast<int64_t>(prompts[s].size());
      const int64_t n = chunk == 0 ? len - done[s] : std::min(chunk, len - done[s]);
      seqs.push_back({static_cast<int64_t>(ids.size()), n, done[s] + n, tables[s]});
      if (!adapters.empty()) seq_lora.push_back(adapters[s]);
      for (int64_t i = 0; i < n; ++i) {
        const int64_t pos = done[s] + i;
        rows.push_back(static_cast<int32_t>(ids.size()));
        row_owner.emplace_back(s, pos);
        ids.push_back(prompts[s][static_cast<size_t>(pos)]);
        positions.push_back(static_cast<int32_t>(pos));
        token_seq.push_back(static_cast<int32_t>(m));
        slots.push_back(tables[s][static_cast<size_t>(pos / block_size)] * block_size + pos % block_size);
      }
      done[s] += n;
    }
    std::vector<float> logits(rows.size() * static_cast<size_t>(c.vocab_size));
    ForwardBatch batch{ids, positions, slots, token_seq, seqs, rows, seq_lora};
    Status st = model.forward(batch, cache, logits);
    if (!st.is_ok()) return {};
    for (size_t r = 0; r < rows.size(); ++r) {
      const auto [s, pos] = row_owner[r];
      std::copy_n(logits.begin() + static_cast<std::ptrdiff_t>(r) * c.vocab_size, c.vocab_size,
                  out.begin() + (offsets[s] + pos) * c.vocab_size);
    }
  }
  return out;
}

}  // namespace inferd::test
