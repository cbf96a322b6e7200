#include "kernels/backend.h"

#include <algorithm>
#include <vector>

#include "common/check.h"
#include "common/mapped_file.h"
#include "kernels/matmul.h"
#include "kernels/onednn_matmul.h"
#include "tensor/dequantize.h"

namespace inferd {

std::string_view backend_name(BackendKind kind) {
  switch (kind) {
    case BackendKind::kPacked: return "packed";
    case BackendKind::kF32: return "f32";
    case BackendKind::kOneDnn: return "onednn";
    case BackendKind::kCuda: return "cuda";
  }
  return "?";
}

namespace {

// The file's views, multiplied in f32 row by row: the reference path, for any dtype.
struct ViewLinear final : LinearWeights {
  std::vector<const TensorView*> parts;
  bool swiglu = false;
};
struct PackedLinear final : LinearWeights {
  explicit PackedLinear(PackedWeight w) : packed(std::move(w)) {}
  PackedWeight packed;
};
struct OneDnnLinear final : LinearWeights {
  explicit OneDnnLinear(OneDnnWeight w) : onednn(std::move(w)) {}
  OneDnnWeight onednn;
};
// Matrices of one linear in different dtypes (llama-quantize's K-quant mixes store attn_v, and
// some layers' ffn_down, in a larger type than Q and K): each run of parts in one dtype prepared
// on its own, so that every part keeps its packed kernel. A SwiGLU pair in two dtypes: gate and
// up apart, silu(gate) * up after.
struct SplitLinear final : LinearWeights {
  struct Piece {
    size_t first, count;  // the parts (and outputs) it covers
    std::unique_ptr<LinearWeights> w;
  };
  std::vector<Piece> pieces;
  bool swiglu = false;
  int64_t gate_rows = 0;
};

// The CPU backends: kPacked, kF32 and kOneDnn differ only in how they prepare and multiply
// linear weights; the other ops are the same kernels on the backend's ISA.
class CpuBackend final : public CpuKernelOps {
 public:
  CpuBackend(BackendKind kind, Isa isa, ThreadPool& pool) : CpuKernelOps(isa, pool), kind_(kind) {}
  BackendKind kind() const override { return kind_; }

  std::unique_ptr<LinearWeights> prepare_linear(std::span<const TensorView* const> parts,
                                                bool swiglu) override {
    // oneDNN where it beats our kernels: BF16 weights (vdpbf16ps / AMX-BF16; on F32 it measured
    // level with the packed float kernel, on F16 expanded to f32 slower: BENCHMARKS.md).
    if (kind_ == BackendKind::kOneDnn && parts[0]->dtype == DType::kBF16) {
      if (auto w = OneDnnWeight::create(parts, swiglu, pool_.num_threads()))
        return std::make_unique<OneDnnLinear>(std::move(w).value());
    }
    if (kind_ != BackendKind::kF32 && packable(parts) && !one_dtype(parts)) {
      auto split = std::make_unique<SplitLinear>();
      split->swiglu = swiglu;
      split->gate_rows = parts[0]->num_rows();
      for (size_t i = 0; i < parts.size();) {
        size_t j = i + 1;
        while (j < parts.size() && !swiglu && parts[j]->dtype == parts[i]->dtype) ++j;
        split->pieces.push_back({i, j - i, prepare_linear(parts.subspan(i, j - i), false)});
        i = j;
      }
      return split;
    }
    if (kind_ != BackendKind::kF32 && packable(parts)) {
      auto packed = swiglu ? PackedWeight::pack_swiglu(*parts[0], *parts[1], &pool_)
                           : PackedWeight::pack(parts, &pool_);
      if (packed) {
        // The kernels read the packed copy only: the file's pages of these weights go back to the
        // system (a model in memory once, not twice; read again from the file if ever needed).
        for (const TensorView* part : parts) release_mapped_pages(part->data, part->num_bytes);
        return std::make_unique<PackedLinear>(std::move(packed).value());
      }
    }
    auto view = std::make_unique<ViewLinear>();
    view->parts.assign(parts.begin(), parts.end());
    view->swiglu = swiglu;
    return view;
  }

