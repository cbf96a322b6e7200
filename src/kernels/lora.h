// Low-rank (LoRA) updates of a linear layer's output for many adapters in one call: the CPU form
// of Punica's SGMV (a prefill segment: many rows of one adapter) and BGMV (decode rows, each of
// its own adapter). Rows are grouped by adapter; each group's rows are shrunk to its rank
// (s = A x) and expanded back (y += scale * B s), so an adapter's matrices are read once per
// call however many rows use it.
//
// Batch invariance: a row's update is computed in the same order whichever group it is in and
// however many rows that group has (dot4 is bit-identical to dot; the expansion adds rank by
// rank, element by element), so a token's result never depends on the rest of the batch.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "common/thread_pool.h"
#include "kernels/cpu_isa.h"
#include "tensor/dtype.h"

namespace inferd {

// One adapter's matrices for one linear layer and the rows of the batch that use it.
struct LoraGroup {
  const void* a = nullptr;    // [rank, k] row-major (PEFT's lora_A.weight), of `dtype`
  const void* bt = nullptr;   // [rank, n]: lora_B.weight ([n, rank]) transposed, of `dtype`
  DType dtype = DType::kF32;  // kF32, kF16 or kBF16 (expanded to f32 exactly, a slice at a time)
  int64_t rank = 0;
  float scale = 0.0f;             // alpha / rank (alpha / sqrt(rank) with rsLoRA)
  std::span<const int32_t> rows;  // rows of x and y; a row is in at most one group
};

// y[t, :n] += scale * (x[t, :k] A^T) B^T for every row t of every group; x rows are ldx apart,
// y rows ldy apart. The scalar reference: plain loops in index order.
void lora_update_reference(const float* x, int64_t ldx, int64_t k, std::span<const LoraGroup> groups,
                           float* y, int64_t ldy, int64_t n);

// The updates of one linear layer among several that read the same x (Q, K and V; gate and up):
// its adapters' groups and its output, n values per row, rows ldy apart.
struct LoraOutput {
  std::span<const LoraGroup> groups;
  float* y = nullptr;
  int64_t ldy = 0;
  int64_t n = 0;
};

// What lora_update keeps between calls (grown as needed, so that a warmed-up step does not
// allocate): every output's groups in one list, the shrunk rows and where each group's work
// starts.
struct LoraScratch {
  struct Work {
    const LoraGroup* group = nullptr;
    float* y = nullptr;
    int64_t ldy = 0;
    int64_t n = 0;
  };
  std::vector<Work> work;
  std::vector<float> shrunk;
  std::vector<int64_t> shrunk_offset, shrink_items, expand_items;
  PerThread<std::vector<float>> expanded;  // 16-bit rows as f32, each thread's (portable path)
};

// The updates of every output on `pool` with the kernels of `isa` (at most what this CPU runs):
// the shrink of every group of every output in one hand-off, then the expansion in another, so
// that layers reading the same x (Q, K, V) cost two hand-offs, not two each. A row's result is
// the same whichever outputs share the call.
void lora_update(const float* x, int64_t ldx, int64_t k, std::span<const LoraOutput> outputs,
                 LoraScratch& scratch, ThreadPool& pool, Isa isa);

// One output's updates.
inline void lora_update(const float* x, int64_t ldx, int64_t k, std::span<const LoraGroup> groups, float* y,
                        int64_t ldy, int64_t n, LoraScratch& scratch, ThreadPool& pool, Isa isa) {
  const LoraOutput out{groups, y, ldy, n};
  lora_update(x, ldx, k, {&out, 1}, scratch, pool, isa);
}

// out = silu(gate) * up, n values (out may be gate), with the vector exp where the ISA has one:
// the activation of the MLP rows whose gate and up a LoRA adapter changed.
void lora_silu_mul(const float* gate, const float* up, float* out, int64_t n, Isa isa);

}  // namespace inferd
