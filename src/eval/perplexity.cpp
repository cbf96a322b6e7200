#include "eval/perplexity.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

namespace inferd {

Status PerplexityOptions::validate() const {
  if (context < 4) return invalid_argument("--context must be at least 4 tokens");
  if (max_chunks < 0) return invalid_argument("--chunks must be >= 0");
  if (streaming.enabled() && (streaming.window_tokens < 16 || streaming.sink_tokens < 0))
    return invalid_argument("--streaming-llm needs SINK >= 0 and WINDOW >= 16");
  return Status::ok();
}

namespace {

// Logits of positions [first, context - 1) of one chunk, from an empty cache.
Status chunk_logits(Transformer& model, std::span<const int32_t> chunk, int64_t first, KvCache& cache,
                    const LoraAdapter* lora, const StreamingWindow& streaming, std::vector<float>* logits) {
  const auto n = static_cast<int64_t>(chunk.size());
  const int64_t block = cache.block_size();
  std::vector<int32_t> table(static_cast<size_t>((n + block - 1) / block));
  std::iota(table.begin(), table.end(), 0);
  std::vector<int32_t> positions(static_cast<size_t>(n)), token_seq(static_cast<size_t>(n), 0), rows;
  std::vector<int64_t> slots(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    positions[static_cast<size_t>(i)] = static_cast<int32_t>(i);
    slots[static_cast<size_t>(i)] = i;  // blocks 0, 1, ... in order
  }
  for (int64_t i = first; i < n - 1; ++i) rows.push_back(static_cast<int32_t>(i));
  AttentionSequence seq{0, n, n, table};
  if (streaming.enabled()) {
    seq.window = streaming.window_tokens;
    seq.sink_len = streaming_sink_len(streaming, block);
  }
  logits->resize(rows.size() * static_cast<size_t>(model.config().vocab_size));
  ForwardBatch batch{chunk, positions, slots, token_seq, {&seq, 1}, rows, {}};
  if (lora != nullptr) batch.sequence_lora = {&lora, 1};
  return model.forward(batch, cache, *logits);
}

// log-softmax of one row in double: fills logp.
void log_softmax(const float* row, int64_t vocab, std::vector<double>* logp) {
  logp->resize(static_cast<size_t>(vocab));
  const double mx = *std::max_element(row, row + vocab);
  double sum = 0;
  for (int64_t v = 0; v < vocab; ++v) sum += std::exp(static_cast<double>(row[v]) - mx);
  const double lse = mx + std::log(sum);
  for (int64_t v = 0; v < vocab; ++v) (*logp)[static_cast<size_t>(v)] = static_cast<double>(row[v]) - lse;
}

}  // namespace

Expected<PerplexityResult> perplexity(Transformer& model, std::span<const int32_t> tokens,
                                      const PerplexityOptions& o, Transformer* reference) {
  INFERD_RETURN_IF_ERROR(o.validate());
  const ModelConfig& c = model.config();
  if (o.context > c.max_position_embeddings)
    return invalid_argument("--context " + std::to_string(o.context) + " exceeds the model's " +
                            std::to_string(c.max_position_embeddings) + " positions");
  int64_t chunks = static_cast<int64_t>(tokens.size()) / o.context;
  if (chunks == 0)
    return invalid_argument("the text has " + std::to_string(tokens.size()) +
                            " tokens, fewer than one chunk of " + std::to_string(o.context));
  if (o.max_chunks > 0) chunks = std::min(chunks, o.max_chunks);
  const int64_t block = 16;
  KvCache cache(c.num_layers, (o.context + block - 1) / block, block, c.kv_dim(), o.kv_dtype, c.head_dim,
                model.backend().reads_key_groups());
  const int64_t first = o.context / 2;
  const int64_t vocab = c.vocab_size;
  PerplexityResult r;
  r.chunks = chunks;
  r.has_reference = reference != nullptr;
  double nll = 0, ref_nll = 0, kl = 0;
  int64_t agree = 0;
  std::vector<float> logits, ref_logits;
  std::vector<double> logp, ref_logp;
  for (int64_t ch = 0; ch < chunks; ++ch) {
    const auto chunk = tokens.subspan(static_cast<size_t>(ch * o.context), static_cast<size_t>(o.context));
    INFERD_RETURN_IF_ERROR(chunk_logits(model, chunk, first, cache, o.lora, o.streaming, &logits));
    if (reference != nullptr)
      INFERD_RETURN_IF_ERROR(
          chunk_logits(*reference, chunk, first, cache, o.reference_lora, {}, &ref_logits));
    for (int64_t i = first; i < o.context - 1; ++i) {
      const size_t row = static_cast<size_t>(i - first) * static_cast<size_t>(vocab);
      const auto next = static_cast<size_t>(chunk[static_cast<size_t>(i + 1)]);
      log_softmax(logits.data() + row, vocab, &logp);
      nll -= logp[next];
      ++r.scored_tokens;
      if (reference == nullptr) continue;
      log_softmax(ref_logits.data() + row, vocab, &ref_logp);
      ref_nll -= ref_logp[next];
      double k = 0;
      for (int64_t v = 0; v < vocab; ++v) {
        const double lp = ref_logp[static_cast<size_t>(v)];
        k += std::exp(lp) * (lp - logp[static_cast<size_t>(v)]);
      }
      kl += k;
      r.max_kl = std::max(r.max_kl, k);
      const auto am = std::max_element(logits.begin() + static_cast<std::ptrdiff_t>(row),
                                       logits.begin() + static_cast<std::ptrdiff_t>(row) + vocab);
      const auto ref_am = std::max_element(ref_logits.begin() + static_cast<std::ptrdiff_t>(row),
                                           ref_logits.begin() + static_cast<std::ptrdiff_t>(row) + vocab);
      if (am - logits.begin() == ref_am - ref_logits.begin()) ++agree;
    }
  }
  const auto n = static_cast<double>(r.scored_tokens);
  r.mean_nll = nll / n;
  r.perplexity = std::exp(r.mean_nll);
  if (reference != nullptr) {
    r.reference_perplexity = std::exp(ref_nll / n);
    r.mean_kl = kl / n;
    r.top1_agreement = static_cast<double>(agree) / n;
  }
  return r;
}

}  // namespace inferd
