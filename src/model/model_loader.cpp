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

struct Names {
  std::function<std::string(LayerTensor, int64_t)> layer;
  std::string embedding, final_norm, lm_head;
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

  size_t bytes() const { return bytes_; }

 private:
  std::string source_;
  std::function<const TensorView*(const std::string&)> find_;
  size_t bytes_ = 0;
};

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
  Names names{gguf_layer_tensor, "token_embd.weight", "output_norm.weight", "output.weight"};
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
  Names names{hf_layer_tensor, "model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"};
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
