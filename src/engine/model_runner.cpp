#include "engine/model_runner.h"

#include <algorithm>

namespace inferd {

ModelRunner::ModelRunner(Transformer& model, KvCache& cache, const KVCacheManager& kv)
    : model_(model), cache_(cache), kv_(kv) {}

Status ModelRunner::execute(const ScheduledBatch& batch) {
  ids_.clear();
  positions_.clear();
  token_sequence_.clear();
  logit_rows_.clear();
  sample_items_.clear();
  sample_first_row_.clear();
  prompt_rows_.clear();
  hidden_rows_.clear();
  pool_rows_.clear();
  slots_.clear();
  sequences_.clear();
  sequence_lora_.clear();
  bool any_lora = false;
  for (size_t i = 0; i < batch.items.size(); ++i) {
    const Request& r = *batch.items[i].request;
    const int64_t first = r.num_computed_tokens;
    const int64_t n = batch.items[i].num_new_tokens;
    AttentionSequence seq{static_cast<int64_t>(ids_.size()), n, first + n, kv_.block_table(r.id)};
    if (r.streaming.enabled()) {
      seq.window = r.streaming.window_tokens;
      seq.sink_len = streaming_sink_len(r.streaming, kv_.block_size());
      seq.evicted = kv_.evicted_blocks(r.id) * kv_.block_size();
    }
    sequences_.push_back(seq);
    sequence_lora_.push_back(r.lora.get());
    any_lora = any_lora || r.lora != nullptr;
    for (int64_t p = first; p < first + n; ++p) {
      ids_.push_back(r.token_at(p));
      positions_.push_back(static_cast<int32_t>(p));
      slots_.push_back(kv_.slot(r.id, p));
      token_sequence_.push_back(static_cast<int32_t>(i));
    }
    if (r.wants_prompt_logprobs()) {
      // Position p's row predicts prompt token p + 1: the due ones up to the prompt's last (the
      // row after the prompt predicts the first output: the sample row below).
      const int64_t from = std::max(first, r.prompt_logprobs_next - 1);
      const int64_t to = std::min(first + n, static_cast<int64_t>(r.prompt.size()) - 1);
      if (from < to) {
        prompt_rows_.push_back(
            {static_cast<int32_t>(i), from + 1, to - from, static_cast<int32_t>(logit_rows_.size())});
        const auto base = static_cast<int64_t>(ids_.size()) - n - first;  // ids_ index of position 0
        for (int64_t p = from; p < to; ++p) logit_rows_.push_back(static_cast<int32_t>(base + p));
      }
    }
    if (r.pooling != Pooling::kNone) {
      // An embedding: the hidden states its pooling reads, and no token to sample.
      int64_t from = first, to = first + n;
      if (r.pooling == Pooling::kLast) from = std::max(first, r.num_tokens() - 1);
      if (r.pooling == Pooling::kCls) to = std::min(to, int64_t{1});
      to = std::max(from, to);
      if (from < to || first + n == r.num_tokens()) {  // rows to pool, or its end (cls: none then)
        pool_rows_.push_back(
            {static_cast<int32_t>(i), from, to - from, static_cast<int32_t>(hidden_rows_.size())});
        const auto base = static_cast<int64_t>(ids_.size()) - n - first;  // ids_ index of position 0
        for (int64_t p = from; p < to; ++p) hidden_rows_.push_back(static_cast<int32_t>(base + p));
      }
      continue;
    }
    const auto drafts = static_cast<int64_t>(r.draft.size());
    if (first + n == r.num_tokens() + drafts) {
      sample_first_row_.push_back(static_cast<int32_t>(logit_rows_.size()));
      for (int64_t j = drafts; j >= 0; --j) logit_rows_.push_back(static_cast<int32_t>(ids_.size() - 1 - j));
      sample_items_.push_back(static_cast<int32_t>(i));
    }
  }
  const auto vocab = static_cast<size_t>(model_.config().vocab_size);
  if (logits_.size() < logit_rows_.size() * vocab) logits_.resize(logit_rows_.size() * vocab);
  const auto dim = static_cast<size_t>(model_.config().hidden_size);
  if (hidden_.size() < hidden_rows_.size() * dim) hidden_.resize(hidden_rows_.size() * dim);
  ForwardBatch fb{ids_, positions_, slots_, token_sequence_, sequences_, logit_rows_, {}, hidden_rows_};
  if (any_lora) fb.sequence_lora = sequence_lora_;
  if (mirror_ != nullptr) INFERD_RETURN_IF_ERROR(mirror_->forward(fb));
  return model_.forward(fb, cache_, logits_, hidden_);
}

Status ModelRunner::copy_block(int32_t src, int32_t dst) {
  if (mirror_ != nullptr) INFERD_RETURN_IF_ERROR(mirror_->copy_block(src, dst));
  cache_.copy_block(src, dst);
  return Status::ok();
}

std::span<const float> ModelRunner::prompt_row(size_t k, size_t j) const {
  const auto vocab = static_cast<size_t>(model_.config().vocab_size);
  const auto row = static_cast<size_t>(prompt_rows_[k].first_row) + j;
  return std::span<const float>(logits_).subspan(row * vocab, vocab);
}

std::span<const float> ModelRunner::hidden_row(size_t k, size_t j) const {
  const auto dim = static_cast<size_t>(model_.config().hidden_size);
  const auto row = static_cast<size_t>(pool_rows_[k].first_row) + j;
  return std::span<const float>(hidden_).subspan(row * dim, dim);
}

std::span<const float> ModelRunner::logits_row(size_t i, size_t j) const {
  const auto vocab = static_cast<size_t>(model_.config().vocab_size);
  const auto row = static_cast<size_t>(sample_first_row_[i]) + j;
  return std::span<const float>(logits_).subspan(row * vocab, vocab);
}

}  // namespace inferd
