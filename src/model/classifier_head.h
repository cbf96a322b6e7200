// ClassifierHead: a sequence-classification head on a decoder model, what cross-encoder rerankers
// (Qwen3-Reranker, its sequence-classification conversions) and text classifiers built on Qwen or
// Llama bodies add to the causal LM. It reads the final normed hidden state of the prompt's last
// token (the state the vocabulary projection reads) and gives one logit per label:
// logits = weight · h + bias. The server serves /classify, and /score and /rerank as a
// cross-encoder (one forward pass per query-document pair), from it (docs/server.md).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "model/model_weights.h"

namespace inferd {

struct ClassifierHead {
  // How a pair's relevance score is read from the logits (/score, /rerank).
  enum class ScoreRule {
    kSigmoid,         // one label: sigmoid(logit), as vLLM scores with a one-label classifier
    kFirstOfSoftmax,  // a GGUF rank head (llama.cpp's Qwen3-Reranker conversion: labels yes, no):
                      // the first label's softmax probability, as llama-server scores
    kNone,            // several labels of a classifier: /classify only
  };
  int64_t hidden_size = 0;
  std::vector<float> weight;  // [num_labels, hidden_size], row-major
  std::vector<float> bias;    // empty, or [num_labels]
  std::vector<std::string> labels;
  ScoreRule score_rule = ScoreRule::kNone;
  std::string origin;  // where it came from, for the start-up log

  int64_t num_labels() const { return static_cast<int64_t>(labels.size()); }
  // One logit per label from a hidden state of hidden_size values (sums in double).
  std::vector<float> logits(std::span<const float> hidden) const;
  // The labels' probabilities: sigmoid of a single logit, else the softmax (vLLM's classify).
  std::vector<float> probabilities(std::span<const float> logits) const;
  // A pair's score by score_rule; with activation false the raw logit (kSigmoid) or the first
  // label's logit (kFirstOfSoftmax). nullopt for kNone.
  std::optional<float> score(std::span<const float> logits, bool activation) const;
};

// The head a model file carries, nullopt when it has none:
// - a GGUF whose `<arch>.pooling_type` is 4 (rank): `cls.output.weight` [labels, hidden] and an
//   optional `cls.output.bias`, labels from `<arch>.classifier.output_labels` (llama.cpp's
//   layout for converted rerankers); a BERT-style `cls.weight` pre-classifier is refused;
// - a Hugging Face directory whose config.json names a `...ForSequenceClassification`
//   architecture: `score.weight` [labels, hidden] (and `score.bias` when present), labels from
//   `id2label` (LABEL_i when absent).
// Errors name the file and the tensor or key.
Expected<std::optional<ClassifierHead>> load_classifier_head(const ModelWeights& weights);

// Whether a Hugging Face architecture name is a sequence classifier (`...ForSequenceClassification`).
bool is_sequence_classification(std::string_view architecture);

// vLLM's `classifier_from_token` on a causal LM: the vocabulary projection's rows of `ids`, one
// label per token named by `names`; or, with `two_way` (vLLM's from_2_way_softmax, the original
// Qwen3-Reranker), one label whose weight is the second token's row minus the first's, so that
// sigmoid(logit) = softmax([logit_first, logit_second])[1]. Ids must be inside the vocabulary.
Expected<ClassifierHead> classifier_from_tokens(const ModelWeights& weights, std::span<const int32_t> ids,
                                                std::vector<std::string> names, bool two_way);

}  // namespace inferd
