// Float GEMM through oneDNN (Debian's libdnnl): the `--matmul onednn` path for F32, F16 and BF16
// weights. oneDNN's kernels (brgemm / jit gemm, vdpbf16ps for BF16, AMX where the CPU has it)
// beat our float kernel on large batches (BENCHMARKS.md), but their summation order depends on
// the number of tokens, so results are not batch-invariant: the path is only taken on request.
//
// The weight's output rows are split into one slice per thread of our pool; each thread runs
// its slice's oneDNN primitive single-threaded (OpenMP's team size set to 1 on our threads), so
// oneDNN never starts threads of its own. Weights are reordered once, at load, into the layout
// oneDNN picks; F16 weights are expanded to f32 (exact); BF16 weights multiply activations
// rounded to bf16 (round to nearest even).
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "common/status.h"
#include "common/thread_pool.h"
#include "kernels/packed_matmul.h"
#include "tensor/tensor_view.h"

namespace inferd {

class OneDnnWeight final {
 public:
  // Whether this build has oneDNN.
  static bool available();
  // Whether BF16 weights run as BF16 (oneDNN 2.6 has BF16 matmuls from AVX-512 on); elsewhere
  // they are expanded to f32 at load and run as f32.
  static bool bf16_native();
  static bool supports(DType dtype) {
    return dtype == DType::kF32 || dtype == DType::kF16 || dtype == DType::kBF16;
  }

  // One or more matrices of one supported dtype and row length multiplied as one (Q, K, V), or
  // gate and up for the SwiGLU matmul (`swiglu`: the single output gets silu(gate) * up), split
  // into `slices` column blocks (one per pool thread).
  static Expected<OneDnnWeight> create(std::span<const TensorView* const> parts, bool swiglu, int slices);

  // y = x w^T (+ bias) into outputs[p] for each part (one output for SwiGLU); x: [tokens, cols].
  // Engine thread only (it uses scratch buffers of this object).
  void run(const float* x, int64_t tokens, std::span<const QuantMatmulOutput> outputs,
           ThreadPool& pool) const;

  ~OneDnnWeight();
  OneDnnWeight(OneDnnWeight&&) noexcept;
  OneDnnWeight& operator=(OneDnnWeight&&) noexcept;

 private:
  struct Impl;
  OneDnnWeight();
  std::unique_ptr<Impl> impl_;
};

}  // namespace inferd
