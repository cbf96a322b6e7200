#include "tools/model_pruner.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <set>
#include <thread>

#include "common/files.h"
#include "eval/perplexity.h"
#include "formats/gguf_file.h"
#include "formats/gguf_writer.h"
#include "formats/row_scales.h"
#include "formats/safetensors_writer.h"
#include "model/model_loader.h"
#include "model/tensor_names.h"
#include "model/transformer.h"
#include "tensor/dequantize.h"
#include "tensor/quantize.h"
#include "tokenizer/tokenizer_loader.h"
#include "tools/hf_directory.h"

namespace inferd {

namespace fs = std::filesystem;

namespace {

bool parse_index(std::string_view s, int64_t* out) {
  if (s.empty()) return false;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && end == s.data() + s.size() && *out >= 0;
}

// "blk.<n>.<rest>" or "model.layers.<n>.<rest>" -> the prefix, n and ".<rest>".
bool layer_of(const std::string& name, std::string* prefix, int64_t* layer, std::string* rest) {
  for (const char* p : {"blk.", "model.layers."}) {
    const size_t len = std::char_traits<char>::length(p);
    if (name.rfind(p, 0) != 0) continue;
    const size_t dot = name.find('.', len);
    if (dot == std::string::npos || !parse_index(std::string_view(name).substr(len, dot - len), layer))
      return false;
    *prefix = p;
    *rest = name.substr(dot);
    return true;
  }
  return false;
}

// Everything one calibration run measures (see StructureImportance).
class ImportanceObserver final : public LinearObserver {
 public:
  explicit ImportanceObserver(const ModelConfig& c)
      : layers_(c.num_layers),
        heads_(c.num_heads),
        head_dim_(c.head_dim),
        influence_(static_cast<size_t>(layers_), 0.0),
        head_cov_(static_cast<size_t>(layers_)),
        channel_sq_(static_cast<size_t>(layers_)) {}

  void observe(int64_t layer, LinearInput input, const float* x, int64_t tokens, int64_t k) override {
    if (layer < 0 || layer >= layers_) return;
    if (input == LinearInput::kOutput && k == heads_ * head_dim_) {
      // Per head, the sum over tokens of o_h o_h^T (its upper triangle).
      std::vector<double>& cov = head_cov_[static_cast<size_t>(layer)];
      const int64_t d = head_dim_;
      cov.resize(static_cast<size_t>(heads_ * d * d), 0.0);
      for (int64_t t = 0; t < tokens; ++t) {
        for (int64_t h = 0; h < heads_; ++h) {
          const float* o = x + t * k + h * d;
          double* c = cov.data() + h * d * d;
          for (int64_t i = 0; i < d; ++i) {
            const double oi = o[i];
            for (int64_t j = i; j < d; ++j) c[i * d + j] += oi * o[j];
          }
        }
      }
    } else if (input == LinearInput::kDown) {
      std::vector<double>& sq = channel_sq_[static_cast<size_t>(layer)];
      sq.resize(static_cast<size_t>(k), 0.0);
      for (int64_t t = 0; t < tokens; ++t)
        for (int64_t j = 0; j < k; ++j)
          sq[static_cast<size_t>(j)] += static_cast<double>(x[t * k + j]) * x[t * k + j];
    }
  }

  void observe_hidden(int64_t layer, const float* hidden, int64_t tokens, int64_t dim) override {
    const auto n = static_cast<size_t>(tokens * dim);
    if (layer >= 0) {
      for (int64_t t = 0; t < tokens; ++t) {
        const float* a = prev_.data() + t * dim;
        const float* b = hidden + t * dim;
        double ab = 0, aa = 0, bb = 0;
        for (int64_t i = 0; i < dim; ++i) {
          ab += static_cast<double>(a[i]) * b[i];
          aa += static_cast<double>(a[i]) * a[i];
          bb += static_cast<double>(b[i]) * b[i];
        }
        const double cos = aa > 0 && bb > 0 ? ab / std::sqrt(aa * bb) : 1.0;
        influence_[static_cast<size_t>(layer)] += 1.0 - cos;
      }
    } else {
      tokens_ += tokens;
    }
    prev_.assign(hidden, hidden + n);
  }

