// ModelConfig from GGUF metadata and from Hugging Face config.json.
#include <nlohmann/json.hpp>

#include "model/model_loader.h"
#include "model/moe_config.h"

namespace inferd {

namespace {

Expected<int64_t> required_int(const GgufFile& f, const std::string& key) {
  INFERD_ASSIGN_OR_RETURN(std::optional<int64_t> v, f.get_int(key));
  if (!v) return not_found(f.path() + ": missing metadata '" + key + "'");
  return *v;
}

}  // namespace

Expected<ModelConfig> parse_gguf_config(const GgufFile& f) {
  ModelConfig c;
  INFERD_ASSIGN_OR_RETURN(std::optional<std::string> arch, f.get_string("general.architecture"));
  if (!arch) return not_found(f.path() + ": missing metadata 'general.architecture'");
  auto a = architecture_from_name(*arch);
  if (!a) return a.status().with_context(f.path());
  c.arch = *a;
  c.arch_name = *arch;
  const std::string p = *arch + ".";
  INFERD_ASSIGN_OR_RETURN(c.hidden_size, required_int(f, p + "embedding_length"));
  INFERD_ASSIGN_OR_RETURN(c.num_layers, required_int(f, p + "block_count"));
  INFERD_ASSIGN_OR_RETURN(c.intermediate_size, required_int(f, p + "feed_forward_length"));
  INFERD_ASSIGN_OR_RETURN(c.num_heads, required_int(f, p + "attention.head_count"));
  INFERD_ASSIGN_OR_RETURN(c.max_position_embeddings, required_int(f, p + "context_length"));
  INFERD_ASSIGN_OR_RETURN(std::optional<int64_t> kv_heads, f.get_int(p + "attention.head_count_kv"));
  c.num_kv_heads = kv_heads.value_or(c.num_heads);
  INFERD_ASSIGN_OR_RETURN(std::optional<int64_t> key_len, f.get_int(p + "attention.key_length"));
  INFERD_ASSIGN_OR_RETURN(std::optional<int64_t> value_len, f.get_int(p + "attention.value_length"));
  c.head_dim = key_len ? *key_len : (c.num_heads > 0 ? c.hidden_size / c.num_heads : 0);
  if (value_len && *value_len != c.head_dim) {
    return unsupported(f.path() + ": attention.value_length " + std::to_string(*value_len) +
                       " differs from key_length " + std::to_string(c.head_dim));
  }
  INFERD_ASSIGN_OR_RETURN(std::optional<double> eps, f.get_float(p + "attention.layer_norm_rms_epsilon"));
  if (!eps) return not_found(f.path() + ": missing metadata '" + p + "attention.layer_norm_rms_epsilon'");
  c.rms_norm_eps = *eps;
  INFERD_ASSIGN_OR_RETURN(std::optional<double> theta, f.get_float(p + "rope.freq_base"));
  c.rope_theta = theta.value_or(10000.0);
  INFERD_ASSIGN_OR_RETURN(std::optional<std::string> scaling, f.get_string(p + "rope.scaling.type"));
  if (scaling && *scaling != "none") {
    return unsupported(f.path() + ": rope scaling type '" + *scaling + "' is not supported");
  }
  INFERD_ASSIGN_OR_RETURN(std::optional<double> freq_scale, f.get_float(p + "rope.scale_linear"));
  if (freq_scale && *freq_scale != 1.0) {
    return unsupported(f.path() + ": linear rope scaling is not supported");
  }
  if (f.find_tensor("rope_freqs.weight") != nullptr) {
    return unsupported(f.path() + ": rope frequency factors (llama3 rope scaling) are not supported");
  }
  const TensorView* embd = f.find_tensor("token_embd.weight");
  if (embd == nullptr) return not_found(f.path() + ": missing tensor 'token_embd.weight'");
  c.vocab_size = embd->shape[0];
  c.tie_word_embeddings = f.find_tensor("output.weight") == nullptr;
  c.attention_bias = f.find_tensor("blk.0.attn_q.bias") != nullptr;
  c.qk_norm = c.arch == Architecture::kQwen3 || c.arch == Architecture::kQwen3Moe;
  if (c.arch == Architecture::kQwen2Moe || c.arch == Architecture::kQwen3Moe)
    INFERD_RETURN_IF_ERROR(parse_gguf_moe_config(f, &c));
  // llama.cpp's converter permutes llama's Q/K rows for interleaved RoPE; Qwen keeps NeoX pairs.
  c.rope_pairing = c.arch == Architecture::kLlama ? RopePairing::kInterleaved : RopePairing::kNeox;
  Status s = c.validate();
  if (!s.is_ok()) return s.with_context(f.path());
  return c;
}

namespace {

using nlohmann::json;

Expected<int64_t> json_int(const std::string& name, const json& j, const char* key,
                           std::optional<int64_t> fallback = std::nullopt) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    if (fallback) return *fallback;
    return not_found(name + ": missing field '" + key + "'");
  }
  if (!it->is_number_integer()) return invalid_argument(name + ": field '" + key + "' must be an integer");
  return it->get<int64_t>();
}

Expected<double> json_number(const std::string& name, const json& j, const char* key,
                             std::optional<double> fallback = std::nullopt) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    if (fallback) return *fallback;
    return not_found(name + ": missing field '" + key + "'");
  }
  if (!it->is_number()) return invalid_argument(name + ": field '" + key + "' must be a number");
  return it->get<double>();
}

