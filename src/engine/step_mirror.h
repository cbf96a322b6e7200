// StepMirror: the other ranks of a tensor-parallel group (docs/parallelism.md). Rank 0 runs the
// scheduler and the engine; before each forward pass, and each KV block copy, it hands the
// step's plain data to the mirror, which sends it to the other ranks so that they run the same
// pass on their slice of the model and their heads' KV. Implemented over MPI in parallel/.
#pragma once

#include <cstdint>

#include "common/status.h"
#include "model/transformer.h"

namespace inferd {

class StepMirror {
 public:
  virtual ~StepMirror() = default;
  // Engine thread, before rank 0's own forward(batch). An error ends the group's work.
  virtual Status forward(const ForwardBatch& batch) = 0;
  // Engine thread, with rank 0's own KvCache::copy_block(src, dst).
  virtual Status copy_block(int32_t src, int32_t dst) = 0;
};

}  // namespace inferd