  // The scores, with the weights that turn covariances into contributions.
  StructureImportance result(const ModelWeights& w) const {
    StructureImportance r;
    r.tokens = tokens_;
    r.num_kv_heads = w.config.num_kv_heads;
    const double per_token = tokens_ > 0 ? 1.0 / static_cast<double>(tokens_) : 0.0;
    for (double s : influence_) r.layer.push_back(s * per_token);
    r.head.resize(static_cast<size_t>(layers_));
    r.channel.resize(static_cast<size_t>(layers_));
    const int64_t d = head_dim_;
    for (int64_t l = 0; l < layers_; ++l) {
      const LayerWeights& lw = w.layers[static_cast<size_t>(l)];
      const std::vector<double>& cov = head_cov_[static_cast<size_t>(l)];
      if (!cov.empty() && lw.wo.data != nullptr) {
        // E ||W_h o_h||^2 = sum_ij (W_h^T W_h)_ij E[o_i o_j], W_h = wo's columns of head h.
        const int64_t cols = lw.wo.row_length();
        std::vector<double> gram(static_cast<size_t>(heads_ * d * d), 0.0);
        std::vector<float> row(static_cast<size_t>(cols));
        for (int64_t r0 = 0; r0 < lw.wo.num_rows(); ++r0) {
          dequantize_tensor_row(lw.wo, r0, row.data());
          for (int64_t h = 0; h < heads_; ++h) {
            const float* wh = row.data() + h * d;
            double* g = gram.data() + h * d * d;
            for (int64_t i = 0; i < d; ++i)
              for (int64_t j = i; j < d; ++j) g[i * d + j] += static_cast<double>(wh[i]) * wh[j];
          }
        }
        for (int64_t h = 0; h < heads_; ++h) {
          double s = 0;
          const double* g = gram.data() + h * d * d;
          const double* c = cov.data() + h * d * d;
          for (int64_t i = 0; i < d; ++i)
            for (int64_t j = i; j < d; ++j) s += (i == j ? 1.0 : 2.0) * g[i * d + j] * c[i * d + j];
          r.head[static_cast<size_t>(l)].push_back(s * per_token);
        }
      }
      const std::vector<double>& sq = channel_sq_[static_cast<size_t>(l)];
      if (!sq.empty() && lw.w_down.data != nullptr &&
          lw.w_down.row_length() == static_cast<int64_t>(sq.size())) {
        std::vector<double> norm(sq.size(), 0.0);
        std::vector<float> row(sq.size());
        for (int64_t r0 = 0; r0 < lw.w_down.num_rows(); ++r0) {
          dequantize_tensor_row(lw.w_down, r0, row.data());
          for (size_t j = 0; j < sq.size(); ++j) norm[j] += static_cast<double>(row[j]) * row[j];
        }
        for (size_t j = 0; j < sq.size(); ++j)
          r.channel[static_cast<size_t>(l)].push_back(sq[j] * per_token * norm[j]);
      }
    }
    return r;
  }

 private:
  int64_t layers_, heads_, head_dim_;
  std::vector<double> influence_;
  std::vector<std::vector<double>> head_cov_;    // [layer][head][d][d]
  std::vector<std::vector<double>> channel_sq_;  // [layer][channel]
  std::vector<float> prev_;
  int64_t tokens_ = 0;
};

// Indices 0..n-1 sorted by ascending score (ties: the lower index first).
std::vector<int64_t> by_score(const std::vector<double>& score) {
  std::vector<int64_t> order(score.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return score[static_cast<size_t>(a)] < score[static_cast<size_t>(b)];
  });
  return order;
}

}  // namespace

