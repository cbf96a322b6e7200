#include "tools/model_pruner.h"

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <set>

#include <cmath>
#include <numeric>
#include <thread>

#include "common/files.h"
#include "common/thread_pool.h"
#include "eval/perplexity.h"
#include "formats/gguf_file.h"
#include "formats/gguf_writer.h"
#include "model/model_loader.h"
#include "model/transformer.h"
#include "tokenizer/tokenizer_loader.h"

namespace inferd {

namespace {

bool parse_index(std::string_view s, int64_t* out) {
  if (s.empty()) return false;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && end == s.data() + s.size() && *out >= 0;
}

// "blk.<n>.<rest>" -> n and rest.
bool layer_of(const std::string& name, int64_t* layer, std::string* rest) {
  if (name.rfind("blk.", 0) != 0) return false;
  const size_t dot = name.find('.', 4);
  if (dot == std::string::npos || !parse_index(std::string_view(name).substr(4, dot - 4), layer))
    return false;
  *rest = name.substr(dot);
  return true;
}

// Sums 1 - cos(before, after) per layer over every token the model runs.
class InfluenceObserver final : public LinearObserver {
 public:
  explicit InfluenceObserver(int64_t layers) : sum_(static_cast<size_t>(layers), 0.0) {}
  void observe(int64_t, LinearInput, const float*, int64_t, int64_t) override {}
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
        sum_[static_cast<size_t>(layer)] += 1.0 - cos;
      }
    } else {
      tokens_ += tokens;
    }
    prev_.assign(hidden, hidden + n);
  }
  LayerImportance result() const {
    LayerImportance r;
    r.tokens = tokens_;
    for (double s : sum_) r.influence.push_back(tokens_ > 0 ? s / static_cast<double>(tokens_) : 0.0);
    return r;
  }

 private:
  std::vector<double> sum_;
  std::vector<float> prev_;
  int64_t tokens_ = 0;
};

}  // namespace

Expected<LayerImportance> layer_importance(const std::string& model_path, const std::string& calibration_file,
                                           int64_t context, int64_t max_chunks) {
  INFERD_ASSIGN_OR_RETURN(std::string text, read_text_file(calibration_file));
  INFERD_ASSIGN_OR_RETURN(std::unique_ptr<ModelWeights> weights, load_model(model_path));
  auto tokenizer = load_tokenizer(weights->gguf.get(), weights->source_path, weights->config.vocab_size);
  if (!tokenizer) return tokenizer.status().with_context("--calibration needs the model's tokenizer");
  const std::vector<int32_t> tokens = (*tokenizer)->encode(text, /*allow_special=*/false);
  ThreadPool pool(static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  auto r = layer_importance(*weights, tokens, context, max_chunks, pool);
  if (!r) return r.status().with_context("--calibration " + calibration_file);
  return r;
}

Expected<LayerImportance> layer_importance(const ModelWeights& weights, std::span<const int32_t> tokens,
                                           int64_t context, int64_t max_chunks, ThreadPool& pool) {
  Transformer model(weights, pool, {.backend = BackendKind::kF32});
  InfluenceObserver observer(weights.config.num_layers);
  model.set_observer(&observer);
  PerplexityOptions options;
  options.context = context;
  options.max_chunks = max_chunks;
  INFERD_RETURN_IF_ERROR(options.validate());
  INFERD_RETURN_IF_ERROR(perplexity(model, tokens, options).status());
  return observer.result();
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

Expected<PruneReport> prune_gguf_layers(const std::string& input, const std::string& output,
                                        const std::vector<int64_t>& drop) {
  std::error_code ec;
  if (std::filesystem::exists(output, ec) && std::filesystem::equivalent(input, output, ec))
    return invalid_argument(output + ": the output must differ from the input");
  INFERD_ASSIGN_OR_RETURN(GgufFile in, GgufFile::open(input));
  INFERD_ASSIGN_OR_RETURN(std::optional<std::string> arch, in.get_string("general.architecture"));
  if (!arch) return corrupt_file(input + ": no general.architecture (not a GGUF model)");
  const std::string count_key = *arch + ".block_count";
  INFERD_ASSIGN_OR_RETURN(std::optional<int64_t> count, in.get_int(count_key));
  if (!count || *count < 1) return corrupt_file(input + ": no " + count_key);
  const std::set<int64_t> dropped(drop.begin(), drop.end());
  for (const int64_t l : dropped) {
    if (l >= *count)
      return invalid_argument("--drop-layers: layer " + std::to_string(l) +
                              " is out of range (the model has " + std::to_string(*count) + " layers, 0-" +
                              std::to_string(*count - 1) + ")");
  }
  const auto kept = *count - static_cast<int64_t>(dropped.size());
  if (kept < 1) return invalid_argument("--drop-layers: every layer would be dropped");
  std::vector<int64_t> renumber(static_cast<size_t>(*count), -1);
  for (int64_t l = 0, next = 0; l < *count; ++l)
    if (!dropped.contains(l)) renumber[static_cast<size_t>(l)] = next++;

  GgufFileWriter out;
  for (const auto& [key, value] : in.metadata()) {
    // Per-layer arrays of the architecture (head counts of models whose layers differ) lose the
    // dropped layers' entries.
    const bool per_layer = key.rfind(*arch + ".", 0) == 0 && value.type == GgufType::kArray &&
                           static_cast<int64_t>(std::max({value.array_ints.size(), value.array_floats.size(),
                                                          value.array_strings.size()})) == *count;
    if (!per_layer) {
      out.set(key, value);
      continue;
    }
    GgufValue v = value;
    auto keep = [&](auto& array) {
      if (static_cast<int64_t>(array.size()) != *count) return;
      std::remove_reference_t<decltype(array)> filtered;
      for (size_t l = 0; l < array.size(); ++l)
        if (renumber[l] >= 0) filtered.push_back(array[l]);
      array = std::move(filtered);
    };
    keep(v.array_ints);
    keep(v.array_floats);
    keep(v.array_strings);
    out.set(key, std::move(v));
  }
  out.set_u32(count_key, static_cast<uint32_t>(kept));
  PruneReport report;
  report.layers_in = *count;
  report.layers_out = kept;
  for (const TensorView& t : in.tensors()) {
    report.input_bytes += t.num_bytes;
    int64_t layer = 0;
    std::string rest, name = t.name;
    if (layer_of(t.name, &layer, &rest)) {
      if (layer >= *count) return corrupt_file(input + ": tensor " + t.name + " is past " + count_key);
      if (renumber[static_cast<size_t>(layer)] < 0) continue;
      name = "blk." + std::to_string(renumber[static_cast<size_t>(layer)]) + rest;
    }
    std::vector<int64_t> shape(t.shape.begin(), t.shape.begin() + t.num_dims);
    out.add_tensor(name, t.dtype, std::move(shape), std::vector<std::byte>(t.data, t.data + t.num_bytes));
    report.output_bytes += t.num_bytes;
    ++report.tensors_out;
  }
  INFERD_RETURN_IF_ERROR(out.write(output));
  return report;
}

}  // namespace inferd
