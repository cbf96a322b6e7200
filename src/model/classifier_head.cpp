#include "model/classifier_head.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "common/files.h"
#include "tensor/dequantize.h"

namespace inferd {

namespace {

// The rows of a [labels, hidden] tensor as f32, checked against the hidden size.
Status read_rows(const std::string& where, const TensorView& t, int64_t hidden, std::vector<float>* out) {
  if (t.num_dims < 1 || t.num_dims > 2 || t.row_length() != hidden || t.num_rows() < 1)
    return corrupt_file(where + ": has shape " + t.shape_string() + ", expected [labels, " +
                        std::to_string(hidden) + "]");
  out->assign(static_cast<size_t>(t.num_rows() * hidden), 0.0f);
  for (int64_t r = 0; r < t.num_rows(); ++r) dequantize_tensor_row(t, r, out->data() + r * hidden);
  return Status::ok();
}

Status read_bias(const std::string& where, const TensorView& t, int64_t labels, std::vector<float>* out) {
  if (t.num_elements() != labels || t.row_length() != labels)
    return corrupt_file(where + ": has shape " + t.shape_string() + ", expected [" + std::to_string(labels) +
                        "]");
  out->assign(static_cast<size_t>(labels), 0.0f);
  dequantize_tensor_row(t, 0, out->data());
  return Status::ok();
}

Expected<std::optional<ClassifierHead>> gguf_head(const ModelWeights& w) {
  const GgufFile& g = *w.gguf;
  const std::string arch = w.config.arch_name;
  INFERD_ASSIGN_OR_RETURN(std::optional<int64_t> pooling, g.get_int(arch + ".pooling_type"));
  const TensorView* out = g.find_tensor("cls.output.weight");
  if (pooling != 4) {
    if (out != nullptr)
      return corrupt_file(w.source_path + ": has a classifier tensor 'cls.output.weight' but " + arch +
                          ".pooling_type is not 4 (rank)");
    return std::optional<ClassifierHead>();
  }
  if (g.find_tensor("cls.weight") != nullptr)
    return unsupported(w.source_path +
                       ": a BERT-style classification head ('cls.weight' before 'cls.output.weight') is "
                       "not supported; inferd serves decoder models");
  if (out == nullptr)
    return corrupt_file(w.source_path + ": " + arch +
                        ".pooling_type is 4 (rank) but the classifier tensor 'cls.output.weight' is missing");
  ClassifierHead h;
  h.hidden_size = w.config.hidden_size;
  INFERD_RETURN_IF_ERROR(
      read_rows(w.source_path + ": tensor 'cls.output.weight'", *out, h.hidden_size, &h.weight));
  const int64_t labels = static_cast<int64_t>(h.weight.size()) / h.hidden_size;
  if (const TensorView* b = g.find_tensor("cls.output.bias"))
    INFERD_RETURN_IF_ERROR(read_bias(w.source_path + ": tensor 'cls.output.bias'", *b, labels, &h.bias));
  const std::string key = arch + ".classifier.output_labels";
  if (const GgufValue* v = g.find(key)) {
    if (v->type != GgufType::kArray || v->array_type != GgufType::kString ||
        static_cast<int64_t>(v->array_strings.size()) != labels)
      return corrupt_file(w.source_path + ": " + key + " must be " + std::to_string(labels) +
                          " strings, one per row of 'cls.output.weight'");
    h.labels = v->array_strings;
  } else {
    for (int64_t i = 0; i < labels; ++i) h.labels.push_back("LABEL_" + std::to_string(i));
  }
  h.score_rule =
      labels == 1 ? ClassifierHead::ScoreRule::kSigmoid : ClassifierHead::ScoreRule::kFirstOfSoftmax;
  h.origin =
      "cls.output.weight of " + w.source_path + " (pooling type rank, " + std::to_string(labels) + " labels)";
  return std::optional<ClassifierHead>(std::move(h));
}

Expected<std::optional<ClassifierHead>> hf_head(const ModelWeights& w) {
  const std::string config = (std::filesystem::path(w.source_path) / "config.json").string();
  INFERD_ASSIGN_OR_RETURN(std::string text, read_text_file(config));
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  std::string arch_class;
  if (j.is_object()) {
    if (auto it = j.find("architectures");
        it != j.end() && it->is_array() && !it->empty() && (*it)[0].is_string())
      arch_class = (*it)[0].get<std::string>();
  }
  if (!is_sequence_classification(arch_class)) return std::optional<ClassifierHead>();
  const TensorView* score = nullptr;
  const TensorView* bias = nullptr;
  for (const SafetensorsFile& f : w.safetensors) {
    if (score == nullptr) score = f.find_tensor("score.weight");
    if (bias == nullptr) bias = f.find_tensor("score.bias");
  }
  if (score == nullptr)
    return corrupt_file(w.source_path + ": " + arch_class + " without a 'score.weight' tensor");
  ClassifierHead h;
  h.hidden_size = w.config.hidden_size;
  INFERD_RETURN_IF_ERROR(
      read_rows(w.source_path + ": tensor 'score.weight'", *score, h.hidden_size, &h.weight));
  const int64_t labels = static_cast<int64_t>(h.weight.size()) / h.hidden_size;
  if (bias != nullptr)
    INFERD_RETURN_IF_ERROR(read_bias(w.source_path + ": tensor 'score.bias'", *bias, labels, &h.bias));
  for (int64_t i = 0; i < labels; ++i) h.labels.push_back("LABEL_" + std::to_string(i));
  if (auto it = j.find("id2label"); it != j.end()) {
    if (!it->is_object()) return corrupt_file(config + ": id2label must be an object");
    for (const auto& [id, name] : it->items()) {
      char* end = nullptr;
      const long k = std::strtol(id.c_str(), &end, 10);
      if (id.empty() || *end != '\0' || k < 0 || k >= labels || !name.is_string())
        return corrupt_file(config + ": id2label entry '" + id + "' is not a label id in [0, " +
                            std::to_string(labels) + ") with a name");
      h.labels[static_cast<size_t>(k)] = name.get<std::string>();
    }
  }
  h.score_rule = labels == 1 ? ClassifierHead::ScoreRule::kSigmoid : ClassifierHead::ScoreRule::kNone;
  h.origin =
      "score.weight of " + arch_class + " " + w.source_path + " (" + std::to_string(labels) + " labels)";
  return std::optional<ClassifierHead>(std::move(h));
}

}  // namespace

std::vector<float> ClassifierHead::logits(std::span<const float> hidden) const {
  std::vector<float> out(labels.size());
  for (size_t l = 0; l < labels.size(); ++l) {
    const float* row = weight.data() + l * static_cast<size_t>(hidden_size);
    double sum = bias.empty() ? 0.0 : bias[l];
    for (int64_t k = 0; k < hidden_size && k < static_cast<int64_t>(hidden.size()); ++k)
      sum += static_cast<double>(row[k]) * hidden[static_cast<size_t>(k)];
    out[l] = static_cast<float>(sum);
  }
  return out;
}

std::vector<float> ClassifierHead::probabilities(std::span<const float> logits) const {
  std::vector<float> out(logits.size());
  if (logits.size() == 1) {
    out[0] = static_cast<float>(1.0 / (1.0 + std::exp(-static_cast<double>(logits[0]))));
    return out;
  }
  if (logits.empty()) return out;
  const double top = *std::max_element(logits.begin(), logits.end());
  double total = 0;
  for (float v : logits) total += std::exp(static_cast<double>(v) - top);
  for (size_t i = 0; i < logits.size(); ++i)
    out[i] = static_cast<float>(std::exp(static_cast<double>(logits[i]) - top) / total);
  return out;
}

std::optional<float> ClassifierHead::score(std::span<const float> logits, bool activation) const {
  if (score_rule == ScoreRule::kNone || logits.empty()) return std::nullopt;
  if (!activation) return logits[0];
  return probabilities(logits)[0];
}

bool is_sequence_classification(std::string_view architecture) {
  constexpr std::string_view kSuffix = "ForSequenceClassification";
  return architecture.size() > kSuffix.size() && architecture.ends_with(kSuffix);
}

Expected<std::optional<ClassifierHead>> load_classifier_head(const ModelWeights& weights) {
  if (weights.gguf != nullptr) return gguf_head(weights);
  return hf_head(weights);
}

Expected<ClassifierHead> classifier_from_tokens(const ModelWeights& weights, std::span<const int32_t> ids,
                                                std::vector<std::string> names, bool two_way) {
  const TensorView& head = weights.lm_head;
  const int64_t hidden = weights.config.hidden_size;
  if (ids.empty() || ids.size() != names.size())
    return invalid_argument("classifier_from_token: give one or more tokens");
  if (two_way && ids.size() != 2)
    return invalid_argument("classifier_from_token: the two-way head takes exactly two tokens (false, true)");
  if (head.num_rows() != weights.config.vocab_size || head.row_length() != hidden)
    return unsupported(
        "classifier_from_token: the vocabulary projection is split (tensor or pipeline parallel)");
  std::vector<std::vector<float>> rows;
  for (int32_t id : ids) {
    if (id < 0 || id >= head.num_rows())
      return invalid_argument("classifier_from_token: token id " + std::to_string(id) +
                              " is outside the vocabulary");
    rows.emplace_back(static_cast<size_t>(hidden));
    dequantize_tensor_row(head, id, rows.back().data());
  }
  ClassifierHead h;
  h.hidden_size = hidden;
  if (two_way) {
    h.weight.resize(static_cast<size_t>(hidden));
    for (int64_t k = 0; k < hidden; ++k)
      h.weight[static_cast<size_t>(k)] = rows[1][static_cast<size_t>(k)] - rows[0][static_cast<size_t>(k)];
    h.labels = {names[1]};
    h.score_rule = ClassifierHead::ScoreRule::kSigmoid;
    h.origin = "the vocabulary projection's rows '" + names[1] + "' - '" + names[0] + "' (--hf-overrides)";
  } else {
    for (const auto& r : rows) h.weight.insert(h.weight.end(), r.begin(), r.end());
    h.labels = std::move(names);
    h.score_rule =
        h.labels.size() == 1 ? ClassifierHead::ScoreRule::kSigmoid : ClassifierHead::ScoreRule::kNone;
    h.origin =
        "the vocabulary projection's rows of " + std::to_string(h.labels.size()) + " tokens (--hf-overrides)";
  }
  return h;
}

}  // namespace inferd