Expected<StructureImportance> structure_importance(const std::string& model_path,
                                                   const std::string& calibration_file, int64_t context,
                                                   int64_t max_chunks) {
  INFERD_ASSIGN_OR_RETURN(std::string text, read_text_file(calibration_file));
  INFERD_ASSIGN_OR_RETURN(std::unique_ptr<ModelWeights> weights, load_model(model_path));
  auto tokenizer = load_tokenizer(weights->gguf.get(), weights->source_path, weights->config.vocab_size);
  if (!tokenizer) return tokenizer.status().with_context("--calibration needs the model's tokenizer");
  const std::vector<int32_t> tokens = (*tokenizer)->encode(text, /*allow_special=*/false);
  ThreadPool pool(static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  auto r = structure_importance(*weights, tokens, context, max_chunks, pool);
  if (!r) return r.status().with_context("--calibration " + calibration_file);
  return r;
}

Expected<StructureImportance> structure_importance(const ModelWeights& weights,
                                                   std::span<const int32_t> tokens, int64_t context,
                                                   int64_t max_chunks, ThreadPool& pool) {
  Transformer model(weights, pool, {.backend = BackendKind::kF32});
  ImportanceObserver observer(weights.config);
  model.set_observer(&observer);
  PerplexityOptions options;
  options.context = context;
  options.max_chunks = max_chunks;
  INFERD_RETURN_IF_ERROR(options.validate());
  INFERD_RETURN_IF_ERROR(perplexity(model, tokens, options).status());
  return observer.result(weights);
}

std::vector<int64_t> least_important_layers(const std::vector<double>& influence, int64_t count) {
  const auto layers = static_cast<int64_t>(influence.size());
  std::vector<int64_t> candidates;
  for (int64_t l = 1; l + 1 < layers; ++l) candidates.push_back(l);
  std::stable_sort(candidates.begin(), candidates.end(), [&](int64_t a, int64_t b) {
    return influence[static_cast<size_t>(a)] < influence[static_cast<size_t>(b)];
  });
  candidates.resize(
      static_cast<size_t>(std::clamp<int64_t>(count, 0, static_cast<int64_t>(candidates.size()))));
  std::sort(candidates.begin(), candidates.end());
  return candidates;
}

Expected<std::vector<std::vector<int64_t>>> heads_to_keep(const std::vector<std::vector<double>>& importance,
                                                          int64_t num_heads, int64_t num_kv_heads,
                                                          double ratio) {
  if (!(ratio > 0 && ratio < 1)) return invalid_argument("--prune-heads: the ratio must lie between 0 and 1");
  if (num_kv_heads < 1 || num_heads % num_kv_heads != 0)
    return invalid_argument("--prune-heads: the model's heads do not form equal KV groups");
  const int64_t group = num_heads / num_kv_heads;
  // Per group when query heads share a KV head; whole heads (with their K and V) when not.
  const int64_t units = group > 1 ? group : num_heads;
  const auto cut = static_cast<int64_t>(std::llround(ratio * static_cast<double>(units)));
  if (cut < 1 || cut >= units)
    return invalid_argument("--prune-heads " + std::to_string(ratio) + ": removes " + std::to_string(cut) +
                            " of " + std::to_string(units) +
                            (group > 1 ? " query heads per KV group" : " heads") +
                            "; give a ratio that removes at least one and keeps at least one");
  std::vector<std::vector<int64_t>> keep;
  for (const std::vector<double>& score : importance) {
    if (static_cast<int64_t>(score.size()) != num_heads)
      return invalid_argument("--prune-heads: no head importance measured for a layer");
    std::vector<int64_t> kept;
    for (int64_t g = 0; g < (group > 1 ? num_kv_heads : 1); ++g) {
      const int64_t first = group > 1 ? g * group : 0;
      std::vector<double> s(score.begin() + first, score.begin() + first + units);
      std::vector<int64_t> order = by_score(s);
      for (size_t i = static_cast<size_t>(cut); i < order.size(); ++i) kept.push_back(first + order[i]);
    }
    std::sort(kept.begin(), kept.end());
    keep.push_back(std::move(kept));
  }
  return keep;
}

Expected<std::vector<std::vector<int64_t>>> channels_to_keep(
    const std::vector<std::vector<double>>& importance, double ratio) {
  if (!(ratio > 0 && ratio < 1)) return invalid_argument("--prune-ffn: the ratio must lie between 0 and 1");
  std::vector<std::vector<int64_t>> keep;
  for (const std::vector<double>& score : importance) {
    const auto n = static_cast<int64_t>(score.size());
    if (n == 0) return invalid_argument("--prune-ffn: no FFN channel importance measured for a layer (MoE?)");
    const int64_t wanted = n - static_cast<int64_t>(std::llround(ratio * static_cast<double>(n)));
    const int64_t kept_count = (wanted + 16) / 32 * 32;
    if (kept_count < 32 || kept_count >= n)
      return invalid_argument("--prune-ffn " + std::to_string(ratio) + ": " + std::to_string(n) +
                              " channels would keep " + std::to_string(kept_count) +
                              " (a multiple of 32); give a ratio that removes some and keeps some");
    std::vector<int64_t> order = by_score(score);
    std::vector<int64_t> kept(order.end() - kept_count, order.end());
    std::sort(kept.begin(), kept.end());
    keep.push_back(std::move(kept));
  }
  return keep;
}

Expected<std::vector<int64_t>> parse_layer_list(const std::string& text) {
  std::set<int64_t> layers;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = std::min(text.find(',', start), text.size());
    const std::string_view part = std::string_view(text).substr(start, comma - start);
    const size_t dash = part.find('-');
    int64_t a = 0, b = 0;
    const bool ok = dash == std::string_view::npos ? parse_index(part, &a) && (b = a, true)
                                                   : parse_index(part.substr(0, dash), &a) &&
                                                         parse_index(part.substr(dash + 1), &b) && a <= b;
    if (!ok)
      return invalid_argument("--drop-layers: \"" + std::string(part) +
                              "\" is not a layer index or range A-B");
    for (int64_t l = a; l <= b; ++l) layers.insert(l);
    start = comma + 1;
  }
  return std::vector<int64_t>(layers.begin(), layers.end());
}

