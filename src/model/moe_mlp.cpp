#include "model/moe_mlp.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace inferd {

MoeMlp::MoeMlp(const MoeWeights& w, const ModelConfig& c, Backend& backend)
    : config_(c), backend_(backend), shared_expert_(w.has_shared_expert()) {
  auto prepare = [&](std::initializer_list<const TensorView*> parts, bool swiglu) {
    return backend_.prepare_linear(std::span<const TensorView* const>(parts.begin(), parts.size()), swiglu);
  };
  router_ = shared_expert_ ? prepare({&w.router, &w.shared_expert_gate}, false) : prepare({&w.router}, false);
  for (size_t e = 0; e < w.expert_gate.size(); ++e) {
    gate_up_.push_back(prepare({&w.expert_gate[e], &w.expert_up[e]}, true));
    down_.push_back(prepare({&w.expert_down[e]}, false));
  }
  if (shared_expert_) {
    shared_gate_up_ = prepare({&w.shared_gate, &w.shared_up}, true);
    shared_down_ = prepare({&w.shared_down}, false);
  }
}

void MoeMlp::reserve(int64_t n) {
  if (n <= capacity_) return;
  const ModelConfig& c = config_;
  auto grow = [n](std::vector<float>& v, int64_t width) { v.resize(static_cast<size_t>(n * width)); };
  grow(logits_, c.num_experts);
  grow(shared_logit_, 1);
  grow(rows_, c.hidden_size);
  grow(act_, std::max(c.moe_intermediate_size, c.shared_expert_intermediate_size));
  grow(expert_out_, c.hidden_size);
  capacity_ = n;
}

void MoeMlp::forward(const float* x, int64_t n, float* out) {
  const ModelConfig& c = config_;
  const int64_t h = c.hidden_size, num_experts = c.num_experts;
  reserve(n);
  const LinearOutput router_out[2] = {{logits_.data(), num_experts, nullptr},
                                      {shared_logit_.data(), 1, nullptr}};
  backend_.linear(x, n, h, nullptr, 0.0f, *router_, {router_out, shared_expert_ ? 2u : 1u});
  route_tokens(logits_.data(), n, num_experts, c.num_experts_per_tok, c.norm_topk_prob, &routing_);

  std::fill_n(out, n * h, 0.0f);
  const LinearOutput act{act_.data(), c.moe_intermediate_size, nullptr};
  const LinearOutput down{expert_out_.data(), h, nullptr};
  for (int64_t e = 0; e < num_experts; ++e) {
    const int64_t m = routing_.num_rows(e);
    if (m == 0) continue;
    const int32_t* tokens = routing_.tokens.data() + routing_.offsets[static_cast<size_t>(e)];
    const float* weights = routing_.weights.data() + routing_.offsets[static_cast<size_t>(e)];
    for (int64_t r = 0; r < m; ++r)
      std::memcpy(&rows_[static_cast<size_t>(r * h)], x + tokens[r] * h,
                  static_cast<size_t>(h) * sizeof(float));
    backend_.linear(rows_.data(), m, h, nullptr, 0.0f, *gate_up_[static_cast<size_t>(e)], {&act, 1});
    backend_.linear(act_.data(), m, c.moe_intermediate_size, nullptr, 0.0f, *down_[static_cast<size_t>(e)],
                    {&down, 1});
    for (int64_t r = 0; r < m; ++r) {
      float* o = out + tokens[r] * h;
      const float* y = &expert_out_[static_cast<size_t>(r * h)];
      for (int64_t j = 0; j < h; ++j) o[j] += y[j] * weights[r];
    }
  }
  if (!shared_expert_) return;
  const LinearOutput shared_act{act_.data(), c.shared_expert_intermediate_size, nullptr};
  backend_.linear(x, n, h, nullptr, 0.0f, *shared_gate_up_, {&shared_act, 1});
  backend_.linear(act_.data(), n, c.shared_expert_intermediate_size, nullptr, 0.0f, *shared_down_,
                  {&down, 1});
  for (int64_t t = 0; t < n; ++t) {
    const float scale = 1.0f / (1.0f + std::exp(-shared_logit_[static_cast<size_t>(t)]));
    float* o = out + t * h;
    const float* y = &expert_out_[static_cast<size_t>(t * h)];
    for (int64_t j = 0; j < h; ++j) o[j] += scale * y[j];
  }
}

}  // namespace inferd
