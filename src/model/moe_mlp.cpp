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
  auto grow = [](std::vector<float>& v, int64_t rows, int64_t width) {
    v.resize(static_cast<size_t>(rows * width));
  };
  const int64_t pairs = n * c.num_experts_per_tok;
  grow(logits_, n, c.num_experts);
  grow(shared_logit_, n, 1);
  grow(rows_, pairs, c.hidden_size);
  grow(act_, pairs, c.moe_intermediate_size);
  grow(expert_out_, pairs, c.hidden_size);
  grow(shared_act_, n, c.shared_expert_intermediate_size);
  grow(shared_out_, n, c.hidden_size);
  capacity_ = n;
}

void MoeMlp::forward(const float* x, int64_t n, float* out) {
  const ModelConfig& c = config_;
  const int64_t h = c.hidden_size, f = c.moe_intermediate_size, fs = c.shared_expert_intermediate_size;
  reserve(n);
  const LinearOutput router_out[2] = {{logits_.data(), c.num_experts, nullptr},
                                      {shared_logit_.data(), 1, nullptr}};
  backend_.linear(x, n, h, nullptr, 0.0f, *router_, {router_out, shared_expert_ ? 2u : 1u});
  route_tokens(logits_.data(), n, c.num_experts, c.num_experts_per_tok, c.norm_topk_prob, &routing_);

  // Pair i of the routing (expert-major) gets row i of rows_ / act_ / expert_out_.
  const auto pairs = static_cast<int64_t>(routing_.tokens.size());
  for (int64_t i = 0; i < pairs; ++i)
    std::memcpy(&rows_[static_cast<size_t>(i * h)], x + routing_.tokens[static_cast<size_t>(i)] * h,
                static_cast<size_t>(h) * sizeof(float));
  // All selected experts' gate/up (and the shared expert's) as one op, then all their downs.
  auto expert_groups = [&](bool gate_up) {
    groups_.clear();
    for (int64_t e = 0; e < c.num_experts; ++e) {
      const int64_t m = routing_.num_rows(e), first = routing_.offsets[static_cast<size_t>(e)];
      if (m == 0) continue;
      if (gate_up) {
        groups_.push_back({gate_up_[static_cast<size_t>(e)].get(),
                           &rows_[static_cast<size_t>(first * h)],
                           m,
                           h,
                           {&act_[static_cast<size_t>(first * f)], f, nullptr}});
      } else {
        groups_.push_back({down_[static_cast<size_t>(e)].get(),
                           &act_[static_cast<size_t>(first * f)],
                           m,
                           f,
                           {&expert_out_[static_cast<size_t>(first * h)], h, nullptr}});
      }
    }
  };
  expert_groups(true);
  if (shared_expert_) groups_.push_back({shared_gate_up_.get(), x, n, h, {shared_act_.data(), fs, nullptr}});
  backend_.grouped_linear(groups_);
  expert_groups(false);
  if (shared_expert_)
    groups_.push_back({shared_down_.get(), shared_act_.data(), n, fs, {shared_out_.data(), h, nullptr}});
  backend_.grouped_linear(groups_);

  // Scatter-add, each token's experts in ascending order (as transformers' index_add_), then the
  // shared expert.
  std::fill_n(out, n * h, 0.0f);
  for (int64_t i = 0; i < pairs; ++i) {
    float* o = out + routing_.tokens[static_cast<size_t>(i)] * h;
    const float* y = &expert_out_[static_cast<size_t>(i * h)];
    const float w = routing_.weights[static_cast<size_t>(i)];
    for (int64_t j = 0; j < h; ++j) o[j] += y[j] * w;
  }
  if (!shared_expert_) return;
  for (int64_t t = 0; t < n; ++t) {
    const float scale = 1.0f / (1.0f + std::exp(-shared_logit_[static_cast<size_t>(t)]));
    float* o = out + t * h;
    const float* y = &shared_out_[static_cast<size_t>(t * h)];
    for (int64_t j = 0; j < h; ++j) o[j] += scale * y[j];
  }
}

}  // namespace inferd
