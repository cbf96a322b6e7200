#include "engine/draft_proposer.h"

#include <algorithm>
#include <chrono>

#include "common/check.h"

namespace inferd {

DraftProposer::DraftProposer(Transformer& draft, int64_t num_blocks, int32_t block_size, KvDType dtype)
    : model_(draft),
      cache_(draft.config().num_layers, num_blocks, block_size, draft.config().kv_dim(), dtype,
             draft.config().head_dim, draft.backend().reads_key_groups()),
      pool_(static_cast<int32_t>(num_blocks)),
      kv_(pool_, block_size, /*prefix_caching=*/false),
      runner_(draft, cache_, kv_) {}

DraftProposer::Sequence& DraftProposer::sequence_of(const Request& r) {
  std::unique_ptr<Sequence>& slot = sequences_[r.id];
  if (!slot) {
    slot = std::make_unique<Sequence>();
    slot->shadow.id = r.id;
    slot->shadow.prompt = r.prompt;
  }
  Request& s = slot->shadow;
  // The computed tokens the target's history still has stay (the accepted drafts among them);
  // from the first difference on, the draft's K/V is computed again over the same slots.
  const auto common = static_cast<int64_t>(
      std::mismatch(s.output.begin(), s.output.end(), r.output.begin(), r.output.end()).first -
      s.output.begin());
  s.num_computed_tokens = std::min(s.num_computed_tokens, static_cast<int64_t>(s.prompt.size()) + common);
  s.output.assign(r.output.begin(), r.output.end());
  slot->last_step = step_;
  return *slot;
}

bool DraftProposer::allocate(Sequence& seq, int64_t tokens) {
  while (!kv_.allocate_slots(seq.shadow.id, tokens)) {
    // The sequence idle the longest gives its blocks back (it computes again if it drafts later).
    auto victim = sequences_.end();
    for (auto it = sequences_.begin(); it != sequences_.end(); ++it) {
      if (it->second->last_step < step_ &&
          (victim == sequences_.end() || it->second->last_step < victim->second->last_step))
        victim = it;
    }
    if (victim == sequences_.end()) return false;
    kv_.free(victim->first);
    sequences_.erase(victim);
    ++evictions_;
  }
  return true;
}

void DraftProposer::release(RequestId id) {
  if (sequences_.erase(id) > 0) kv_.free(id);
}

void DraftProposer::propose(ScheduledBatch* batch) {
  const auto t0 = std::chrono::steady_clock::now();
  ++step_;
  work_.clear();
  for (ScheduledItem& item : batch->items) {
    if (item.num_draft_tokens > 0) work_.push_back({&item, &sequence_of(*item.request), 0});
  }
  if (work_.empty()) return;
  for (Work& w : work_) {
    // The sequence computes its tokens and all drafts but the last.
    if (allocate(*w.seq, w.seq->shadow.num_tokens() + w.item->num_draft_tokens - 1)) continue;
    batch->num_tokens -= w.item->num_draft_tokens;
    w.item->num_new_tokens -= w.item->num_draft_tokens;
    w.item->num_draft_tokens = 0;
    w.item->request->draft.clear();
    w.item = nullptr;
    ++dropped_;
  }
  const auto vocab = static_cast<size_t>(model_.config().vocab_size);
  for (;;) {
    pass_.items.clear();
    pass_.num_tokens = 0;
    pass_work_.clear();
    for (size_t i = 0; i < work_.size(); ++i) {
      const Work& w = work_[i];
      if (w.item == nullptr || w.produced == w.item->num_draft_tokens) continue;
      Request& s = w.seq->shadow;
      const int64_t n = std::min(kChunk, s.num_uncomputed_tokens());
      INFERD_CHECK(n >= 1);
      pass_.items.push_back({&s, n, 0});
      pass_.num_tokens += n;
      pass_work_.push_back(i);
    }
    if (pass_.items.empty()) break;
    const Status status = runner_.execute(pass_);
    INFERD_CHECK_MSG(status.is_ok(), status.message().c_str());  // batches are built here: a failure is a bug
    ++forward_passes_;
    for (const ScheduledItem& p : pass_.items) p.request->num_computed_tokens += p.num_new_tokens;
    const auto sampled = runner_.sample_items();
    for (size_t k = 0; k < sampled.size(); ++k) {
      Work& w = work_[pass_work_[static_cast<size_t>(sampled[k])]];
      const std::span<const float> logits = runner_.logits_row(k);
      INFERD_CHECK(logits.size() == vocab);
      const auto token =
          static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
      w.seq->shadow.output.push_back(token);
      w.item->request->draft[static_cast<size_t>(w.produced++)] = token;
    }
  }
  seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace inferd
