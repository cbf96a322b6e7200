#include "engine/mirrored_kv_source.h"

#include <algorithm>

#include "common/log.h"

namespace inferd {

uint64_t MirroredKvSource::start_load(std::vector<BlockHash> keys, std::vector<int32_t> blocks) {
  // The other ranks' tickets are rank 0's: the mirror sends the ticket rank 0's offloader gives.
  // Their blocks are the same numbers (every rank's pool is rank 0's, mirrored).
  const std::vector<BlockHash> sent = keys;
  const std::vector<int32_t> into = blocks;
  const uint64_t ticket = local_.start_load(std::move(keys), std::move(blocks));
  if (Status s = mirror_.start_load(ticket, sent, into); !s.is_ok())
    log_error("KV offload: the other ranks did not start load " + std::to_string(ticket) + ": " +
              s.message());
  return ticket;
}

void MirroredKvSource::poll(std::vector<Finished>* finished) {
  landed_.clear();
  local_.poll(&landed_);
  for (Finished& f : landed_) {
    // Every finished load is settled with the group, a cancelled one too: the other ranks wait for
    // their own read of it to end, so none of them still writes the blocks once rank 0 reuses them.
    auto agreed = mirror_.finish_load(f.ticket, f.loaded);
    if (agreed) {
      f.loaded = std::min(f.loaded, *agreed);
    } else {
      f.loaded = 0;
      if (f.error.empty()) f.error = "the other ranks' load failed: " + agreed.status().message();
    }
    finished->push_back(std::move(f));
  }
}

void MirroredKvSource::cancel(uint64_t ticket) {
  local_.cancel(ticket);
  if (Status s = mirror_.cancel_load(ticket); !s.is_ok())
    log_error("KV offload: the other ranks did not cancel load " + std::to_string(ticket) + ": " +
              s.message());
}

}  // namespace inferd
