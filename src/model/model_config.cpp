#include "model/model_config.h"

#include <algorithm>
#include <cmath>

namespace inferd {

Expected<Architecture> architecture_from_name(const std::string& name) {
  if (name == "llama") return Architecture::kLlama;
  if (name == "qwen2") return Architecture::kQwen2;
  if (name == "qwen3") return Architecture::kQwen3;
  if (name == "qwen2moe") return Architecture::kQwen2Moe;
  if (name == "qwen3moe") return Architecture::kQwen3Moe;
  return unsupported("unsupported architecture '" + name +
                     "' (supported: llama, qwen2, qwen3, qwen2moe, qwen3moe)");
}

namespace {

Status validate_rope_scaling(const RopeScaling& s, int64_t head_dim) {
  const std::string type(rope_scaling_name(s.type));
  auto finite_positive = [&](double v, const char* field) -> Status {
    if (!(std::isfinite(v) && v > 0))
      return invalid_argument("rope scaling '" + type + "': " + field + " = " + std::to_string(v) +
                              " must be a positive number");
    return Status::ok();
  };
  if (s.type == RopeScalingType::kNone) {
    if (!s.freq_factors.empty() && static_cast<int64_t>(s.freq_factors.size()) != head_dim / 2)
      return invalid_argument("rope frequency factors: " + std::to_string(s.freq_factors.size()) +
                              " values, expected head_dim / 2 = " + std::to_string(head_dim / 2));
    for (float f : s.freq_factors) INFERD_RETURN_IF_ERROR(finite_positive(f, "a frequency factor"));
    return Status::ok();
  }
  if (!s.freq_factors.empty())
    return unsupported("rope frequency factors (rope_freqs) together with rope scaling '" + type + "'");
  INFERD_RETURN_IF_ERROR(finite_positive(s.factor, "factor"));
  if (s.type != RopeScalingType::kLinear &&
      (s.original_context <= 0 || s.original_context > (int64_t{1} << 24)))
    return invalid_argument("rope scaling '" + type + "': original context " +
                            std::to_string(s.original_context) + " is out of range");
  if (s.type == RopeScalingType::kDynamic && head_dim <= 2)
    return invalid_argument("dynamic rope scaling needs head_dim > 2");
  if (s.type == RopeScalingType::kYarn) {
    INFERD_RETURN_IF_ERROR(finite_positive(s.beta_fast, "beta_fast"));
    INFERD_RETURN_IF_ERROR(finite_positive(s.beta_slow, "beta_slow"));
    INFERD_RETURN_IF_ERROR(finite_positive(s.attention_factor, "attention_factor"));
  }
  if (s.type == RopeScalingType::kLlama3) {
    INFERD_RETURN_IF_ERROR(finite_positive(s.low_freq_factor, "low_freq_factor"));
    INFERD_RETURN_IF_ERROR(finite_positive(s.high_freq_factor, "high_freq_factor"));
  }
  return Status::ok();
}

}  // namespace

bool ModelConfig::is_moe_layer(int64_t layer) const {
  return num_experts > 0 && (layer + 1) % decoder_sparse_step == 0 &&
         std::find(mlp_only_layers.begin(), mlp_only_layers.end(), layer) == mlp_only_layers.end();
}

namespace {

Status validate_moe(const ModelConfig& c) {
  if (c.num_experts == 0) {
    if (c.num_experts_per_tok != 0 || c.moe_intermediate_size != 0 || c.shared_expert_intermediate_size != 0)
      return invalid_argument("expert sizes are set but num_experts is 0");
    return Status::ok();
  }
  if (c.num_experts < 0 || c.num_experts > 4096)
    return invalid_argument("num_experts = " + std::to_string(c.num_experts) + " is out of range");
  if (c.num_experts_per_tok < 1 || c.num_experts_per_tok > c.num_experts)
    return invalid_argument("num_experts_per_tok = " + std::to_string(c.num_experts_per_tok) +
                            " must be in [1, num_experts = " + std::to_string(c.num_experts) + "]");
  if (c.moe_intermediate_size <= 0 || c.moe_intermediate_size > (int64_t{1} << 24))
    return invalid_argument("moe_intermediate_size = " + std::to_string(c.moe_intermediate_size) +
                            " is out of range");
  if (c.shared_expert_intermediate_size < 0 || c.shared_expert_intermediate_size > (int64_t{1} << 24))
    return invalid_argument("shared_expert_intermediate_size = " +
                            std::to_string(c.shared_expert_intermediate_size) + " is out of range");
  if (c.decoder_sparse_step < 1)
    return invalid_argument("decoder_sparse_step = " + std::to_string(c.decoder_sparse_step) +
                            " must be >= 1");
  for (int64_t l : c.mlp_only_layers) {
    if (l < 0 || l >= c.num_layers)
      return invalid_argument("mlp_only_layers lists layer " + std::to_string(l) + " of " +
                              std::to_string(c.num_layers));
  }
  return Status::ok();
}

}  // namespace

Status ModelConfig::validate() const {
  auto positive = [](int64_t v, const char* field) -> Status {
    if (v <= 0 || v > (int64_t{1} << 24)) {
      return invalid_argument(std::string(field) + " = " + std::to_string(v) + " is out of range");
    }
    return Status::ok();
  };
  INFERD_RETURN_IF_ERROR(positive(vocab_size, "vocab_size"));
  INFERD_RETURN_IF_ERROR(positive(hidden_size, "hidden_size"));
  INFERD_RETURN_IF_ERROR(positive(num_layers, "num_layers"));
  INFERD_RETURN_IF_ERROR(positive(num_heads, "num_heads"));
  INFERD_RETURN_IF_ERROR(positive(num_kv_heads, "num_kv_heads"));
  INFERD_RETURN_IF_ERROR(positive(head_dim, "head_dim"));
  INFERD_RETURN_IF_ERROR(positive(intermediate_size, "intermediate_size"));
  INFERD_RETURN_IF_ERROR(positive(max_position_embeddings, "max_position_embeddings"));
  if (num_heads % num_kv_heads != 0) {
    return invalid_argument("num_heads " + std::to_string(num_heads) + " is not a multiple of num_kv_heads " +
                            std::to_string(num_kv_heads));
  }
  if (head_dim % 2 != 0) return invalid_argument("head_dim " + std::to_string(head_dim) + " is odd");
  if (!(rms_norm_eps > 0 && rms_norm_eps < 1)) return invalid_argument("rms_norm_eps out of range");
  if (!(rope_theta > 1)) return invalid_argument("rope_theta must be > 1");
  INFERD_RETURN_IF_ERROR(validate_rope_scaling(rope_scaling, head_dim));
  return validate_moe(*this);
}

}  // namespace inferd
