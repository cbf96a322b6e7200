#include "model/moe_config.h"

#include <nlohmann/json.hpp>

namespace inferd {

namespace {

using nlohmann::json;

// transformers' defaults where config.json leaves a field out (Qwen2MoeConfig, Qwen3MoeConfig).
struct MoeDefaults {
  int64_t num_experts, num_experts_per_tok, moe_intermediate_size, shared_expert_intermediate_size;
};
constexpr MoeDefaults kQwen2MoeDefaults{60, 4, 1408, 5632};
constexpr MoeDefaults kQwen3MoeDefaults{128, 8, 768, 0};

Expected<int64_t> field_int(const std::string& name, const json& j, const char* key, int64_t fallback) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_number_integer()) return invalid_argument(name + ": field '" + key + "' must be an integer");
  return it->get<int64_t>();
}

}  // namespace

Status parse_hf_moe_config(const std::string& name, const json& j, ModelConfig* c) {
  const bool qwen2 = c->arch == Architecture::kQwen2Moe;
  const MoeDefaults d = qwen2 ? kQwen2MoeDefaults : kQwen3MoeDefaults;
  // Qwen3MoeConfig maps num_local_experts onto num_experts.
  const char* experts_key = j.contains("num_experts") ? "num_experts" : "num_local_experts";
  INFERD_ASSIGN_OR_RETURN(c->num_experts, field_int(name, j, experts_key, d.num_experts));
  INFERD_ASSIGN_OR_RETURN(c->num_experts_per_tok,
                          field_int(name, j, "num_experts_per_tok", d.num_experts_per_tok));
  INFERD_ASSIGN_OR_RETURN(c->moe_intermediate_size,
                          field_int(name, j, "moe_intermediate_size", d.moe_intermediate_size));
  if (qwen2) {
    INFERD_ASSIGN_OR_RETURN(
        c->shared_expert_intermediate_size,
        field_int(name, j, "shared_expert_intermediate_size", d.shared_expert_intermediate_size));
  } else if (j.contains("shared_expert_intermediate_size") && j["shared_expert_intermediate_size"] != 0) {
    return unsupported(name + ": Qwen3MoeForCausalLM has no shared expert (shared_expert_intermediate_size)");
  }
  INFERD_ASSIGN_OR_RETURN(c->decoder_sparse_step, field_int(name, j, "decoder_sparse_step", 1));
  if (auto it = j.find("norm_topk_prob"); it != j.end() && !it->is_null()) {
    if (!it->is_boolean()) return invalid_argument(name + ": field 'norm_topk_prob' must be a boolean");
    c->norm_topk_prob = it->get<bool>();
  }
  c->mlp_only_layers.clear();
  if (auto it = j.find("mlp_only_layers"); it != j.end() && !it->is_null()) {
    if (!it->is_array()) return invalid_argument(name + ": field 'mlp_only_layers' must be a list of layers");
    for (const json& l : *it) {
      if (!l.is_number_integer()) return invalid_argument(name + ": mlp_only_layers must list integers");
      c->mlp_only_layers.push_back(l.get<int64_t>());
    }
  }
  if (c->num_experts == 0) return invalid_argument(name + ": num_experts is 0");
  return Status::ok();
}

Status parse_gguf_moe_config(const GgufFile& f, ModelConfig* c) {
  const std::string p = c->arch_name + ".";
  auto required = [&](const std::string& key) -> Expected<int64_t> {
    INFERD_ASSIGN_OR_RETURN(std::optional<int64_t> v, f.get_int(key));
    if (!v) return not_found(f.path() + ": missing metadata '" + key + "'");
    return *v;
  };
  INFERD_ASSIGN_OR_RETURN(c->num_experts, required(p + "expert_count"));
  INFERD_ASSIGN_OR_RETURN(c->num_experts_per_tok, required(p + "expert_used_count"));
  // llama.cpp's fallbacks where the sizes are absent.
  INFERD_ASSIGN_OR_RETURN(std::optional<int64_t> ff_exp, f.get_int(p + "expert_feed_forward_length"));
  c->moe_intermediate_size =
      ff_exp.value_or(c->num_experts_per_tok > 0 ? c->intermediate_size / c->num_experts_per_tok : 0);
  c->decoder_sparse_step = 1;
  c->mlp_only_layers.clear();
  bool shared_expert = false;
  for (int64_t l = 0; l < c->num_layers; ++l) {
    const std::string blk = "blk." + std::to_string(l) + ".";
    if (f.find_tensor(blk + "ffn_gate_inp.weight") == nullptr) {
      c->mlp_only_layers.push_back(l);
    } else {
      shared_expert = shared_expert || f.find_tensor(blk + "ffn_gate_shexp.weight") != nullptr;
    }
  }
  c->shared_expert_intermediate_size = 0;
  if (shared_expert) {
    INFERD_ASSIGN_OR_RETURN(std::optional<int64_t> ff_sh, f.get_int(p + "expert_shared_feed_forward_length"));
    c->shared_expert_intermediate_size = ff_sh.value_or(c->intermediate_size);
  }
  c->norm_topk_prob = c->arch == Architecture::kQwen3Moe;
  if (const GgufValue* v = f.find(p + "expert_weights_norm")) {
    if (!v->is_integer() && v->type != GgufType::kBool)
      return corrupt_file(f.path() + ": metadata '" + p + "expert_weights_norm' is not a bool");
    c->norm_topk_prob = v->int_value != 0;
  }
  INFERD_ASSIGN_OR_RETURN(std::optional<double> scale, f.get_float(p + "expert_weights_scale"));
  if (scale && *scale != 0.0 && *scale != 1.0)
    return unsupported(f.path() + ": expert_weights_scale " + std::to_string(*scale) + " is not supported");
  INFERD_ASSIGN_OR_RETURN(std::optional<int64_t> gating, f.get_int(p + "expert_gating_func"));
  if (gating && *gating != 1)  // llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX
    return unsupported(f.path() + ": expert gating function " + std::to_string(*gating) +
                       " is not supported (softmax only)");
  return Status::ok();
}

}  // namespace inferd
