// MoeMlp: one mixture-of-experts MLP (Qwen2-MoE / Qwen3-MoE) on a Backend: router, top-k
// routing, the routed experts run grouped by expert, and Qwen2-MoE's gated shared expert. The
// transformer runs it in place of the dense MLP in the layers config.is_moe_layer() names.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/backend.h"
#include "model/expert_routing.h"
#include "model/model_config.h"
#include "model/model_weights.h"

namespace inferd {

class MoeMlp final {
 public:
  // Prepares the layer's linears on `backend` (not owned; must outlive this): the router with
  // the shared-expert gate as one matmul, each expert's gate/up as one SwiGLU matmul and its
  // down, the shared expert likewise. `weights` and `config`: not owned, must outlive this.
  MoeMlp(const MoeWeights& weights, const ModelConfig& config, Backend& backend);

  // out[t] = sum over token t's top-k experts e (ascending e) of w_te * down_e(silu(gate_e x_t) *
  // up_e x_t), + sigmoid(g . x_t) * shared(x_t) with a shared expert. x: [tokens, hidden], already
  // normalized; out: [tokens, hidden]. Each selected expert runs once, over the rows routed to it
  // (gathered, then scatter-added), so its weights are read once per step; every token's result
  // depends only on that token (batch-invariant). The selected experts' gate/up matmuls (and the
  // shared expert's) run as one Backend::grouped_linear, their downs as another. Engine thread only.
  void forward(const float* x, int64_t tokens, float* out);

 private:
  void reserve(int64_t tokens);

  const ModelConfig& config_;
  Backend& backend_;
  bool shared_expert_ = false;
  std::unique_ptr<LinearWeights> router_;  // parts: router [E, hidden] (+ shared-expert gate [1, hidden])
  std::vector<std::unique_ptr<LinearWeights>> gate_up_;  // [E] SwiGLU gate/up
  std::vector<std::unique_ptr<LinearWeights>> down_;     // [E]
  std::unique_ptr<LinearWeights> shared_gate_up_, shared_down_;
  ExpertRouting routing_;
  std::vector<LinearGroup> groups_;  // one grouped_linear's matmuls
  int64_t capacity_ = 0;             // tokens T the buffers below hold
  std::vector<float> logits_;        // [T, E]
  std::vector<float> shared_logit_;  // [T]
  // Row i of these belongs to pair i of routing_ (expert-major): the token's row gathered, its
  // expert's SwiGLU activation, its expert's output.
  std::vector<float> rows_;        // [T * k, hidden]
  std::vector<float> act_;         // [T * k, moe_intermediate]
  std::vector<float> expert_out_;  // [T * k, hidden]
  std::vector<float> shared_act_;  // [T, shared_intermediate]
  std::vector<float> shared_out_;  // [T, hidden]
};

}  // namespace inferd
