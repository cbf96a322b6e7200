#include "model/lora_adapter.h"

#include <xxhash.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>

#include "common/files.h"
#include "common/half.h"
#include "formats/gguf_file.h"
#include "formats/safetensors_file.h"
#include "model/tensor_names.h"
#include "tensor/dequantize.h"

namespace inferd {

namespace {

constexpr std::array<std::string_view, kNumLoraTargets> kTargetNames = {
    "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};

std::optional<LoraTarget> target_of(LayerTensor role) {
  switch (role) {
    case LayerTensor::kWq: return LoraTarget::kQ;
    case LayerTensor::kWk: return LoraTarget::kK;
    case LayerTensor::kWv: return LoraTarget::kV;
    case LayerTensor::kWo: return LoraTarget::kO;
    case LayerTensor::kGate: return LoraTarget::kGate;
    case LayerTensor::kUp: return LoraTarget::kUp;
    case LayerTensor::kDown: return LoraTarget::kDown;
    default: return std::nullopt;
  }
}

bool is_mlp(LoraTarget t) {
  return t == LoraTarget::kGate || t == LoraTarget::kUp || t == LoraTarget::kDown;
}

// One (layer, target) pair as the file holds it, before checks.
struct Pending {
  const TensorView* a = nullptr;
  const TensorView* b = nullptr;
  double alpha = 0.0;  // scale = alpha / rank (or / sqrt(rank))
  bool rslora = false;
  std::optional<int64_t> declared_rank;  // the config's rank for this module, where it says
};

using PendingMap = std::map<std::pair<int64_t, int>, Pending>;

std::vector<float> to_f32(const TensorView& t) {
  std::vector<float> out(static_cast<size_t>(t.num_elements()));
  for (int64_t r = 0; r < t.num_rows(); ++r) dequantize_tensor_row(t, r, out.data() + r * t.row_length());
  return out;
}

// llama.cpp's converter reorders a Llama model's Q and K rows, head by head, for interleaved
// RoPE: new row (h, 2i + j) is old row (h, j * half + i). `to_gguf` applies that to B's rows
// ([rows, cols]); otherwise its inverse.
void permute_rows(std::vector<float>& w, int64_t rows, int64_t cols, int64_t heads, bool to_gguf) {
  const int64_t head_dim = rows / heads, half = head_dim / 2;
  std::vector<float> out(w.size());
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t i = 0; i < half; ++i)
      for (int64_t j = 0; j < 2; ++j) {
        const int64_t gguf_row = h * head_dim + 2 * i + j, hf_row = h * head_dim + j * half + i;
        const int64_t to = to_gguf ? gguf_row : hf_row, from = to_gguf ? hf_row : gguf_row;
        std::copy_n(w.begin() + from * cols, cols, out.begin() + to * cols);
      }
  w = std::move(out);
}

// `name` without its suffix `a_suffix` (*is_a = true) or `b_suffix` (*is_a = false); empty when
// it ends in neither (or is nothing but the suffix).
std::string strip_pair_suffix(const std::string& name, std::string_view a_suffix, std::string_view b_suffix,
                              bool* is_a) {
  for (const std::string_view s : {a_suffix, b_suffix}) {
    if (name.size() > s.size() && name.ends_with(s)) {
      *is_a = s == a_suffix;
      return name.substr(0, name.size() - s.size());
    }
  }
  return "";
}

Status check_dtype(const TensorView& t) {
  if (t.dtype == DType::kF32 || t.dtype == DType::kF16 || t.dtype == DType::kBF16 || t.dtype == DType::kQ8_0)
    return Status::ok();
  return unsupported("LoRA tensor '" + t.name + "' is " + std::string(dtype_info(t.dtype).name) +
                     "; adapters are read in F32, F16, BF16 or Q8_0");
}

// Checks every pair against `base`, converts it and fills `adapter`.
Status finish(const PendingMap& pending, const ModelWeights& base, int64_t max_rank, bool hf_layout,
              LoraAdapter* adapter) {
  const ModelConfig& c = base.config;
  if (pending.empty()) return invalid_argument(adapter->path + ": the adapter holds no LoRA tensors");
  adapter->layers.assign(static_cast<size_t>(c.num_layers), {});
  // Q and K rows of a Llama model are in the GGUF order in a GGUF base.
  const bool base_gguf_layout = base.source_format == "gguf";
  XXH3_state_t* state = XXH3_createState();
  XXH3_128bits_reset(state);
  for (const auto& [key, p] : pending) {
    const auto [layer, t] = key;
    const auto target = static_cast<LoraTarget>(t);
    const std::string where = "layer " + std::to_string(layer) + " " + std::string(lora_target_name(target));
    if (p.a == nullptr || p.b == nullptr) {
      XXH3_freeState(state);
      return invalid_argument(adapter->path + ": " + where + " has only one of its two LoRA tensors ('" +
                              (p.a != nullptr ? p.a->name : p.b->name) + "')");
    }
    auto fail = [&](const std::string& m) {
      XXH3_freeState(state);
      return invalid_argument(adapter->path + ": " + m);
    };
    if (layer < 0 || layer >= c.num_layers)
      return fail("tensor '" + p.a->name + "' is for layer " + std::to_string(layer) + " but the base has " +
                  std::to_string(c.num_layers) + " layers");
    if (is_mlp(target) && c.is_moe_layer(layer))
      return fail("tensor '" + p.a->name + "': layer " + std::to_string(layer) +
                  " is a mixture-of-experts layer; LoRA on experts is not supported");
    if (Status s = check_dtype(*p.a); !s.is_ok()) return fail(s.message());
    if (Status s = check_dtype(*p.b); !s.is_ok()) return fail(s.message());
    const auto [out, in] = lora_target_shape(c, target);
    if (p.a->num_dims != 2 || p.b->num_dims != 2)
      return fail("tensor '" + p.a->name + "' / '" + p.b->name + "' must be 2-D");
    const int64_t rank = p.a->shape[0];
    if (p.a->shape[1] != in || p.b->shape[0] != out || p.b->shape[1] != rank)
      return fail("tensors '" + p.a->name + "' " + p.a->shape_string() + " and '" + p.b->name + "' " +
                  p.b->shape_string() + " do not fit the base's " + where + " [" + std::to_string(out) +
                  ", " + std::to_string(in) + "] (want A [r, " + std::to_string(in) + "], B [" +
                  std::to_string(out) + ", r])");
    if (rank < 1) return fail("tensor '" + p.a->name + "' has rank 0");
    if (rank > max_rank)
      return fail("tensor '" + p.a->name + "' has rank " + std::to_string(rank) + ", above --max-lora-rank " +
                  std::to_string(max_rank));
    if (p.declared_rank && *p.declared_rank != rank)
      return fail("tensor '" + p.a->name + "' has rank " + std::to_string(rank) + " but the config says " +
                  std::to_string(*p.declared_rank));
    LoraMatrix& m = adapter->layers[static_cast<size_t>(layer)][static_cast<size_t>(t)];
    m.rank = rank;
    const double denom = p.rslora ? std::sqrt(static_cast<double>(rank)) : static_cast<double>(rank);
    m.scale =
        p.alpha == 0.0 && !hf_layout ? 1.0f : static_cast<float>(p.alpha / denom);  // llama.cpp: no alpha = 1
    m.a = to_f32(*p.a);
    std::vector<float> b = to_f32(*p.b);  // [out, rank]
    if (c.arch == Architecture::kLlama && hf_layout == base_gguf_layout &&
        (target == LoraTarget::kQ || target == LoraTarget::kK)) {
      // The adapter's rows are in the other file format's order than the base's.
      permute_rows(b, out, rank, target == LoraTarget::kQ ? c.num_heads : c.num_kv_heads, base_gguf_layout);
    }
    m.bt.resize(b.size());
    for (int64_t o = 0; o < out; ++o)
      for (int64_t r = 0; r < rank; ++r)
        m.bt[static_cast<size_t>(r * out + o)] = b[static_cast<size_t>(o * rank + r)];
    const int64_t head[3] = {layer, t, rank};
    XXH3_128bits_update(state, head, sizeof(head));
    XXH3_128bits_update(state, &m.scale, sizeof(m.scale));
    XXH3_128bits_update(state, m.a.data(), m.a.size() * sizeof(float));
    XXH3_128bits_update(state, m.bt.data(), m.bt.size() * sizeof(float));
    // Both halves in one 16-bit type: kept so (the values convert back exactly).
    if (p.a->dtype == p.b->dtype && (p.a->dtype == DType::kF16 || p.a->dtype == DType::kBF16)) {
      m.dtype = p.a->dtype;
      auto narrow = [&](const std::vector<float>& v) {
        std::vector<uint16_t> out16(v.size());
        for (size_t i = 0; i < v.size(); ++i)
          out16[i] = m.dtype == DType::kF16 ? f32_to_f16(v[i]) : f32_to_bf16(v[i]);
        return out16;
      };
      m.a16 = narrow(m.a);
      m.bt16 = narrow(m.bt);
      m.a = {};
      m.bt = {};
      adapter->bytes += (m.a16.size() + m.bt16.size()) * sizeof(uint16_t);
    } else {
      adapter->bytes += (m.a.size() + m.bt.size()) * sizeof(float);
    }
    adapter->max_rank = std::max(adapter->max_rank, rank);
    adapter->targets[static_cast<size_t>(t)] = true;
  }
  const XXH128_hash_t h = XXH3_128bits_digest(state);
  XXH3_freeState(state);
  adapter->fingerprint_lo = h.low64;
  adapter->fingerprint_hi = h.high64 == 0 && h.low64 == 0 ? 1 : h.high64;  // never the base's zero key
  return Status::ok();
}

// PEFT's rule for rank_pattern / alpha_pattern keys: the key equals the module name or matches
// its end after a dot, as a regular expression.
std::optional<double> pattern_value(const nlohmann::ordered_json& patterns, const std::string& module,
                                    const std::string& field, Status* error) {
  if (!patterns.is_object()) return std::nullopt;
  for (const auto& [key, value] : patterns.items()) {
    bool match = key == module;
    if (!match) {
      try {
        match = std::regex_match(module, std::regex("(.*\\.)?(" + key + ")"));
      } catch (const std::regex_error&) {
        *error = invalid_argument("adapter_config.json: " + field + " key '" + key +
                                  "' is not a regular expression");
        return std::nullopt;
      }
    }
    if (match) {
      if (!value.is_number()) {
        *error = invalid_argument("adapter_config.json: " + field + "['" + key + "'] must be a number");
        return std::nullopt;
      }
      return value.get<double>();
    }
  }
  return std::nullopt;
}

Expected<std::shared_ptr<const LoraAdapter>> load_peft(const std::string& dir, const ModelWeights& base,
                                                       int64_t max_rank) {
  const std::string config_path = dir + "/adapter_config.json";
  INFERD_ASSIGN_OR_RETURN(std::string text, read_text_file(config_path));
  nlohmann::ordered_json cfg;
  try {
    cfg = nlohmann::ordered_json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    return invalid_argument(config_path + ": not JSON: " + e.what());
  }
  if (!cfg.is_object()) return invalid_argument(config_path + ": not a JSON object");
  auto field = [&](const char* name) -> const nlohmann::ordered_json* {
    auto it = cfg.find(name);
    return it == cfg.end() || it->is_null() ? nullptr : &*it;
  };
  auto truthy = [&](const char* name) {
    const auto* v = field(name);
    return v != nullptr && v->is_boolean() && v->get<bool>();
  };
  if (const auto* v = field("peft_type");
      v != nullptr && (!v->is_string() || v->get<std::string>() != "LORA"))
    return unsupported(config_path + ": peft_type " + v->dump() + " is not LORA");
  if (truthy("use_dora")) return unsupported(config_path + ": use_dora (DoRA) is not supported");
  if (truthy("lora_bias")) return unsupported(config_path + ": lora_bias is not supported");
  if (const auto* v = field("bias"); v != nullptr && (!v->is_string() || v->get<std::string>() != "none"))
    return unsupported(config_path + ": bias " + v->dump() +
                       " (trained biases) is not supported; only \"none\"");
  if (const auto* v = field("modules_to_save"); v != nullptr && !(v->is_array() && v->empty()))
    return unsupported(config_path + ": modules_to_save " + v->dump() +
                       " (whole replaced modules) is not supported");
  const auto* r = field("r");
  const auto* alpha = field("lora_alpha");
  if (r == nullptr || !r->is_number_integer())
    return invalid_argument(config_path + ": missing integer field 'r'");
  if (alpha == nullptr || !alpha->is_number())
    return invalid_argument(config_path + ": missing field 'lora_alpha'");
  const bool rslora = truthy("use_rslora");
  // target_modules: names (or "all-linear"); a string other than that is PEFT's regular
  // expression over module names, which the tensors below then show.
  if (const auto* v = field("target_modules"); v != nullptr && v->is_array()) {
    for (const auto& m : *v) {
      const std::string name = m.is_string() ? m.get<std::string>() : m.dump();
      if (std::find(kTargetNames.begin(), kTargetNames.end(), name) == kTargetNames.end())
        return unsupported(config_path + ": target module '" + name +
                           "' is not one of q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj");
    }
  }
  const std::string weights_path = dir + "/adapter_model.safetensors";
  if (!std::filesystem::exists(weights_path))
    return not_found(dir + ": no adapter_model.safetensors (adapter_model.bin, a pickle, is not read)");
  INFERD_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::open(weights_path));
  auto adapter = std::make_shared<LoraAdapter>();
  adapter->path = dir;
  adapter->format = "peft";
  PendingMap pending;
  Status pattern_error = Status::ok();
  for (const TensorView& t : file.tensors()) {
    std::string name = t.name;
    if (name.rfind("base_model.model.", 0) == 0) name = name.substr(17);
    bool is_a = false;
    const std::string module = strip_pair_suffix(name, ".lora_A.weight", ".lora_B.weight", &is_a);
    int64_t layer = 0;
    LayerTensor role{};
    std::optional<LoraTarget> target;
    if (!module.empty() && parse_layer_tensor(module + ".weight", &layer, &role)) target = target_of(role);
    if (!target)
      return unsupported(
          weights_path + ": tensor '" + t.name +
          "' is not a LoRA update of q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj or down_proj");
    Pending& p = pending[{layer, static_cast<int>(*target)}];
    (is_a ? p.a : p.b) = &t;
    p.rslora = rslora;
    p.alpha = alpha->get<double>();
    if (auto a = pattern_value(cfg.value("alpha_pattern", nlohmann::ordered_json()), module, "alpha_pattern",
                               &pattern_error))
      p.alpha = *a;
    p.declared_rank = r->get<int64_t>();
    if (auto rr = pattern_value(cfg.value("rank_pattern", nlohmann::ordered_json()), module, "rank_pattern",
                                &pattern_error))
      p.declared_rank = static_cast<int64_t>(*rr);
    if (!pattern_error.is_ok())
      return Status(pattern_error.code(), config_path + ": " + pattern_error.message());
  }
  INFERD_RETURN_IF_ERROR(finish(pending, base, max_rank, /*hf_layout=*/true, adapter.get()));
  return std::shared_ptr<const LoraAdapter>(std::move(adapter));
}

Expected<std::shared_ptr<const LoraAdapter>> load_gguf(const std::string& path, const ModelWeights& base,
                                                       int64_t max_rank) {
  INFERD_ASSIGN_OR_RETURN(GgufFile file, GgufFile::open(path));
  INFERD_ASSIGN_OR_RETURN(std::optional<std::string> type, file.get_string("general.type"));
  if (type != "adapter")
    return invalid_argument(path + ": general.type is " +
                            (type ? "'" + *type + "'" : std::string("missing")) +
                            ", not 'adapter': not a LoRA adapter");
  INFERD_ASSIGN_OR_RETURN(std::optional<std::string> adapter_type, file.get_string("adapter.type"));
  if (adapter_type != "lora")
    return unsupported(path + ": adapter.type is " +
                       (adapter_type ? "'" + *adapter_type + "'" : std::string("missing")) + ", not 'lora'");
  INFERD_ASSIGN_OR_RETURN(std::optional<std::string> arch, file.get_string("general.architecture"));
  if (arch != base.config.arch_name)
    return invalid_argument(path + ": an adapter for architecture '" + arch.value_or("?") +
                            "', the base is '" + base.config.arch_name + "'");
  INFERD_ASSIGN_OR_RETURN(std::optional<double> alpha, file.get_float("adapter.lora.alpha"));
  auto adapter = std::make_shared<LoraAdapter>();
  adapter->path = path;
  adapter->format = "gguf";
  PendingMap pending;
  for (const TensorView& t : file.tensors()) {
    const std::string& name = t.name;
    bool is_a = false;
    const std::string base_name = strip_pair_suffix(name, ".lora_a", ".lora_b", &is_a);
    int64_t layer = 0;
    LayerTensor role{};
    std::optional<LoraTarget> target;
    if (!base_name.empty() && parse_layer_tensor(base_name, &layer, &role)) target = target_of(role);
    if (!target)
      return unsupported(
          path + ": tensor '" + name +
          "' is not a LoRA update of attn_q, attn_k, attn_v, attn_output, ffn_gate, ffn_up or ffn_down");
    Pending& p = pending[{layer, static_cast<int>(*target)}];
    (is_a ? p.a : p.b) = &t;
    p.alpha = alpha.value_or(0.0);
  }
  INFERD_RETURN_IF_ERROR(finish(pending, base, max_rank, /*hf_layout=*/false, adapter.get()));
  return std::shared_ptr<const LoraAdapter>(std::move(adapter));
}

}  // namespace