bool json_bool(const json& j, const char* key, bool fallback) {
  auto it = j.find(key);
  return it != j.end() && it->is_boolean() ? it->get<bool>() : fallback;
}

// Rope settings: transformers < 5 writes rope_theta + rope_scaling; 5 writes rope_parameters.
Status parse_hf_rope(const std::string& name, const json& j, ModelConfig* c) {
  const json* params = nullptr;
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    auto it = j.find(key);
    if (it != j.end() && it->is_object()) params = &*it;
  }
  std::optional<double> theta;
  if (params != nullptr) {
    auto type = params->find("rope_type");
    if (type == params->end()) type = params->find("type");
    if (type != params->end() && type->is_string() && *type != "default") {
      return unsupported(name + ": rope scaling type '" + type->get<std::string>() + "' is not supported");
    }
    auto t = params->find("rope_theta");
    if (t != params->end() && t->is_number()) theta = t->get<double>();
  }
  INFERD_ASSIGN_OR_RETURN(c->rope_theta, json_number(name, j, "rope_theta", theta.value_or(10000.0)));
  return Status::ok();
}

}  // namespace

Expected<ModelConfig> parse_hf_config(const std::string& name, const std::string& text) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return invalid_argument(name + ": not a JSON object");
  ModelConfig c;
  std::string arch_class;
  if (auto it = j.find("architectures");
      it != j.end() && it->is_array() && !it->empty() && (*it)[0].is_string()) {
    arch_class = (*it)[0].get<std::string>();
  }
  if (arch_class == "LlamaForCausalLM") {
    c.arch_name = "llama";
  } else if (arch_class == "Qwen2ForCausalLM") {
    c.arch_name = "qwen2";
  } else if (arch_class == "Qwen3ForCausalLM") {
    c.arch_name = "qwen3";
  } else if (arch_class == "Qwen2MoeForCausalLM") {
    c.arch_name = "qwen2moe";
  } else if (arch_class == "Qwen3MoeForCausalLM") {
    c.arch_name = "qwen3moe";
  } else {
    return unsupported(name + ": unsupported architecture '" + arch_class +
                       "' (supported: LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, "
                       "Qwen2MoeForCausalLM, Qwen3MoeForCausalLM)");
  }
  INFERD_ASSIGN_OR_RETURN(c.arch, architecture_from_name(c.arch_name));
  INFERD_ASSIGN_OR_RETURN(c.vocab_size, json_int(name, j, "vocab_size"));
  INFERD_ASSIGN_OR_RETURN(c.hidden_size, json_int(name, j, "hidden_size"));
  INFERD_ASSIGN_OR_RETURN(c.num_layers, json_int(name, j, "num_hidden_layers"));
  INFERD_ASSIGN_OR_RETURN(c.num_heads, json_int(name, j, "num_attention_heads"));
  INFERD_ASSIGN_OR_RETURN(c.num_kv_heads, json_int(name, j, "num_key_value_heads", c.num_heads));
  INFERD_ASSIGN_OR_RETURN(c.intermediate_size, json_int(name, j, "intermediate_size"));
  INFERD_ASSIGN_OR_RETURN(c.max_position_embeddings, json_int(name, j, "max_position_embeddings", 4096));
  const int64_t default_head_dim = c.num_heads > 0 ? c.hidden_size / c.num_heads : 0;
  INFERD_ASSIGN_OR_RETURN(c.head_dim, json_int(name, j, "head_dim", default_head_dim));
  INFERD_ASSIGN_OR_RETURN(c.rms_norm_eps, json_number(name, j, "rms_norm_eps", 1e-6));
  INFERD_RETURN_IF_ERROR(parse_hf_rope(name, j, &c));
  c.tie_word_embeddings = json_bool(j, "tie_word_embeddings", false);
  c.rope_pairing = RopePairing::kNeox;
  c.qk_norm = c.arch == Architecture::kQwen3 || c.arch == Architecture::kQwen3Moe;
  // Qwen2 always has Q/K/V biases; Qwen2-MoE unless qkv_bias is false.
  c.attention_bias = c.arch == Architecture::kQwen2      ? true
                     : c.arch == Architecture::kQwen2Moe ? json_bool(j, "qkv_bias", true)
                                                         : json_bool(j, "attention_bias", false);
  const bool qwen2_family = c.arch == Architecture::kQwen2 || c.arch == Architecture::kQwen2Moe;
  if (!qwen2_family && c.attention_bias) {
    return unsupported(name + ": attention_bias on " + arch_class + " is not supported");
  }
  if (json_bool(j, "mlp_bias", false)) return unsupported(name + ": mlp_bias is not supported");
  if (json_bool(j, "use_sliding_window", false)) {
    return unsupported(name + ": sliding-window attention is not supported");
  }
  if (auto it = j.find("hidden_act"); it != j.end() && (!it->is_string() || *it != "silu")) {
    return unsupported(name + ": hidden_act must be \"silu\"");
  }
  if (c.arch == Architecture::kQwen2Moe || c.arch == Architecture::kQwen3Moe)
    INFERD_RETURN_IF_ERROR(parse_hf_moe_config(name, j, &c));
  Status s = c.validate();
  if (!s.is_ok()) return s.with_context(name);
  return c;
}

}  // namespace inferd