namespace {

// A tensor cut down to some of its rows and columns.
struct Sliced {
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::vector<std::byte> data;
  std::vector<float> row_scales;  // row-scaled dtypes
  bool requantized = false;
};

// Rows `rows` of t (every row when null), each with the values at `cols` (every value when
// null). A 1-D tensor is one row. Columns that take or leave whole quantization blocks are copied
// as stored; otherwise the kept values are rounded again (to t's own type where inferd writes it
// and the blocks fit, else Q8_0, else F16).
Sliced slice(const TensorView& t, const std::vector<int64_t>* rows, const std::vector<int64_t>* cols) {
  const bool vector = t.num_dims < 2;
  const int64_t n_rows = vector ? 1 : t.num_rows();
  const int64_t n_cols = vector ? t.num_elements() : t.row_length();
  std::vector<int64_t> every_row;
  if (rows == nullptr) {
    every_row.resize(static_cast<size_t>(n_rows));
    std::iota(every_row.begin(), every_row.end(), 0);
    rows = &every_row;
  }
  const auto out_cols = cols == nullptr ? n_cols : static_cast<int64_t>(cols->size());
  const auto out_rows = static_cast<int64_t>(rows->size());
  Sliced s;
  s.shape = vector ? std::vector<int64_t>{out_cols} : std::vector<int64_t>{out_rows, out_cols};
  const DTypeInfo& info = dtype_info(t.dtype);
  const auto in_row = static_cast<size_t>(dtype_bytes(t.dtype, n_cols));
  // The kept blocks of a row, when the columns keep or leave whole blocks.
  std::vector<int64_t> blocks;
  bool aligned = true;
  if (cols != nullptr) {
    std::vector<char> kept(static_cast<size_t>(n_cols), 0);
    for (int64_t c : *cols) kept[static_cast<size_t>(c)] = 1;
    for (int64_t b = 0; b < n_cols; b += info.block_values) {
      const bool first = kept[static_cast<size_t>(b)] != 0;
      for (int64_t i = b; i < b + info.block_values; ++i)
        aligned &= (kept[static_cast<size_t>(i)] != 0) == first;
      if (first) blocks.push_back(b / info.block_values);
    }
  }
  if (aligned) {
    s.dtype = t.dtype;
    const auto out_row = static_cast<size_t>(dtype_bytes(t.dtype, out_cols));
    s.data.resize(out_row * static_cast<size_t>(out_rows));
    for (int64_t i = 0; i < out_rows; ++i) {
      const int64_t r = (*rows)[static_cast<size_t>(i)];
      const std::byte* src = t.data + static_cast<size_t>(r) * in_row;
      std::byte* dst = s.data.data() + static_cast<size_t>(i) * out_row;
      if (cols == nullptr) {
        std::copy_n(src, in_row, dst);
      } else {
        const auto bb = static_cast<size_t>(info.block_bytes);
        for (size_t k = 0; k < blocks.size(); ++k)
          std::copy_n(src + static_cast<size_t>(blocks[k]) * bb, bb, dst + k * bb);
      }
      if (t.row_scale != nullptr) s.row_scales.push_back(t.row_scale[r]);
    }
    return s;
  }
  const bool own =
      can_quantize_to(t.dtype) && !dtype_has_row_scale(t.dtype) && out_cols % info.block_values == 0;
  s.dtype = own                                                     ? t.dtype
            : out_cols % dtype_info(DType::kQ8_0).block_values == 0 ? DType::kQ8_0
                                                                    : DType::kF16;
  s.requantized = true;
  const auto out_row = static_cast<size_t>(dtype_bytes(s.dtype, out_cols));
  s.data.resize(out_row * static_cast<size_t>(out_rows));
  std::vector<float> row(static_cast<size_t>(n_cols)), kept(static_cast<size_t>(out_cols));
  for (int64_t i = 0; i < out_rows; ++i) {
    dequantize_tensor_row(t, (*rows)[static_cast<size_t>(i)], row.data());
    for (int64_t k = 0; k < out_cols; ++k)
      kept[static_cast<size_t>(k)] = row[static_cast<size_t>((*cols)[static_cast<size_t>(k)])];
    quantize_row(s.dtype, kept.data(), s.data.data() + static_cast<size_t>(i) * out_row, out_cols);
  }
  return s;
}

// The plan checked against the model, as row and column lists per layer.
struct Cuts {
  std::vector<int64_t> renumber;  // per input layer: its output index, -1 when dropped
  int64_t layers_out = 0;
  bool heads = false, kv = false, ffn = false;  // what changes
  int64_t heads_out = 0, kv_heads_out = 0, ffn_out = 0;
  std::vector<std::vector<int64_t>> q_rows, kv_rows, channels;  // per input layer
};

std::vector<int64_t> head_rows(const std::vector<int64_t>& heads, int64_t head_dim) {
  std::vector<int64_t> rows;
  for (int64_t h : heads)
    for (int64_t i = 0; i < head_dim; ++i) rows.push_back(h * head_dim + i);
  return rows;
}

bool ascending_in_range(const std::vector<int64_t>& v, int64_t n) {
  for (size_t i = 0; i < v.size(); ++i)
    if (v[i] < 0 || v[i] >= n || (i > 0 && v[i] <= v[i - 1])) return false;
  return true;
}

Expected<Cuts> resolve(const PrunePlan& plan, const ModelConfig& c) {
  Cuts k;
  const int64_t layers = c.num_layers;
  const std::set<int64_t> dropped(plan.drop_layers.begin(), plan.drop_layers.end());
  for (const int64_t l : dropped) {
    if (l < 0 || l >= layers)
      return invalid_argument("--drop-layers: layer " + std::to_string(l) +
                              " is out of range (the model has " + std::to_string(layers) + " layers, 0-" +
                              std::to_string(layers - 1) + ")");
  }
  k.layers_out = layers - static_cast<int64_t>(dropped.size());
  if (k.layers_out < 1) return invalid_argument("--drop-layers: every layer would be dropped");
  k.renumber.assign(static_cast<size_t>(layers), -1);
  for (int64_t l = 0, next = 0; l < layers; ++l)
    if (!dropped.contains(l)) k.renumber[static_cast<size_t>(l)] = next++;

  k.heads_out = c.num_heads;
  k.kv_heads_out = c.num_kv_heads;
  if (!plan.keep_heads.empty()) {
    if (static_cast<int64_t>(plan.keep_heads.size()) != layers)
      return invalid_argument("--prune-heads: a head list for each of the model's " + std::to_string(layers) +
                              " layers is needed");
    const int64_t group = c.num_heads / c.num_kv_heads;
    for (int64_t l = 0; l < layers; ++l) {
      const std::vector<int64_t>& heads = plan.keep_heads[static_cast<size_t>(l)];
      if (heads.empty() || !ascending_in_range(heads, c.num_heads))
        return invalid_argument("--prune-heads: layer " + std::to_string(l) +
                                "'s heads are not distinct heads of 0-" + std::to_string(c.num_heads - 1));
      std::map<int64_t, int64_t> per_group;
      for (int64_t h : heads) ++per_group[h / group];
      std::vector<int64_t> kv;
      for (const auto& [g, n] : per_group) {
        if (n != per_group.begin()->second)
          return invalid_argument("--prune-heads: layer " + std::to_string(l) +
                                  " keeps unequal numbers of query heads per KV group");
        kv.push_back(g);
      }
      const auto h_out = static_cast<int64_t>(heads.size()), kv_out = static_cast<int64_t>(kv.size());
      if (l > 0 && (h_out != k.heads_out || kv_out != k.kv_heads_out))
        return invalid_argument("--prune-heads: every layer must keep as many heads as the others");
      k.heads_out = h_out;
      k.kv_heads_out = kv_out;
      k.q_rows.push_back(head_rows(heads, c.head_dim));
      k.kv_rows.push_back(head_rows(kv, c.head_dim));
    }
    k.heads = k.heads_out != c.num_heads;
    k.kv = k.kv_heads_out != c.num_kv_heads;
  }
  k.ffn_out = c.intermediate_size;
  if (!plan.keep_channels.empty()) {
    if (c.is_moe()) return unsupported("--prune-ffn: mixture-of-experts models are not supported");
    if (static_cast<int64_t>(plan.keep_channels.size()) != layers)
      return invalid_argument("--prune-ffn: a channel list for each of the model's " +
                              std::to_string(layers) + " layers is needed");
    for (int64_t l = 0; l < layers; ++l) {
      const std::vector<int64_t>& ch = plan.keep_channels[static_cast<size_t>(l)];
      if (ch.empty() || !ascending_in_range(ch, c.intermediate_size))
        return invalid_argument("--prune-ffn: layer " + std::to_string(l) +
                                "'s channels are not distinct channels of 0-" +
                                std::to_string(c.intermediate_size - 1));
      if (l > 0 && static_cast<int64_t>(ch.size()) != k.ffn_out)
        return invalid_argument("--prune-ffn: every layer must keep as many channels as the others");
      k.ffn_out = static_cast<int64_t>(ch.size());
    }
    k.channels = plan.keep_channels;
    k.ffn = k.ffn_out != c.intermediate_size;
  }
  return k;
}

// Runs every tensor of `tensors` through the cuts: emit(name, sliced) for each kept one.
template <typename Emit>
Status prune_tensors(const std::vector<const TensorView*>& tensors, const Cuts& k, PruneReport* report,
                     Emit emit) {
  std::set<std::string> companions;
  for (const TensorView* t : tensors)
    if (dtype_has_row_scale(t->dtype)) companions.insert(row_scale_name(t->name));
  for (const TensorView* t : tensors) {
    report->input_bytes += t->num_bytes;
    if (companions.contains(t->name)) continue;  // written with its tensor
    std::string prefix, rest, name = t->name;
    int64_t layer = 0;
    LayerTensor role{};
    const bool in_layer = layer_of(t->name, &prefix, &layer, &rest);
    const bool known = parse_layer_tensor(t->name, &layer, &role);
    if (in_layer) {
      if (layer >= static_cast<int64_t>(k.renumber.size()))
        return corrupt_file("tensor " + t->name + " is past the model's layers");
      if (k.renumber[static_cast<size_t>(layer)] < 0) continue;
      name = prefix + std::to_string(k.renumber[static_cast<size_t>(layer)]) + rest;
    }
    const std::vector<int64_t>* rows = nullptr;
    const std::vector<int64_t>* cols = nullptr;
    const auto l = static_cast<size_t>(layer);
    if (known) {
      switch (role) {
        case LayerTensor::kWq: rows = k.heads ? &k.q_rows[l] : nullptr; break;
        case LayerTensor::kBq: cols = k.heads ? &k.q_rows[l] : nullptr; break;
        case LayerTensor::kWo: cols = k.heads ? &k.q_rows[l] : nullptr; break;
        case LayerTensor::kWk:
        case LayerTensor::kWv: rows = k.kv ? &k.kv_rows[l] : nullptr; break;
        case LayerTensor::kBk:
        case LayerTensor::kBv: cols = k.kv ? &k.kv_rows[l] : nullptr; break;
        case LayerTensor::kGate:
        case LayerTensor::kUp: rows = k.ffn ? &k.channels[l] : nullptr; break;
        case LayerTensor::kDown: cols = k.ffn ? &k.channels[l] : nullptr; break;
        default: break;
      }
    }
    if ((rows != nullptr || cols != nullptr) && t->num_dims > 2)
      return unsupported("tensor " + t->name + " has " + std::to_string(t->num_dims) + " dimensions");
    Sliced s;
    if (rows == nullptr && cols == nullptr) {
      s.dtype = t->dtype;
      s.shape.assign(t->shape.begin(), t->shape.begin() + t->num_dims);
      s.data.assign(t->data, t->data + t->num_bytes);
      if (t->row_scale != nullptr) s.row_scales.assign(t->row_scale, t->row_scale + t->num_rows());
    } else {
      s = slice(*t, rows, cols);
    }
    report->requantized += s.requantized;
    report->output_bytes += s.data.size() + s.row_scales.size() * sizeof(float);
    ++report->tensors_out;
    emit(name, std::move(s));
  }
  return Status::ok();
}

std::vector<std::byte> float_bytes(const std::vector<float>& v) {
  std::vector<std::byte> out(v.size() * sizeof(float));
  std::memcpy(out.data(), v.data(), out.size());
  return out;
}

template <typename Writer>
auto sliced_writer(Writer& out) {
  return [&out](const std::string& name, Sliced s) {
    if (!s.row_scales.empty())
      out.add_tensor(row_scale_name(name), DType::kF32, {static_cast<int64_t>(s.row_scales.size())},
                     float_bytes(s.row_scales));
    out.add_tensor(name, s.dtype, std::move(s.shape), std::move(s.data));
  };
}

Status prune_gguf(const std::string& input, const std::string& output, const Cuts& k, const ModelConfig& c,
                  PruneReport* report) {
  INFERD_ASSIGN_OR_RETURN(GgufFile in, GgufFile::open(input));
  const std::string p = c.arch_name + ".";
  const auto layers = static_cast<size_t>(c.num_layers);
  GgufFileWriter out;
  for (const auto& [key, value] : in.metadata()) {
    // Per-layer arrays of the architecture (head counts of models whose layers differ) lose the
    // dropped layers' entries.
    const bool per_layer =
        key.rfind(p, 0) == 0 && value.type == GgufType::kArray &&
        std::max({value.array_ints.size(), value.array_floats.size(), value.array_strings.size()}) == layers;
    if (!per_layer) {
      out.set(key, value);
      continue;
    }
    GgufValue v = value;
    auto keep = [&](auto& array) {
      if (array.size() != layers) return;
      std::remove_reference_t<decltype(array)> filtered;
      for (size_t l = 0; l < array.size(); ++l)
        if (k.renumber[l] >= 0) filtered.push_back(array[l]);
      array = std::move(filtered);
    };
    keep(v.array_ints);
    keep(v.array_floats);
    keep(v.array_strings);
    out.set(key, std::move(v));
  }
  out.set_u32(p + "block_count", static_cast<uint32_t>(k.layers_out));
  if (k.heads || k.kv) {
    out.set_u32(p + "attention.head_count", static_cast<uint32_t>(k.heads_out));
    out.set_u32(p + "attention.head_count_kv", static_cast<uint32_t>(k.kv_heads_out));
    // The head size no longer follows from embedding_length / head_count.
    out.set_u32(p + "attention.key_length", static_cast<uint32_t>(c.head_dim));
    out.set_u32(p + "attention.value_length", static_cast<uint32_t>(c.head_dim));
  }
  if (k.ffn) out.set_u32(p + "feed_forward_length", static_cast<uint32_t>(k.ffn_out));
  std::vector<const TensorView*> tensors;
  for (const TensorView& t : in.tensors()) tensors.push_back(&t);
  INFERD_RETURN_IF_ERROR(prune_tensors(tensors, k, report, sliced_writer(out)));
  return out.write(output);
}

Status prune_hf_dir(const fs::path& input, const fs::path& output, const Cuts& k, const ModelConfig& c,
                    PruneReport* report) {
  INFERD_ASSIGN_OR_RETURN(HfDirectory in, read_hf_directory(input, output));
  SafetensorsWriter out;
  INFERD_RETURN_IF_ERROR(prune_tensors(in.tensors, k, report, sliced_writer(out)));
  nlohmann::json& config = in.config;
  config["num_hidden_layers"] = k.layers_out;
  if (auto it = config.find("layer_types");
      it != config.end() && it->is_array() && it->size() == k.renumber.size()) {
    nlohmann::json kept = nlohmann::json::array();
    for (size_t l = 0; l < it->size(); ++l)
      if (k.renumber[l] >= 0) kept.push_back((*it)[l]);
    *it = kept;
  }
  if (k.heads || k.kv) {
    config["num_attention_heads"] = k.heads_out;
    config["num_key_value_heads"] = k.kv_heads_out;
    config["head_dim"] = c.head_dim;
  }
  if (k.ffn) config["intermediate_size"] = k.ffn_out;
  return write_hf_directory(input, output, config, out);
}

}  // namespace

Expected<PruneReport> prune_model(const std::string& input, const std::string& output,
                                  const PrunePlan& plan) {
  std::error_code ec;
  if (fs::exists(output, ec) && fs::equivalent(input, output, ec))
    return invalid_argument(output + ": the output must differ from the input");
  INFERD_ASSIGN_OR_RETURN(std::unique_ptr<ModelWeights> weights, load_model(input));
  const ModelConfig& c = weights->config;
  INFERD_ASSIGN_OR_RETURN(Cuts k, resolve(plan, c));
  PruneReport report;
  report.layers_in = c.num_layers;
  report.layers_out = k.layers_out;
  report.heads_in = c.num_heads;
  report.heads_out = k.heads_out;
  report.kv_heads_in = c.num_kv_heads;
  report.kv_heads_out = k.kv_heads_out;
  report.ffn_in = c.intermediate_size;
  report.ffn_out = k.ffn_out;
  const Status s = fs::is_directory(input, ec) ? prune_hf_dir(input, output, k, c, &report)
                                               : prune_gguf(input, output, k, c, &report);
  if (!s.is_ok()) return s.with_context(input);
  return report;
}

}  // namespace inferd
