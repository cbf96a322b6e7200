// MirroredKvSource: rank 0's offload loads in a tensor/pipeline-parallel job (docs/parallelism.md).
// Each rank holds its own slice of a block (its heads, its stage's layers) in a store of its own,
// so a block is usable only when every rank loaded its slice. This wraps rank 0's offloader: a
// load rank 0 starts or cancels, the other ranks start or cancel too (through the step mirror);
// a load rank 0 finishes is reported once the group agreed on the fewest blocks any rank loaded.
#pragma once

#include <vector>

#include "engine/step_mirror.h"
#include "kv/kv_cache_manager.h"

namespace inferd {

class MirroredKvSource final : public KvBlockSource {
 public:
  // Neither is owned; both outlive this.
  MirroredKvSource(KvBlockSource& local, StepMirror& mirror) : local_(local), mirror_(mirror) {}
  uint64_t start_load(std::vector<BlockHash> keys, std::vector<int32_t> blocks) override;
  void poll(std::vector<Finished>* finished) override;
  void cancel(uint64_t ticket) override;

 private:
  KvBlockSource& local_;
  StepMirror& mirror_;
  std::vector<Finished> landed_;
};

}  // namespace inferd
