#include "model/model_config.h"

namespace inferd {

Expected<Architecture> architecture_from_name(const std::string& name) {
  if (name == "llama") return Architecture::kLlama;
  if (name == "qwen2") return Architecture::kQwen2;
  if (name == "qwen3") return Architecture::kQwen3;
  return unsupported("unsupported architecture '" + name + "' (supported: llama, qwen2, qwen3)");
}

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
  return Status::ok();
}

}  // namespace inferd
