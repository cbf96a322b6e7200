// Backend: the narrow set of ops model code calls — linear layers over weights the backend
// prepared (RMSNorm fused in front where its kernel can), attention over the paged KV cache,
// RMSNorm, RoPE, SwiGLU's activation and the embedding lookup — implemented per target and
// chosen once at start-up. Model code names no kernel, ISA or library: the ISA is given to the
// backend when it is made. Targets: the packed CPU kernels (default), the f32 reference path,
// oneDNN for BF16 weights, and CUDA (kernels/cuda/ in a build with -DINFERD_CUDA=ON; a stub
// saying it is not compiled in otherwise).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>

#include "common/status.h"
#include "common/thread_pool.h"
#include "kernels/attention.h"
#include "kernels/cpu_isa.h"
#include "kernels/lora.h"
#include "kernels/ops.h"
#include "kernels/packed_matmul.h"
#include "tensor/tensor_view.h"

namespace inferd {

enum class BackendKind {
  // CPU, default: weights repacked at load into 16-row tiles. Block-quantized weights (GGUF Q8_0,
  // Q5_0, Q5_1, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K, inferd's I8 / Q4_G*) with activations quantized to
  // int8 per block of 32 and exact integer dot products (VNNI / AVX2), as llama.cpp does; F32 /
  // F16 / BF16 / FP8 weights (where AVX-512 runs them) with f32 fmas on the stored values.
  kPacked,
  // CPU: weights expanded to f32 row by row and multiplied in f32: several times slower; matches
  // an f32 reference run on the dequantized weights to ~1e-5 relative.
  kF32,
  // CPU: BF16 weights through oneDNN's GEMM (activations rounded to bf16), the rest as kPacked.
  // Faster prefill on BF16 weights, but a token's result depends on the batch it is in: not
  // batch-invariant. Needs a build with oneDNN.
  kOneDnn,
  // NVIDIA GPUs (kernels/cuda/cuda_backend.cpp): weights on the GPU, cuBLAS GEMMs for F32 / F16 /
  // BF16 (not batch-invariant), our W8A8 kernel for Q8_0, paged attention on the GPU. Needs a
  // build with -DINFERD_CUDA=ON and a device (make_backend says which is missing).
  kCuda,
};
std::string_view backend_name(BackendKind kind);

// Where one part of a linear layer's result goes: y[t * ld + r] for its rows r, + bias[r].
using LinearOutput = QuantMatmulOutput;

// A linear layer's weights as one backend keeps them (repacked tiles, oneDNN memory, or the
// file's view for the f32 path). Opaque to model code; made by Backend::prepare_linear.
class LinearWeights {
 public:
  virtual ~LinearWeights() = default;
};

// One matmul of Backend::grouped_linear: x [tokens, k] through w into out.
struct LinearGroup {
  const LinearWeights* w = nullptr;  // one part, or a SwiGLU (gate, up) pair
  const float* x = nullptr;
  int64_t tokens = 0;
  int64_t k = 0;
  LinearOutput out;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual BackendKind kind() const = 0;
  // Whether attention() takes K in groups of 16 slots (KvLayerView::key_groups): the CPU kernels
  // do; a backend that copies the cache's bytes to a device reads rows.
  virtual bool reads_key_groups() const { return kind() != BackendKind::kCuda; }

