// StepMirror: the other ranks of a tensor-parallel group (docs/parallelism.md). Rank 0 runs the
// scheduler and the engine; before each forward pass, and each KV block copy, it hands the
// step's plain data to the mirror, which sends it to the other ranks so that they run the same
// pass on their slice of the model and their heads' KV. With KV offload tiers, each rank keeps
// its own slice of each offloaded block in a store of its own: rank 0's offloader decides what
// goes out and what comes back, the mirror has the others do the same with their slices, and a
// load counts only the blocks every rank found (docs/parallelism.md). Implemented over MPI in
// parallel/.
#pragma once

#include <cstdint>
#include <span>

#include "common/status.h"
#include "kv/block_pool.h"
#include "model/transformer.h"

namespace inferd {

class StepMirror {
 public:
  virtual ~StepMirror() = default;
  // Engine thread, before rank 0's own forward(batch). An error ends the group's work.
  virtual Status forward(const ForwardBatch& batch) = 0;
  // Engine thread, with rank 0's own KvCache::copy_block(src, dst).
  virtual Status copy_block(int32_t src, int32_t dst) = 0;

  // KV offload tiers (engine thread, each with rank 0's own step of the same name).
  // Rank 0 staged `block` to be stored under `key`: the others stage their slice of it (before
  // any later forward pass overwrites it).
  virtual Status stage_block(int32_t block, const BlockHash& key) = 0;
  // Rank 0 started load `ticket` of keys[i] into blocks[i]: the others start theirs.
  virtual Status start_load(uint64_t ticket, std::span<const BlockHash> keys,
                            std::span<const int32_t> blocks) = 0;
  virtual Status cancel_load(uint64_t ticket) = 0;
  // Rank 0's load `ticket` finished with `loaded` leading blocks: waits for the others' and
  // returns the fewest any rank loaded (what the whole group holds).
  virtual Expected<int64_t> finish_load(uint64_t ticket, int64_t loaded) = 0;
};

}  // namespace inferd
