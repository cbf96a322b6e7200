#include "tools/gguf_from_hf.h"

#include <cstring>
#include <vector>

#include "model/tensor_names.h"
#include "tokenizer/pre_tokenizer.h"

namespace inferd {

namespace {

// llama.cpp's token types.
constexpr int64_t kNormal = 1, kControl = 3, kUserDefined = 4, kUnused = 5;

GgufValue scalar(GgufType type, int64_t i) {
  GgufValue v;
  v.type = type;
  v.int_value = i;
  return v;
}

GgufValue f32(double f) {
  GgufValue v;
  v.type = GgufType::kF32;
  v.float_value = f;
  return v;
}

GgufValue string(const std::string& s) {
  GgufValue v;
  v.type = GgufType::kString;
  v.string_value = s;
  return v;
}

GgufValue strings(std::vector<std::string> s) {
  GgufValue v;
  v.type = GgufType::kArray;
  v.array_type = GgufType::kString;
  v.array_strings = std::move(s);
  return v;
}

}  // namespace

Status set_gguf_model_metadata(const ModelConfig& c, const std::string& name, GgufFileWriter& out) {
  const std::string& a = c.arch_name;
  const RopeScaling& r = c.rope_scaling;
  out.set("general.architecture", string(a));
  out.set("general.type", string("model"));
  out.set("general.name", string(name));
  out.set_u32(a + ".block_count", static_cast<uint32_t>(c.num_layers));
  out.set_u32(a + ".context_length", static_cast<uint32_t>(c.max_position_embeddings));
  out.set_u32(a + ".embedding_length", static_cast<uint32_t>(c.hidden_size));
  out.set_u32(a + ".feed_forward_length", static_cast<uint32_t>(c.intermediate_size));
  out.set_u32(a + ".attention.head_count", static_cast<uint32_t>(c.num_heads));
  out.set_u32(a + ".attention.head_count_kv", static_cast<uint32_t>(c.num_kv_heads));
  if (r.type == RopeScalingType::kDynamic) {
    return unsupported("dynamic NTK rope scaling has no GGUF form (llama.cpp's converter drops it)");
  }
  if (r.type == RopeScalingType::kLinear || r.type == RopeScalingType::kYarn) {
    out.set(a + ".rope.scaling.type", string(std::string(rope_scaling_name(r.type))));
    out.set(a + ".rope.scaling.factor", f32(r.factor));
  }
  if (r.type == RopeScalingType::kYarn) {
    if (!r.truncate) return unsupported("yarn rope scaling with truncate = false has no GGUF form");
    out.set_u32(a + ".rope.scaling.original_context_length", static_cast<uint32_t>(r.original_context));
    // Written only where they differ from the defaults, as the converter writes only what the
    // config gives (the attention factor in transformers' meaning: the cos / sin multiplier).
    if (r.attention_factor != yarn_attention_factor(r.factor, 0, 0))
      out.set(a + ".rope.scaling.yarn_attn_factor", f32(r.attention_factor));
    if (r.beta_fast != 32.0) out.set(a + ".rope.scaling.yarn_beta_fast", f32(r.beta_fast));
    if (r.beta_slow != 1.0) out.set(a + ".rope.scaling.yarn_beta_slow", f32(r.beta_slow));
  }
  out.set(a + ".rope.freq_base", f32(c.rope_theta));
  out.set(a + ".attention.layer_norm_rms_epsilon", f32(c.rms_norm_eps));
  out.set_u32(a + ".attention.key_length", static_cast<uint32_t>(c.head_dim));
  out.set_u32(a + ".attention.value_length", static_cast<uint32_t>(c.head_dim));
  out.set_u32(a + ".vocab_size", static_cast<uint32_t>(c.vocab_size));
  out.set_u32(a + ".rope.dimension_count", static_cast<uint32_t>(c.head_dim));
  return Status::ok();
}

std::vector<float> gguf_rope_freqs(const ModelConfig& c) {
  if (c.rope_scaling.type != RopeScalingType::kLlama3) return c.rope_scaling.freq_factors;
  return llama3_rope_freq_factors(c.head_dim, c.rope_theta, c.rope_scaling);
}

Status set_gguf_tokenizer_metadata(const Vocab& v, int64_t vocab_size, GgufFileWriter& out) {
  if (static_cast<int64_t>(v.tokens.size()) > vocab_size)
    return invalid_argument("the tokenizer has more tokens than the model's vocabulary");
  // The GGUF pre-tokenizer name with exactly these patterns (and the same normalisation flags).
  std::string pre;
  for (const char* name : {"qwen2", "llama-bpe", "smollm", "gpt2"}) {
    auto patterns = PreTokenizer::patterns_for_gguf_pre(name);
    const bool nfc = std::string(name) == "qwen2", ignore = std::string(name) == "llama-bpe";
    if (patterns && *patterns == v.pre_tokenizer_patterns && nfc == v.nfc && ignore == v.ignore_merges) {
      pre = name;
      break;
    }
  }
  if (pre.empty())
    return unsupported(
        "the tokenizer's pre-tokenizer matches none GGUF names (qwen2, llama-bpe, smollm, gpt2)");
  std::vector<std::string> tokens(static_cast<size_t>(vocab_size));
  GgufValue types;
  types.type = GgufType::kArray;
  types.array_type = GgufType::kI32;
  types.array_ints.assign(static_cast<size_t>(vocab_size), kNormal);
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (i < v.tokens.size() && !v.tokens[i].empty()) {
      tokens[i] = v.tokens[i];
    } else {
      tokens[i] = "[PAD" + std::to_string(i) + "]";
      types.array_ints[i] = kUnused;
    }
  }
  for (const AddedToken& t : v.added_tokens) {
    if (t.id < 0 || t.id >= vocab_size) return invalid_argument("added token id outside the vocabulary");
    tokens[static_cast<size_t>(t.id)] = t.content;
    types.array_ints[static_cast<size_t>(t.id)] = t.special ? kControl : kUserDefined;
  }
  std::vector<std::string> merges;
  merges.reserve(v.merges.size());
  for (const auto& [l, r] : v.merges) merges.push_back(l + " " + r);
  out.set("tokenizer.ggml.model", string("gpt2"));
  out.set("tokenizer.ggml.pre", string(pre));
  out.set("tokenizer.ggml.tokens", strings(std::move(tokens)));
  out.set("tokenizer.ggml.token_type", std::move(types));
  out.set("tokenizer.ggml.merges", strings(std::move(merges)));
  if (v.bos_id) out.set_u32("tokenizer.ggml.bos_token_id", static_cast<uint32_t>(*v.bos_id));
  // GGUF appends its EOS (add_eos_token): a token appended other than the EOS becomes the EOS, as
  // llama.cpp's converter does for Qwen3-Embedding.
  if (v.append_id || v.eos_id)
    out.set_u32("tokenizer.ggml.eos_token_id", static_cast<uint32_t>(v.append_id ? *v.append_id : *v.eos_id));
  out.set("tokenizer.ggml.add_eos_token", scalar(GgufType::kBool, v.append_id ? 1 : 0));
  if (v.pad_id) out.set_u32("tokenizer.ggml.padding_token_id", static_cast<uint32_t>(*v.pad_id));
  out.set("tokenizer.ggml.add_bos_token", scalar(GgufType::kBool, v.add_bos ? 1 : 0));
  if (!v.chat_template.empty()) out.set("tokenizer.chat_template", string(v.chat_template));
  return Status::ok();
}

