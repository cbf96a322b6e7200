// model_fingerprint: a 128-bit identity of loaded weights, so KV blocks stored in a shared tier
// (disk, Redis) are only ever loaded by a process serving the same model. Computed once at start
// by the engine when an offload tier is configured.
#pragma once

#include <cstdint>

#include "model/model_weights.h"

namespace inferd {

struct ModelFingerprint {
  uint64_t lo = 0, hi = 0;
};

// XXH3-128 over the config (every field that shapes K/V), each tensor's name, type and shape, and
// its bytes: all of a small tensor, the first and last 64 KiB of a large one. Reading whole
// multi-GB weights at start would cost seconds; two checkpoints that differ only inside that
// window of every tensor are not a case we guard against.
ModelFingerprint model_fingerprint(const ModelWeights& weights);

}  // namespace inferd
