#include "model/model_loader.h"

#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "common/files.h"
#include "model/tensor_names.h"
#include "tensor/dequantize.h"

namespace inferd {

namespace {

namespace fs = std::filesystem;

class WeightBinder;

struct Names {
  std::function<std::string(LayerTensor, int64_t)> layer;
  std::string embedding, final_norm, lm_head;
  // Binds layer i's routed experts, whose layout differs between the formats.
  std::function<Status(WeightBinder&, const ModelConfig&, int64_t, MoeWeights*)> experts;
};

// Looks tensors up by name, checks their shapes and turns small ones into f32 vectors.
class WeightBinder {
 public:
  WeightBinder(std::string source, std::function<const TensorView*(const std::string&)> find)
      : source_(std::move(source)), find_(std::move(find)) {}

  Expected<TensorView> matrix(const std::string& name, int64_t rows, int64_t cols) {
    const TensorView* t = find_(name);
    if (t == nullptr) return not_found(source_ + ": missing tensor '" + name + "'");
    if (t->num_dims != 2 || t->shape[0] != rows || t->shape[1] != cols) {
      return corrupt_file(source_ + ": tensor '" + name + "' has shape " + t->shape_string() +
                          ", expected [" + std::to_string(rows) + ", " + std::to_string(cols) + "]");
    }
    bytes_ += t->num_bytes;
    return *t;
  }

  Expected<std::vector<float>> vector(const std::string& name, int64_t size) {
    const TensorView* t = find_(name);
    if (t == nullptr) return not_found(source_ + ": missing tensor '" + name + "'");
    if (t->num_elements() != size || t->row_length() != size) {
      return corrupt_file(source_ + ": tensor '" + name + "' has shape " + t->shape_string() +
                          ", expected [" + std::to_string(size) + "]");
    }
    std::vector<float> out(static_cast<size_t>(size));
    dequantize_tensor_row(*t, 0, out.data());
    bytes_ += t->num_bytes;
    return out;
  }

  // A [1, size] matrix stored as [1, size] or as [size].
  Expected<TensorView> row_vector(const std::string& name, int64_t size) {
    const TensorView* t = find_(name);
    if (t == nullptr) return not_found(source_ + ": missing tensor '" + name + "'");
    if (t->num_elements() != size || t->row_length() != size) {
      return corrupt_file(source_ + ": tensor '" + name + "' has shape " + t->shape_string() +
                          ", expected [1, " + std::to_string(size) + "]");
    }
    TensorView v = *t;
    v.num_dims = 2;
    v.shape = {1, size, 1, 1};
    bytes_ += t->num_bytes;
    return v;
  }

  // Rows [first, first + rows) of each expert's block of a stacked tensor [num_experts, stride,
  // cols], as one [rows, cols] view per expert named "<name>[e]".
  Expected<std::vector<TensorView>> experts(const std::string& name, int64_t num_experts, int64_t stride,
                                            int64_t first, int64_t rows, int64_t cols) {
    const TensorView* t = find_(name);
    if (t == nullptr) return not_found(source_ + ": missing tensor '" + name + "'");
    if (t->num_dims != 3 || t->shape[0] != num_experts || t->shape[1] != stride || t->shape[2] != cols) {
      return corrupt_file(source_ + ": tensor '" + name + "' has shape " + t->shape_string() +
                          ", expected [" + std::to_string(num_experts) + ", " + std::to_string(stride) +
                          ", " + std::to_string(cols) + "]");
    }
    std::vector<TensorView> out(static_cast<size_t>(num_experts));
    for (int64_t e = 0; e < num_experts; ++e) {
      TensorView& v = out[static_cast<size_t>(e)];
      const int64_t row = e * stride + first;
      v = *t;
      v.name = name + "[" + std::to_string(e) + "]";
      v.num_dims = 2;
      v.shape = {rows, cols, 1, 1};
      v.data = t->row(row);
      v.num_bytes = static_cast<size_t>(rows) * t->row_bytes();
      if (t->row_scale != nullptr) v.row_scale = t->row_scale + row;
    }
    bytes_ += static_cast<size_t>(num_experts * rows) * t->row_bytes();
    return out;
  }