std::optional<std::string> gguf_tensor_name(const std::string& hf) {
  if (hf == "model.embed_tokens.weight") return "token_embd.weight";
  if (hf == "model.norm.weight") return "output_norm.weight";
  if (hf == "lm_head.weight") return "output.weight";
  int64_t layer = 0;
  LayerTensor role{};
  if (parse_layer_tensor(hf, &layer, &role)) return gguf_layer_tensor(role, layer);
  return std::nullopt;
}

int64_t rope_permute_heads(const ModelConfig& c, const std::string& hf) {
  int64_t layer = 0;
  LayerTensor role{};
  if (c.arch != Architecture::kLlama || !parse_layer_tensor(hf, &layer, &role)) return 0;
  if (role == LayerTensor::kWq) return c.num_heads;
  if (role == LayerTensor::kWk) return c.num_kv_heads;
  return 0;
}

void permute_rope_rows(float* w, int64_t rows, int64_t cols, int64_t heads) {
  // convert_hf_to_gguf's permute: w.reshape(heads, 2, half, cols).swapaxes(1, 2): new row
  // (h, i, j) (j in {0, 1}) is old row (h, j, i).
  const int64_t head_dim = rows / heads, half = head_dim / 2;
  std::vector<float> out(static_cast<size_t>(rows * cols));
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t i = 0; i < half; ++i)
      for (int64_t j = 0; j < 2; ++j) {
        const int64_t to = h * head_dim + 2 * i + j, from = h * head_dim + j * half + i;
        std::memcpy(&out[static_cast<size_t>(to * cols)], w + from * cols,
                    static_cast<size_t>(cols) * sizeof(float));
      }
  std::memcpy(w, out.data(), out.size() * sizeof(float));
}

}  // namespace inferd
