#include "model/tensor_names.h"

#include <cstring>
#include <string_view>

namespace inferd {

namespace {

// Indexed by LayerTensor: {GGUF suffix, Hugging Face suffix}.
constexpr std::pair<const char*, const char*> kNames[] = {
    {"attn_norm.weight", "input_layernorm.weight"},
    {"attn_q.weight", "self_attn.q_proj.weight"},
    {"attn_k.weight", "self_attn.k_proj.weight"},
    {"attn_v.weight", "self_attn.v_proj.weight"},
    {"attn_output.weight", "self_attn.o_proj.weight"},
    {"attn_q.bias", "self_attn.q_proj.bias"},
    {"attn_k.bias", "self_attn.k_proj.bias"},
    {"attn_v.bias", "self_attn.v_proj.bias"},
    {"attn_q_norm.weight", "self_attn.q_norm.weight"},
    {"attn_k_norm.weight", "self_attn.k_norm.weight"},
    {"ffn_norm.weight", "post_attention_layernorm.weight"},
    {"ffn_gate.weight", "mlp.gate_proj.weight"},
    {"ffn_up.weight", "mlp.up_proj.weight"},
    {"ffn_down.weight", "mlp.down_proj.weight"},
    {"ffn_gate_inp.weight", "mlp.gate.weight"},
    {"ffn_gate_inp_shexp.weight", "mlp.shared_expert_gate.weight"},
    {"ffn_gate_shexp.weight", "mlp.shared_expert.gate_proj.weight"},
    {"ffn_up_shexp.weight", "mlp.shared_expert.up_proj.weight"},
    {"ffn_down_shexp.weight", "mlp.shared_expert.down_proj.weight"},
};

// Indexed by ExpertTensor: {GGUF stacked suffix, Hugging Face per-expert suffix, fused name}.
constexpr const char* kExpertNames[][3] = {
    {"ffn_gate_exps.weight", "gate_proj.weight", "gate_up_proj"},
    {"ffn_up_exps.weight", "up_proj.weight", "gate_up_proj"},
    {"ffn_down_exps.weight", "down_proj.weight", "down_proj"},
};

// "<prefix><digits>.<suffix>": the layer number and the suffix.
bool split(std::string_view name, std::string_view prefix, int64_t* layer, std::string_view* suffix) {
  if (name.substr(0, prefix.size()) != prefix) return false;
  name.remove_prefix(prefix.size());
  size_t digits = 0;
  int64_t n = 0;
  while (digits < name.size() && digits < 9 && name[digits] >= '0' && name[digits] <= '9')
    n = n * 10 + (name[digits++] - '0');
  if (digits == 0 || digits >= name.size() || name[digits] != '.') return false;
  *layer = n;
  *suffix = name.substr(digits + 1);
  return true;
}

}  // namespace

std::string gguf_layer_tensor(LayerTensor role, int64_t layer) {
  return "blk." + std::to_string(layer) + "." + kNames[static_cast<int>(role)].first;
}

std::string hf_layer_tensor(LayerTensor role, int64_t layer) {
  return "model.layers." + std::to_string(layer) + "." + kNames[static_cast<int>(role)].second;
}

bool parse_layer_tensor(const std::string& name, int64_t* layer, LayerTensor* role) {
  std::string_view suffix;
  const bool gguf = split(name, "blk.", layer, &suffix);
  if (!gguf && !split(name, "model.layers.", layer, &suffix)) return false;
  for (size_t i = 0; i < std::size(kNames); ++i) {
    if (suffix == (gguf ? kNames[i].first : kNames[i].second)) {
      *role = static_cast<LayerTensor>(i);
      return true;
    }
  }
  return false;
}

std::string gguf_experts_tensor(ExpertTensor role, int64_t layer) {
  return "blk." + std::to_string(layer) + "." + kExpertNames[static_cast<int>(role)][0];
}

std::string hf_expert_tensor(ExpertTensor role, int64_t layer, int64_t expert) {
  return "model.layers." + std::to_string(layer) + ".mlp.experts." + std::to_string(expert) + "." +
         kExpertNames[static_cast<int>(role)][1];
}

std::string hf_fused_experts_tensor(ExpertTensor role, int64_t layer) {
  return "model.layers." + std::to_string(layer) + ".mlp.experts." + kExpertNames[static_cast<int>(role)][2];
}

}  // namespace inferd
