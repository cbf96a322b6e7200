// Tensor parallelism (docs/parallelism.md): a model split across the ranks of a group, each
// holding a slice of every layer. Attention is split by KV head (with each KV head's query
// heads): Q, K and V by rows (column-parallel), O by columns (row-parallel); the dense MLP by
// intermediate channel (gate and up by rows, down by columns); the vocabulary projection by
// vocabulary rows. Each layer sums its row-parallel partial results with one all-reduce after
// attention and one after the MLP, and rank 0 gathers the logits. The embedding table and the
// norms are whole on every rank. The group's transport (MPI) lives in the parallel module.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "common/status.h"
#include "model/model_weights.h"

namespace inferd {

// The ranks one forward pass is split across. Every call is collective: all ranks make it, in
// the same order, with the same sizes.
class TensorParallelGroup {
 public:
  virtual ~TensorParallelGroup() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // data = the element-wise sum of every rank's data, on every rank.
  virtual Status all_reduce_sum(std::span<float> data) = 0;
  // Rank 0: all = rank 0's local, then rank 1's, ... (rank r sends counts[r] floats); `all`
  // is ignored on the other ranks.
  virtual Status gather(std::span<const float> local, std::span<const int64_t> counts,
                        std::span<float> all) = 0;
};

// Rows [begin, end) of the vocabulary projection that `rank` of `size` holds (an even split).
std::pair<int64_t, int64_t> tensor_shard_vocab_range(int64_t vocab_size, int rank, int size);

// The slice of `rank` (of `size`) for `weights` (whole, as loaded). KV heads split as evenly as
// they go (the first ranks get the extra ones, so rank 0, which sizes the KV pool, holds the most); the
// intermediate channels in units of the down projection's quantization block (a MoE model's every
// routed expert and its shared expert the same way, the router whole on every rank); the vocabulary
// evenly. Errors, naming the reason: fewer KV heads than ranks, fewer blocks of an MLP's
// intermediate channels than ranks.
Expected<TensorShard> plan_tensor_shard(const ModelWeights& weights, int rank, int size);

// Turns `weights` (whole, as loaded, or one pipeline stage's layers from pipeline_weights) into
// rank shard.rank's slice: the config's num_heads,
// num_kv_heads and intermediate_size become the rank's; row slices are views into the same
// memory maps (only those pages are ever read), column slices (O, down) copies the ModelWeights
// owns. A column boundary inside a quantization block (e.g. Q4_K's 256 values at a head
// boundary) is dequantized to F32 for that matrix (exact; logged). vocab_size stays the whole
// vocabulary (token ids, logits); lm_head holds the rank's rows.
Status shard_weights(ModelWeights& weights, const TensorShard& shard);

}  // namespace inferd