  // Prepares `parts` (row-stacked into one matmul: Q, K and V) or, with `swiglu`, the pair
  // (gate, up) for linear(). Never fails for a dtype the loader accepts: where the backend has
  // no kernel for it, the weights stay the file's view and multiply in f32. Views: not owned.
  virtual std::unique_ptr<LinearWeights> prepare_linear(std::span<const TensorView* const> parts,
                                                        bool swiglu) = 0;
  // outputs[p] = x' W_p^T (+ bias_p) for each part p, where x' = rms_norm(x, norm_weight, eps)
  // row by row when norm_weight is given, else x; with swiglu one output = silu(x' gate^T) *
  // (x' up^T), or two outputs = x' gate^T and x' up^T (for LoRA updates before the silu). x: [tokens, k].
  // Engine thread only (backends keep scratch buffers).
  virtual void linear(const float* x, int64_t tokens, int64_t k, const float* norm_weight, float eps,
                      const LinearWeights& w, std::span<const LinearOutput> outputs) = 0;
  // linear(g.x, g.tokens, g.k, nullptr, 0, *g.w, {&g.out, 1}) for every group g, with the same
  // results bit for bit, in one hand-off to the threads where the backend can: the experts a
  // mixture-of-experts step selected run as one op however few rows each got. Engine thread only.
  virtual void grouped_linear(std::span<const LinearGroup> groups) = 0;
  // out[t] = softmax(q[t] K^T * scale) V over token t's sequence's cached positions.
  virtual void attention(const float* q, std::span<const AttentionSequence> sequences,
                         std::span<const int32_t> token_sequence, const KvLayerView& kv,
                         const AttentionShape& shape, float* out) = 0;
  // y[r] = x[r] / rms(x[r]) * weight for each of `rows` rows of n values (y may be x).
  virtual void rms_norm(const float* x, const float* weight, float* y, int64_t rows, int64_t n,
                        float eps) = 0;
  // RoPE of every query and key head of one token at `pos`, cos and sin multiplied by `scale`.
  // cos_sin: null, or rope_cos_sin's values for (pos, inv_freq, scale), which the backend may
  // take instead of computing them (a prompt's tokens compute them once for every layer).
  virtual void rope_qk(float* q, int64_t num_q_heads, float* k, int64_t num_kv_heads, int64_t head_dim,
                       int64_t pos, const float* inv_freq, RopePairing pairing, float scale,
                       const float* cos_sin) = 0;
  // out = silu(gate) * up, n values.
  virtual void silu_mul(const float* gate, const float* up, float* out, int64_t n) = 0;
  // The pool over which the model may split per-token work that calls rms_norm() and rope_qk()
  // (and writes the host KV cache) from several threads at once; null where those ops must run on
  // the engine thread alone (a device backend's stream and staging buffers).
  virtual ThreadPool* row_pool() { return nullptr; }
  // y[t] += scale * (x[t] A^T) B^T for the rows of each group of each output (kernels/lora.h):
  // many LoRA adapters' updates of the linear layers reading x in one call. Engine thread only.
  virtual void lora_update(const float* x, int64_t ldx, int64_t k, std::span<const LoraOutput> outputs) = 0;
  // out = silu(gate) * up for the MLP rows a LoRA adapter changed (kernels/lora.h).
  virtual void lora_silu_mul(const float* gate, const float* up, float* out, int64_t n) = 0;
  // out[t] = table[ids[t]] as f32 rows.
  virtual void embed(const TensorView& table, std::span<const int32_t> ids, float* out) = 0;
};

// The ops every backend runs on the CPU kernels today (CUDA's too, for now): LoRA updates and the
// embedding lookup (the table stays in host memory), on `pool` with the kernels of `isa`.
class CpuKernelOps : public Backend {
 public:
  CpuKernelOps(Isa isa, ThreadPool& pool) : isa_(isa), pool_(pool) {}
  void lora_update(const float* x, int64_t ldx, int64_t k, std::span<const LoraOutput> outputs) override;
  void lora_silu_mul(const float* gate, const float* up, float* out, int64_t n) override;
  void embed(const TensorView& table, std::span<const int32_t> ids, float* out) override;

 protected:
  Isa isa_;
  ThreadPool& pool_;

 private:
  LoraScratch lora_scratch_;
};

// The backend of `kind` on `isa` (at most what this CPU runs; active_isa() in production,
// each path in tests), running on `pool` (not owned, must outlive it). Errors: oneDNN or CUDA
// not compiled into this build.
Expected<std::unique_ptr<Backend>> make_backend(BackendKind kind, Isa isa, ThreadPool& pool);

// The CUDA backend (kernels/cuda/ when built with it; a stub that says so otherwise).
Expected<std::unique_ptr<Backend>> make_cuda_backend(ThreadPool& pool);
// Ok where make_cuda_backend can succeed: built with CUDA and a device found; else why not.
Status cuda_backend_available();

}  // namespace inferd