  void linear(const float* x, int64_t tokens, int64_t k, const float* norm_weight, float eps,
              const LinearWeights& w, std::span<const LinearOutput> outputs) override {
    if (const auto* s = dynamic_cast<const SplitLinear*>(&w))
      return split_linear(x, tokens, k, norm_weight, eps, *s, outputs);
    if (const auto* p = dynamic_cast<const PackedLinear*>(&w); p != nullptr && !p->packed.is_float()) {
      // Block-quantized weights: int8 activations, the norm fused into their quantization.
      if (norm_weight != nullptr) {
        quantized_.quantize_rms_norm(x, norm_weight, eps, tokens, k, isa_, &pool_);
      } else {
        quantized_.quantize(x, tokens, k, isa_, &pool_);
      }
      return quant_matmul(quantized_, p->packed, outputs, pool_, isa_);
    }
    const float* in = x;
    if (norm_weight != nullptr) {
      grow(normed_, tokens * k);
      float* y = normed_.data();
      for_rows(&pool_, tokens, [&](int64_t begin, int64_t end) {
        rms_norm(x + begin * k, norm_weight, y + begin * k, end - begin, k, eps);
      });
      in = y;
    }
    if (const auto* p = dynamic_cast<const PackedLinear*>(&w))
      return float_matmul(in, tokens, p->packed, outputs, pool_, isa_);
    if (const auto* o = dynamic_cast<const OneDnnLinear*>(&w))
      return o->onednn.run(in, tokens, outputs, pool_);
    const auto& v = static_cast<const ViewLinear&>(w);
    if (v.swiglu && outputs.size() == 2) {  // gate and up as they are
      matmul(in, tokens, *v.parts[0], nullptr, outputs[0].y, pool_, isa_);
      return matmul(in, tokens, *v.parts[1], nullptr, outputs[1].y, pool_, isa_);
    }
    if (v.swiglu) {  // outputs[0] = silu(x gate^T) * (x up^T)
      const int64_t rows = v.parts[0]->num_rows();
      INFERD_CHECK(outputs.size() == 1 && outputs[0].ld == rows);
      grow(up_, tokens * rows);
      matmul(in, tokens, *v.parts[0], nullptr, outputs[0].y, pool_, isa_);
      matmul(in, tokens, *v.parts[1], nullptr, up_.data(), pool_, isa_);
      return silu_mul(outputs[0].y, up_.data(), outputs[0].y, tokens * rows);
    }
    INFERD_CHECK(outputs.size() == v.parts.size());
    for (size_t i = 0; i < v.parts.size(); ++i) {
      INFERD_CHECK(outputs[i].ld == v.parts[i]->num_rows());
      matmul(in, tokens, *v.parts[i], outputs[i].bias, outputs[i].y, pool_, isa_);
    }
  }

  void grouped_linear(std::span<const LinearGroup> groups) override {
    // Packed groups run as one packed_matmul_groups, each block-quantized group's rows quantized
    // into its own scratch; the others (the f32 path, oneDNN) one linear() at a time.
    packed_groups_.clear();
    if (grouped_quantized_.size() < groups.size()) grouped_quantized_.resize(groups.size());
    for (size_t i = 0; i < groups.size(); ++i) {
      const LinearGroup& g = groups[i];
      const auto* p = dynamic_cast<const PackedLinear*>(g.w);
      if (p == nullptr) {
        linear(g.x, g.tokens, g.k, nullptr, 0.0f, *g.w, {&g.out, 1});
        continue;
      }
      PackedMatmulGroup pg{&p->packed, nullptr, nullptr, g.tokens, g.out};
      if (p->packed.is_float()) {
        pg.x_f32 = g.x;
      } else if (g.tokens > 0) {
        grouped_quantized_[i].quantize(g.x, g.tokens, g.k, isa_, &pool_);
        pg.x = &grouped_quantized_[i];
      }
      packed_groups_.push_back(pg);
    }
    packed_matmul_groups(packed_groups_, pool_, isa_);
  }

  void attention(const float* q, std::span<const AttentionSequence> sequences,
                 std::span<const int32_t> token_sequence, const KvLayerView& kv, const AttentionShape& shape,
                 float* out) override {
    paged_attention(q, sequences, token_sequence, kv, shape, out, pool_, isa_);
  }

  void rms_norm(const float* x, const float* weight, float* y, int64_t rows, int64_t n, float eps) override {
    for (int64_t r = 0; r < rows; ++r) inferd::rms_norm(x + r * n, weight, y + r * n, n, eps);
  }

  void rope_qk(float* q, int64_t num_q_heads, float* k, int64_t num_kv_heads, int64_t head_dim, int64_t pos,
               const float* inv_freq, RopePairing pairing, float scale, const float* cos_sin) override {
    if (cos_sin != nullptr) return rope_qk_table(q, num_q_heads, k, num_kv_heads, head_dim, cos_sin, pairing);
    inferd::rope_qk(q, num_q_heads, k, num_kv_heads, head_dim, pos, inv_freq, pairing, scale);
  }

  void silu_mul(const float* gate, const float* up, float* out, int64_t n) override {
    inferd::silu_mul(gate, up, out, n);
  }

  ThreadPool* row_pool() override { return &pool_; }