namespace {
std::vector<float> widen(const std::vector<uint16_t>& v, DType dtype) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = dtype == DType::kF16 ? f16_to_f32(v[i]) : bf16_to_f32(v[i]);
  return out;
}
}  // namespace

std::vector<float> LoraMatrix::a_values() const {
  return dtype == DType::kF32 ? a : widen(a16, dtype);
}
std::vector<float> LoraMatrix::bt_values() const {
  return dtype == DType::kF32 ? bt : widen(bt16, dtype);
}

std::string_view lora_target_name(LoraTarget target) {
  return kTargetNames[static_cast<size_t>(target)];
}

std::array<int64_t, 2> lora_target_shape(const ModelConfig& c, LoraTarget target) {
  switch (target) {
    case LoraTarget::kQ: return {c.q_dim(), c.hidden_size};
    case LoraTarget::kK:
    case LoraTarget::kV: return {c.kv_dim(), c.hidden_size};
    case LoraTarget::kO: return {c.hidden_size, c.q_dim()};
    case LoraTarget::kGate:
    case LoraTarget::kUp: return {c.intermediate_size, c.hidden_size};
    case LoraTarget::kDown: return {c.hidden_size, c.intermediate_size};
  }
  return {0, 0};
}

Expected<std::shared_ptr<const LoraAdapter>> load_lora_adapter(const std::string& path,
                                                               const ModelWeights& base, int64_t max_rank) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) return load_peft(path, base, max_rank);
  if (!std::filesystem::exists(path, ec))
    return not_found(path + ": no such LoRA adapter (file or directory)");
  return load_gguf(path, base, max_rank);
}

}  // namespace inferd
