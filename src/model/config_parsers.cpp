// ModelConfig from GGUF metadata and from Hugging Face config.json.
#include <algorithm>
#include <nlohmann/json.hpp>

#include "model/model_loader.h"
#include "model/moe_config.h"
#include "tensor/dequantize.h"

namespace inferd {

namespace {

Expected<int64_t> required_int(const GgufFile& f, const std::string& key) {
  INFERD_ASSIGN_OR_RETURN(std::optional<int64_t> v, f.get_int(key));
  if (!v) return not_found(f.path() + ": missing metadata '" + key + "'");
  return *v;
}

// The rope scaling keys llama.cpp's convert_hf_to_gguf.py writes: {arch}.rope.scaling.type
// "linear" (+ factor) or "yarn" (+ factor, original_context_length, yarn_beta_fast / _slow,
// yarn_attn_factor from the config's attention_factor), and for llama3 scaling only the
// rope_freqs.weight tensor (per-dimension divisors of the frequencies). Read with transformers'
// meaning; keys whose llama.cpp meaning transformers has no counterpart for are refused.
Expected<RopeScaling> gguf_rope_scaling(const GgufFile& f, const std::string& p, int64_t context_length) {
  RopeScaling s;
  const std::string where = f.path() + ": ";
  INFERD_ASSIGN_OR_RETURN(std::optional<std::string> type, f.get_string(p + "rope.scaling.type"));
  INFERD_ASSIGN_OR_RETURN(std::optional<double> factor, f.get_float(p + "rope.scaling.factor"));
  INFERD_ASSIGN_OR_RETURN(std::optional<double> scale_linear, f.get_float(p + "rope.scale_linear"));
  if (!factor && scale_linear && *scale_linear != 0) factor = 1.0 / *scale_linear;  // the older key
  const std::string t = type.value_or(scale_linear && *scale_linear != 1.0 ? "linear" : "none");
  if (t == "linear") {
    if (!factor) return not_found(where + "rope scaling 'linear' without '" + p + "rope.scaling.factor'");
    s.type = RopeScalingType::kLinear;
    s.factor = *factor;
  } else if (t == "yarn") {
    if (!factor) return not_found(where + "rope scaling 'yarn' without '" + p + "rope.scaling.factor'");
    s.type = RopeScalingType::kYarn;
    s.factor = *factor;
    INFERD_ASSIGN_OR_RETURN(std::optional<int64_t> orig,
                            f.get_int(p + "rope.scaling.original_context_length"));
    s.original_context = orig.value_or(context_length);
    INFERD_ASSIGN_OR_RETURN(std::optional<double> fast, f.get_float(p + "rope.scaling.yarn_beta_fast"));
    INFERD_ASSIGN_OR_RETURN(std::optional<double> slow, f.get_float(p + "rope.scaling.yarn_beta_slow"));
    INFERD_ASSIGN_OR_RETURN(std::optional<double> attn, f.get_float(p + "rope.scaling.yarn_attn_factor"));
    s.beta_fast = fast.value_or(32.0);
    s.beta_slow = slow.value_or(1.0);
    s.attention_factor = attn ? *attn : yarn_attention_factor(s.factor, 0, 0);
    INFERD_ASSIGN_OR_RETURN(std::optional<double> ext, f.get_float(p + "rope.scaling.yarn_ext_factor"));
    INFERD_ASSIGN_OR_RETURN(std::optional<double> log_mul,
                            f.get_float(p + "rope.scaling.yarn_log_multiplier"));
    if (ext && *ext != 1.0) return unsupported(where + p + "rope.scaling.yarn_ext_factor other than 1");
    if (log_mul && *log_mul != 0.0)
      return unsupported(where + p + "rope.scaling.yarn_log_multiplier (mscale_all_dim)");
  } else if (t != "none") {
    return unsupported(where + "rope scaling type '" + t +
                       "' is not supported (supported: none, linear, yarn; " +
                       "llama3 as rope_freqs.weight)");
  }
  INFERD_ASSIGN_OR_RETURN(std::optional<double> attn_factor, f.get_float(p + "rope.scaling.attn_factor"));
  if (attn_factor && *attn_factor != 1.0)
    return unsupported(where + p + "rope.scaling.attn_factor other than 1");
  if (const TensorView* freqs = f.find_tensor("rope_freqs.weight")) {
    if (freqs->num_dims != 1)
      return corrupt_file(where + "tensor 'rope_freqs.weight' has shape " + freqs->shape_string() +
                          ", expected 1-D");
    s.freq_factors.resize(static_cast<size_t>(freqs->shape[0]));
    dequantize_tensor_row(*freqs, 0, s.freq_factors.data());
  }
  return s;
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
  INFERD_ASSIGN_OR_RETURN(c.rope_scaling, gguf_rope_scaling(f, p, c.max_position_embeddings));
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

// The keys transformers' validator knows for each rope type, besides rope_type / type /
// rope_theta / partial_rotary_factor. Others are refused, not ignored: they may change the math.
struct HfRopeType {
  const char* name;
  RopeScalingType type;
  std::vector<std::string> keys;
};

const std::vector<HfRopeType>& hf_rope_types() {
  static const std::vector<HfRopeType> types = {
      {"default", RopeScalingType::kNone, {}},
      {"linear", RopeScalingType::kLinear, {"factor"}},
      {"dynamic", RopeScalingType::kDynamic, {"factor"}},
      {"yarn",
       RopeScalingType::kYarn,
       {"factor", "original_max_position_embeddings", "attention_factor", "beta_fast", "beta_slow", "mscale",
        "mscale_all_dim", "truncate"}},
      {"llama3",
       RopeScalingType::kLlama3,
       {"factor", "original_max_position_embeddings", "low_freq_factor", "high_freq_factor"}},
  };
  return types;
}

Status check_full_rotary(const std::string& name, const json& j) {
  auto it = j.find("partial_rotary_factor");
  if (it != j.end() && !it->is_null() && !(it->is_number() && it->get<double>() == 1.0))
    return unsupported(name + ": partial_rotary_factor " + it->dump() + " is not supported");
  return Status::ok();
}

// The scaling parameters of one type, with transformers' defaults (_compute_*_parameters).
Status parse_hf_rope_scaling(const std::string& where, const json& j, const json& params, ModelConfig* c) {
  RopeScaling& s = c->rope_scaling;
  const bool has_factor = params.contains("factor");
  if (s.type == RopeScalingType::kNone) return Status::ok();
  if (!has_factor) return not_found(where + ": missing field 'factor'");
  if (s.type == RopeScalingType::kYarn || s.type == RopeScalingType::kLlama3) {
    // A top-level original_max_position_embeddings takes precedence (transformers'
    // standardize_rope_params), then rope_scaling's, then max_position_embeddings.
    INFERD_ASSIGN_OR_RETURN(s.original_context, json_int(where, params, "original_max_position_embeddings",
                                                         c->max_position_embeddings));
    INFERD_ASSIGN_OR_RETURN(s.original_context,
                            json_int(where, j, "original_max_position_embeddings", s.original_context));
  }
  if (s.type == RopeScalingType::kDynamic) s.original_context = c->max_position_embeddings;
  if (s.type == RopeScalingType::kYarn) {
    const double implicit =
        static_cast<double>(c->max_position_embeddings) / static_cast<double>(s.original_context);
    INFERD_ASSIGN_OR_RETURN(s.factor, json_number(where, params, "factor", implicit));
    INFERD_ASSIGN_OR_RETURN(double mscale, json_number(where, params, "mscale", 0.0));
    INFERD_ASSIGN_OR_RETURN(double mscale_all_dim, json_number(where, params, "mscale_all_dim", 0.0));
    INFERD_ASSIGN_OR_RETURN(s.attention_factor,
                            json_number(where, params, "attention_factor",
                                        yarn_attention_factor(s.factor, mscale, mscale_all_dim)));
    // beta_fast or 32, beta_slow or 1: a zero means the default too.
    INFERD_ASSIGN_OR_RETURN(s.beta_fast, json_number(where, params, "beta_fast", 0.0));
    INFERD_ASSIGN_OR_RETURN(s.beta_slow, json_number(where, params, "beta_slow", 0.0));
    if (s.beta_fast == 0) s.beta_fast = 32;
    if (s.beta_slow == 0) s.beta_slow = 1;
    s.truncate = json_bool(params, "truncate", true);
    return Status::ok();
  }
  INFERD_ASSIGN_OR_RETURN(s.factor, json_number(where, params, "factor"));
  if (s.type == RopeScalingType::kLlama3) {
    INFERD_ASSIGN_OR_RETURN(s.low_freq_factor, json_number(where, params, "low_freq_factor"));
    INFERD_ASSIGN_OR_RETURN(s.high_freq_factor, json_number(where, params, "high_freq_factor"));
  }
  return Status::ok();
}

// Rope settings: transformers < 5 writes rope_theta + rope_scaling; 5 writes rope_parameters
// (rope_type, rope_theta and the type's keys). rope_scaling wins over rope_parameters, and a
// rope_theta inside them over the top-level one, as in transformers.
Status parse_hf_rope(const std::string& name, const json& j, ModelConfig* c) {
  const json* params = nullptr;
  std::string where;
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    auto it = j.find(key);
    if (it != j.end() && it->is_object() && !it->empty()) {
      params = &*it;
      where = name + ": " + key;
    }
  }
  INFERD_RETURN_IF_ERROR(check_full_rotary(name, j));
  INFERD_ASSIGN_OR_RETURN(c->rope_theta, json_number(name, j, "rope_theta", 10000.0));
  if (params == nullptr) return Status::ok();
  INFERD_ASSIGN_OR_RETURN(c->rope_theta, json_number(where, *params, "rope_theta", c->rope_theta));
  INFERD_RETURN_IF_ERROR(check_full_rotary(where, *params));
  std::string type = "default";
  for (const char* key : {"type", "rope_type"}) {
    if (auto it = params->find(key); it != params->end() && it->is_string()) type = it->get<std::string>();
  }
  const HfRopeType* spec = nullptr;
  for (const HfRopeType& t : hf_rope_types()) {
    if (type == t.name) spec = &t;
  }
  if (spec == nullptr) {
    return unsupported(name + ": rope scaling type '" + type +
                       "' is not supported (supported: default, linear, dynamic, yarn, llama3)");
  }
  for (const auto& [key, value] : params->items()) {
    if (key == "rope_type" || key == "type" || key == "rope_theta" || key == "partial_rotary_factor")
      continue;
    if (std::find(spec->keys.begin(), spec->keys.end(), key) == spec->keys.end() && !value.is_null())
      return unsupported(where + ": key '" + key + "' is not supported with rope type '" + type + "'");
  }
  c->rope_scaling.type = spec->type;
  return parse_hf_rope_scaling(where, j, *params, c);
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
  // A sequence-classification checkpoint is its causal LM's body with a `score` head
  // (model/classifier_head.h reads the head).
  if (arch_class == "LlamaForCausalLM" || arch_class == "LlamaForSequenceClassification") {
    c.arch_name = "llama";
  } else if (arch_class == "Qwen2ForCausalLM" || arch_class == "Qwen2ForSequenceClassification") {
    c.arch_name = "qwen2";
  } else if (arch_class == "Qwen3ForCausalLM" || arch_class == "Qwen3ForSequenceClassification") {
    c.arch_name = "qwen3";
  } else if (arch_class == "Qwen2MoeForCausalLM") {
    c.arch_name = "qwen2moe";
  } else if (arch_class == "Qwen3MoeForCausalLM") {
    c.arch_name = "qwen3moe";
  } else {
    return unsupported(name + ": unsupported architecture '" + arch_class +
                       "' (supported: LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, "
                       "Qwen2MoeForCausalLM, Qwen3MoeForCausalLM, and the dense three's "
                       "ForSequenceClassification)");
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