 private:
  void split_linear(const float* x, int64_t tokens, int64_t k, const float* norm_weight, float eps,
                    const SplitLinear& s, std::span<const LinearOutput> outputs) {
    // Pieces all on the integer kernels share one quantization of the (normed) activations: the
    // bits each piece's own linear() would make.
    const bool shared = std::all_of(s.pieces.begin(), s.pieces.end(), [](const SplitLinear::Piece& p) {
      const auto* q = dynamic_cast<const PackedLinear*>(p.w.get());
      return q != nullptr && !q->packed.is_float();
    });
    if (shared) {
      if (norm_weight != nullptr) {
        quantized_.quantize_rms_norm(x, norm_weight, eps, tokens, k, isa_, &pool_);
      } else {
        quantized_.quantize(x, tokens, k, isa_, &pool_);
      }
    }
    auto run = [&](const SplitLinear::Piece& p, std::span<const LinearOutput> outs) {
      if (shared)
        return quant_matmul(quantized_, static_cast<const PackedLinear&>(*p.w).packed, outs, pool_, isa_);
      linear(x, tokens, k, norm_weight, eps, *p.w, outs);
    };
    if (!s.swiglu || outputs.size() == 2) {  // one output per part (a SwiGLU pair's gate and up as they are)
      INFERD_CHECK(outputs.size() == s.pieces.back().first + s.pieces.back().count);
      for (const SplitLinear::Piece& p : s.pieces) run(p, outputs.subspan(p.first, p.count));
      return;
    }
    // outputs[0] = silu(x gate^T) * (x up^T)
    INFERD_CHECK(outputs.size() == 1 && outputs[0].ld == s.gate_rows && s.pieces.size() == 2);
    grow(split_up_, tokens * s.gate_rows);
    const LinearOutput up{split_up_.data(), s.gate_rows, nullptr};
    run(s.pieces[0], outputs.first(1));
    run(s.pieces[1], {&up, 1});
    silu_mul(outputs[0].y, split_up_.data(), outputs[0].y, tokens * s.gate_rows);
  }

  static bool one_dtype(std::span<const TensorView* const> parts) {
    for (const TensorView* p : parts)
      if (p->dtype != parts[0]->dtype) return false;
    return true;
  }

  // Whether every part has a packed kernel worth taking on this ISA: the integer kernels always;
  // the float kernel where AVX-512 runs it (elsewhere the f32 path's AVX2 dot products are faster).
  bool packable(std::span<const TensorView* const> parts) const {
    for (const TensorView* p : parts) {
      if (!PackedWeight::supports(p->dtype)) return false;
      if (PackedWeight::is_float_dtype(p->dtype) && static_cast<int>(isa_) < static_cast<int>(Isa::kAvx512))
        return false;
    }
    return true;
  }
  // Scratch grows to the largest batch and stays (no allocation once warmed up).
  static void grow(std::vector<float>& v, int64_t n) {
    if (static_cast<int64_t>(v.size()) < n) v.resize(static_cast<size_t>(n));
  }

  BackendKind kind_;
  QuantizedActivations quantized_;
  std::vector<QuantizedActivations> grouped_quantized_;  // one per group of grouped_linear
  std::vector<PackedMatmulGroup> packed_groups_;
  std::vector<float> normed_, up_, split_up_;
};

}  // namespace

void CpuKernelOps::lora_update(const float* x, int64_t ldx, int64_t k, std::span<const LoraOutput> outputs) {
  ::inferd::lora_update(x, ldx, k, outputs, lora_scratch_, pool_, isa_);
}

void CpuKernelOps::lora_silu_mul(const float* gate, const float* up, float* out, int64_t n) {
  ::inferd::lora_silu_mul(gate, up, out, n, isa_);
}

void CpuKernelOps::embed(const TensorView& table, std::span<const int32_t> ids, float* out) {
  const int64_t width = table.row_length();
  for (size_t t = 0; t < ids.size(); ++t)
    dequantize_tensor_row(table, ids[t], out + static_cast<int64_t>(t) * width);
}

Expected<std::unique_ptr<Backend>> make_backend(BackendKind kind, Isa isa, ThreadPool& pool) {
  if (static_cast<int>(isa) > static_cast<int>(highest_isa()))
    return invalid_argument("ISA " + std::string(isa_name(isa)) + " is beyond this CPU (" +
                            std::string(isa_name(detected_isa())) + ")");
  switch (kind) {
    case BackendKind::kCuda: return make_cuda_backend(pool);
    case BackendKind::kOneDnn:
      if (!OneDnnWeight::available())
        return unsupported(
            "this build of inferd has no oneDNN (scripts/setup installs libdnnl-dev and the OpenCL headers "
            "and "
            "loader its CMake config needs; then rebuild)");
      break;
    case BackendKind::kPacked:
    case BackendKind::kF32: break;
  }
  return std::unique_ptr<Backend>(std::make_unique<CpuBackend>(kind, isa, pool));
}

}  // namespace inferd