  size_t bytes() const { return bytes_; }

 private:
  std::string source_;
  std::function<const TensorView*(const std::string&)> find_;
  size_t bytes_ = 0;
};

Status bind_moe(const Names& names, WeightBinder& b, const ModelConfig& c, int64_t i, MoeWeights* m) {
  auto n = [&](LayerTensor r) { return names.layer(r, i); };
  INFERD_ASSIGN_OR_RETURN(m->router, b.matrix(n(LayerTensor::kRouter), c.num_experts, c.hidden_size));
  INFERD_RETURN_IF_ERROR(names.experts(b, c, i, m));
  if (c.shared_expert_intermediate_size == 0) return Status::ok();
  const int64_t shared = c.shared_expert_intermediate_size;
  INFERD_ASSIGN_OR_RETURN(m->shared_gate, b.matrix(n(LayerTensor::kSharedGate), shared, c.hidden_size));
  INFERD_ASSIGN_OR_RETURN(m->shared_up, b.matrix(n(LayerTensor::kSharedUp), shared, c.hidden_size));
  INFERD_ASSIGN_OR_RETURN(m->shared_down, b.matrix(n(LayerTensor::kSharedDown), c.hidden_size, shared));
  INFERD_ASSIGN_OR_RETURN(m->shared_expert_gate,
                          b.row_vector(n(LayerTensor::kSharedExpertGate), c.hidden_size));
  return Status::ok();
}

// GGUF: each weight of all experts stacked in one tensor [num_experts, rows, cols].
Status bind_gguf_experts(WeightBinder& b, const ModelConfig& c, int64_t i, MoeWeights* m) {
  const int64_t e = c.num_experts, h = c.hidden_size, f = c.moe_intermediate_size;
  INFERD_ASSIGN_OR_RETURN(m->expert_gate,
                          b.experts(gguf_experts_tensor(ExpertTensor::kGate, i), e, f, 0, f, h));
  INFERD_ASSIGN_OR_RETURN(m->expert_up, b.experts(gguf_experts_tensor(ExpertTensor::kUp, i), e, f, 0, f, h));
  INFERD_ASSIGN_OR_RETURN(m->expert_down,
                          b.experts(gguf_experts_tensor(ExpertTensor::kDown, i), e, h, 0, h, f));
  return Status::ok();
}

// Hugging Face: one tensor per expert (checkpoints), or transformers 5's fused gate_up_proj /
// down_proj when the per-expert names are absent.
Status bind_hf_experts(WeightBinder& b, const ModelConfig& c, int64_t i, MoeWeights* m,
                       const std::function<const TensorView*(const std::string&)>& find) {
  const int64_t h = c.hidden_size, f = c.moe_intermediate_size;
  if (find(hf_expert_tensor(ExpertTensor::kGate, i, 0)) == nullptr) {
    const std::string gate_up = hf_fused_experts_tensor(ExpertTensor::kGate, i);
    const std::string down = hf_fused_experts_tensor(ExpertTensor::kDown, i);
    INFERD_ASSIGN_OR_RETURN(m->expert_gate, b.experts(gate_up, c.num_experts, 2 * f, 0, f, h));
    INFERD_ASSIGN_OR_RETURN(m->expert_up, b.experts(gate_up, c.num_experts, 2 * f, f, f, h));
    INFERD_ASSIGN_OR_RETURN(m->expert_down, b.experts(down, c.num_experts, h, 0, h, f));
    return Status::ok();
  }
  for (int64_t x = 0; x < c.num_experts; ++x) {
    INFERD_ASSIGN_OR_RETURN(TensorView gate, b.matrix(hf_expert_tensor(ExpertTensor::kGate, i, x), f, h));
    INFERD_ASSIGN_OR_RETURN(TensorView up, b.matrix(hf_expert_tensor(ExpertTensor::kUp, i, x), f, h));
    INFERD_ASSIGN_OR_RETURN(TensorView down, b.matrix(hf_expert_tensor(ExpertTensor::kDown, i, x), h, f));
    m->expert_gate.push_back(std::move(gate));
    m->expert_up.push_back(std::move(up));
    m->expert_down.push_back(std::move(down));
  }
  return Status::ok();
}

Status bind_weights(const Names& names, WeightBinder& b, ModelWeights* m) {
  const ModelConfig& c = m->config;
  INFERD_ASSIGN_OR_RETURN(m->token_embedding, b.matrix(names.embedding, c.vocab_size, c.hidden_size));
  INFERD_ASSIGN_OR_RETURN(m->final_norm, b.vector(names.final_norm, c.hidden_size));
  if (c.tie_word_embeddings) {
    m->lm_head = m->token_embedding;
  } else {
    INFERD_ASSIGN_OR_RETURN(m->lm_head, b.matrix(names.lm_head, c.vocab_size, c.hidden_size));
  }
  m->layers.resize(static_cast<size_t>(c.num_layers));
  for (int64_t i = 0; i < c.num_layers; ++i) {
    LayerWeights& l = m->layers[static_cast<size_t>(i)];
    auto n = [&](LayerTensor r) { return names.layer(r, i); };
    INFERD_ASSIGN_OR_RETURN(l.attn_norm, b.vector(n(LayerTensor::kAttnNorm), c.hidden_size));
    INFERD_ASSIGN_OR_RETURN(l.wq, b.matrix(n(LayerTensor::kWq), c.q_dim(), c.hidden_size));
    INFERD_ASSIGN_OR_RETURN(l.wk, b.matrix(n(LayerTensor::kWk), c.kv_dim(), c.hidden_size));
    INFERD_ASSIGN_OR_RETURN(l.wv, b.matrix(n(LayerTensor::kWv), c.kv_dim(), c.hidden_size));
    INFERD_ASSIGN_OR_RETURN(l.wo, b.matrix(n(LayerTensor::kWo), c.hidden_size, c.q_dim()));
    if (c.attention_bias) {
      INFERD_ASSIGN_OR_RETURN(l.bq, b.vector(n(LayerTensor::kBq), c.q_dim()));
      INFERD_ASSIGN_OR_RETURN(l.bk, b.vector(n(LayerTensor::kBk), c.kv_dim()));
      INFERD_ASSIGN_OR_RETURN(l.bv, b.vector(n(LayerTensor::kBv), c.kv_dim()));
    }
    if (c.qk_norm) {
      INFERD_ASSIGN_OR_RETURN(l.q_norm, b.vector(n(LayerTensor::kQNorm), c.head_dim));
      INFERD_ASSIGN_OR_RETURN(l.k_norm, b.vector(n(LayerTensor::kKNorm), c.head_dim));
    }
    INFERD_ASSIGN_OR_RETURN(l.ffn_norm, b.vector(n(LayerTensor::kFfnNorm), c.hidden_size));
    if (c.is_moe_layer(i)) {
      INFERD_RETURN_IF_ERROR(bind_moe(names, b, c, i, &l.moe));
      continue;
    }
    INFERD_ASSIGN_OR_RETURN(l.w_gate, b.matrix(n(LayerTensor::kGate), c.intermediate_size, c.hidden_size));
    INFERD_ASSIGN_OR_RETURN(l.w_up, b.matrix(n(LayerTensor::kUp), c.intermediate_size, c.hidden_size));
    INFERD_ASSIGN_OR_RETURN(l.w_down, b.matrix(n(LayerTensor::kDown), c.hidden_size, c.intermediate_size));
  }
  m->weight_bytes = b.bytes();
  return Status::ok();
}

Expected<std::unique_ptr<ModelWeights>> load_gguf(const std::string& path) {
  INFERD_ASSIGN_OR_RETURN(GgufFile file, GgufFile::open(path));
  auto m = std::make_unique<ModelWeights>();
  m->gguf = std::make_unique<GgufFile>(std::move(file));
  INFERD_ASSIGN_OR_RETURN(m->config, parse_gguf_config(*m->gguf));
  m->source_path = path;
  m->source_format = "gguf";
  const GgufFile* g = m->gguf.get();
  WeightBinder binder(path, [g](const std::string& n) { return g->find_tensor(n); });
  Names names{gguf_layer_tensor, "token_embd.weight", "output_norm.weight", "output.weight",
              bind_gguf_experts};
  INFERD_RETURN_IF_ERROR(bind_weights(names, binder, m.get()));
  return m;
}

// The safetensors files of a Hugging Face directory: model.safetensors or the shards its
// model.safetensors.index.json lists.
Expected<std::vector<std::string>> hf_weight_files(const fs::path& dir) {
  const fs::path index = dir / "model.safetensors.index.json";
  if (fs::exists(index)) {
    INFERD_ASSIGN_OR_RETURN(std::string text, read_text_file(index.string()));
    auto j = nlohmann::json::parse(text, nullptr, false);
    auto map = j.is_object() ? j.find("weight_map") : j.end();
    if (j.is_discarded() || !j.is_object() || map == j.end() || !map->is_object()) {
      return corrupt_file(index.string() + ": expected an object with a 'weight_map' object");
    }
    std::set<std::string> shards;
    for (auto& [name, file] : map->items()) {
      if (!file.is_string())
        return corrupt_file(index.string() + ": weight_map['" + name + "'] is not a string");
      const std::string f = file.get<std::string>();
      if (f.find('/') != std::string::npos || f.find("..") != std::string::npos) {
        return corrupt_file(index.string() + ": shard name '" + f + "' must be a plain file name");
      }
      shards.insert(f);
    }
    std::vector<std::string> out;
    for (const auto& s : shards) out.push_back((dir / s).string());
    return out;
  }
  const fs::path single = dir / "model.safetensors";
  if (!fs::exists(single)) {
    return not_found(dir.string() + ": no model.safetensors or model.safetensors.index.json");
  }
  return std::vector<std::string>{single.string()};
}

Expected<std::unique_ptr<ModelWeights>> load_hf_dir(const fs::path& dir) {
  const fs::path config_path = dir / "config.json";
  INFERD_ASSIGN_OR_RETURN(std::string config_text, read_text_file(config_path.string()));
  auto m = std::make_unique<ModelWeights>();
  INFERD_ASSIGN_OR_RETURN(m->config, parse_hf_config(config_path.string(), config_text));
  INFERD_ASSIGN_OR_RETURN(std::vector<std::string> files, hf_weight_files(dir));
  for (const auto& f : files) {
    INFERD_ASSIGN_OR_RETURN(SafetensorsFile st, SafetensorsFile::open(f));
    m->safetensors.push_back(std::move(st));
  }
  m->source_path = dir.string();
  m->source_format = "safetensors";
  const auto* shards = &m->safetensors;
  auto find = [shards](const std::string& n) -> const TensorView* {
    for (const auto& s : *shards) {
      if (const TensorView* t = s.find_tensor(n)) return t;
    }
    return nullptr;
  };
  // A checkpoint without lm_head ties it to the embedding whatever the config says.
  if (find("lm_head.weight") == nullptr) m->config.tie_word_embeddings = true;
  WeightBinder binder(dir.string(), find);
  Names names{hf_layer_tensor, "model.embed_tokens.weight", "model.norm.weight", "lm_head.weight",
              [find](WeightBinder& b, const ModelConfig& c, int64_t i, MoeWeights* moe) {
                return bind_hf_experts(b, c, i, moe, find);
              }};
  INFERD_RETURN_IF_ERROR(bind_weights(names, binder, m.get()));
  return m;
}

}  // namespace

Expected<std::unique_ptr<ModelWeights>> load_model(const std::string& path) {
  std::error_code ec;
  const fs::path p(path);
  if (fs::is_directory(p, ec)) return load_hf_dir(p);
  if (!fs::exists(p, ec)) return not_found(path + ": no such file or directory");
  return load_gguf(path);
}

}  // namespace inferd
