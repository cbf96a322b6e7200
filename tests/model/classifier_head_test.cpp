#include "model/classifier_head.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>

#include "formats/gguf_writer.h"
#include "model/model_loader.h"
#include "tensor/dequantize.h"
#include "test_support.h"

namespace inferd {
namespace {

std::vector<float> row_of(const TensorView& t, int64_t r) {
  std::vector<float> out(static_cast<size_t>(t.row_length()));
  dequantize_tensor_row(t, r, out.data());
  return out;
}

std::vector<float> head_row(const ClassifierHead& h, size_t l) {
  return {h.weight.begin() + static_cast<std::ptrdiff_t>(l * static_cast<size_t>(h.hidden_size)),
          h.weight.begin() + static_cast<std::ptrdiff_t>((l + 1) * static_cast<size_t>(h.hidden_size))};
}

std::unique_ptr<ModelWeights> load(const std::string& path) {
  auto w = load_model(path);
  EXPECT_TRUE(w.has_value()) << w.status().message();
  return w.has_value() ? std::move(*w) : nullptr;
}

// The fixtures' heads are rows of the body's embedding (scripts/fixtures/make_tiny_classifiers.py).
TEST(ClassifierHeadTest, ReadsTheHeadsOfBothFormatsAndNoneFromACausalLm) {
  const auto hf = load(test::fixture_path("tiny/qwen3_classifier"));
  ASSERT_TRUE(hf);
  auto head = load_classifier_head(*hf);
  ASSERT_TRUE(head.has_value()) << head.status().message();
  ASSERT_TRUE(head->has_value());
  const ClassifierHead& h = **head;
  EXPECT_EQ(h.labels, (std::vector<std::string>{"negative", "neutral", "positive"}));
  EXPECT_EQ(h.hidden_size, 64);
  EXPECT_TRUE(h.bias.empty());
  EXPECT_EQ(h.score_rule, ClassifierHead::ScoreRule::kNone);
  EXPECT_NE(h.origin.find("Qwen3ForSequenceClassification"), std::string::npos) << h.origin;
  const int64_t rows[] = {17, 101, 230};
  for (size_t l = 0; l < 3; ++l) EXPECT_EQ(head_row(h, l), row_of(hf->token_embedding, rows[l])) << l;

  const auto gguf = load(test::fixture_path("tiny/qwen3_classifier/rerank-f32.gguf"));
  ASSERT_TRUE(gguf);
  auto rank = load_classifier_head(*gguf);
  ASSERT_TRUE(rank.has_value()) << rank.status().message();
  ASSERT_TRUE(rank->has_value());
  EXPECT_EQ((*rank)->labels, (std::vector<std::string>{"yes", "no"}));
  EXPECT_EQ((*rank)->score_rule, ClassifierHead::ScoreRule::kFirstOfSoftmax);
  EXPECT_EQ(head_row(**rank, 0), row_of(gguf->token_embedding, 42));
  EXPECT_EQ(head_row(**rank, 1), row_of(gguf->token_embedding, 7));

  for (const char* plain : {"tiny/qwen3", "tiny/qwen3/model-f32.gguf"}) {
    const auto lm = load(test::fixture_path(plain));
    ASSERT_TRUE(lm);
    auto none = load_classifier_head(*lm);
    ASSERT_TRUE(none.has_value()) << none.status().message();
    EXPECT_FALSE(none->has_value()) << plain;
  }
}

// logits = W h + b, in double; probabilities: sigmoid of one logit, else the softmax; the score
// rules. Random shapes, odd sizes included.
TEST(ClassifierHeadTest, LogitsProbabilitiesAndScoresMatchTheScalarDefinitions) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t hidden : {1, 3, 17, 64, 67}) {
    for (size_t labels : {1u, 2u, 5u}) {
      for (bool with_bias : {false, true}) {
        ClassifierHead h;
        h.hidden_size = hidden;
        for (size_t i = 0; i < labels * static_cast<size_t>(hidden); ++i) h.weight.push_back(normal(rng));
        if (with_bias)
          for (size_t l = 0; l < labels; ++l) h.bias.push_back(normal(rng));
        for (size_t l = 0; l < labels; ++l) h.labels.push_back(std::string("L").append(std::to_string(l)));
        h.score_rule =
            labels == 1 ? ClassifierHead::ScoreRule::kSigmoid : ClassifierHead::ScoreRule::kFirstOfSoftmax;
        std::vector<float> x(static_cast<size_t>(hidden));
        for (float& v : x) v = normal(rng);
        const std::vector<float> logits = h.logits(x);
        ASSERT_EQ(logits.size(), labels);
        std::vector<double> want(labels);
        for (size_t l = 0; l < labels; ++l) {
          double s = with_bias ? h.bias[l] : 0.0;
          for (int64_t k = 0; k < hidden; ++k)
            s += static_cast<double>(h.weight[l * static_cast<size_t>(hidden) + static_cast<size_t>(k)]) *
                 x[static_cast<size_t>(k)];
          want[l] = s;
          EXPECT_NEAR(logits[l], s, 1e-5 * (1 + std::abs(s))) << hidden << " " << labels;
        }
        const std::vector<float> p = h.probabilities(logits);
        if (labels == 1) {
          EXPECT_NEAR(p[0], 1 / (1 + std::exp(-want[0])), 1e-6);
          EXPECT_NEAR(*h.score(logits, true), p[0], 1e-7);
        } else {
          double total = 0;
          for (double v : want) total += std::exp(v);
          double sum = 0;
          for (size_t l = 0; l < labels; ++l) {
            EXPECT_NEAR(p[l], std::exp(want[l]) / total, 1e-6);
            sum += p[l];
          }
          EXPECT_NEAR(sum, 1.0, 1e-6);
          EXPECT_NEAR(*h.score(logits, true), p[0], 1e-7);  // the first label's probability
        }
        EXPECT_EQ(*h.score(logits, false), logits[0]);  // no activation: the raw logit
        h.score_rule = ClassifierHead::ScoreRule::kNone;
        EXPECT_FALSE(h.score(logits, true).has_value());
      }
    }
  }
  // Large logits stay finite.
  ClassifierHead h;
  h.labels = {"a", "b"};
  const std::vector<float> big = {1000.0f, -1000.0f};
  const std::vector<float> p = h.probabilities(big);
  EXPECT_FLOAT_EQ(p[0], 1.0f);
  EXPECT_FLOAT_EQ(p[1], 0.0f);
}

// vLLM's classifier_from_token: one label per token's row; the two-way head's sigmoid is the
// softmax of the two tokens' logits (the original Qwen3-Reranker's p(yes)).
TEST(ClassifierHeadTest, FromTokensTakesTheVocabularyRows) {
  const auto w = load(test::fixture_path("tiny/qwen3"));
  ASSERT_TRUE(w);
  const std::vector<int32_t> ids = {7, 42};
  auto rows = classifier_from_tokens(*w, ids, {"no", "yes"}, false);
  ASSERT_TRUE(rows.has_value()) << rows.status().message();
  EXPECT_EQ(rows->labels, (std::vector<std::string>{"no", "yes"}));
  EXPECT_EQ(head_row(*rows, 0), row_of(w->lm_head, 7));
  EXPECT_EQ(head_row(*rows, 1), row_of(w->lm_head, 42));
  EXPECT_EQ(rows->score_rule, ClassifierHead::ScoreRule::kNone);
  auto two = classifier_from_tokens(*w, ids, {"no", "yes"}, true);
  ASSERT_TRUE(two.has_value()) << two.status().message();
  EXPECT_EQ(two->labels, (std::vector<std::string>{"yes"}));
  EXPECT_EQ(two->score_rule, ClassifierHead::ScoreRule::kSigmoid);
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int trial = 0; trial < 8; ++trial) {
    std::vector<float> x(64);
    for (float& v : x) v = normal(rng);
    const std::vector<float> pair = rows->logits(x);
    const double p_yes = std::exp(pair[1]) / (std::exp(pair[0]) + std::exp(pair[1]));
    EXPECT_NEAR(*two->score(two->logits(x), true), p_yes, 1e-5);
  }
  auto outside = classifier_from_tokens(*w, std::vector<int32_t>{256}, {"x"}, false);
  ASSERT_FALSE(outside.has_value());
  EXPECT_NE(outside.status().message().find("outside the vocabulary"), std::string::npos);
  auto three = classifier_from_tokens(*w, std::vector<int32_t>{1, 2, 3}, {"a", "b", "c"}, true);
  ASSERT_FALSE(three.has_value());
  EXPECT_NE(three.status().message().find("exactly two"), std::string::npos);
}

// A copy of the rank GGUF fixture with `edit` applied, loaded; the head's error.
std::string gguf_head_error(const std::function<void(GgufFileWriter&, const GgufFile&)>& edit) {
  auto src = GgufFile::open(test::fixture_path("tiny/qwen3_classifier/rerank-f32.gguf"));
  EXPECT_TRUE(src.has_value());
  GgufFileWriter w;
  for (const auto& [key, value] : src->metadata()) w.set(key, value);
  for (const TensorView& t : src->tensors())
    w.add_tensor(t.name, t.dtype, std::vector<int64_t>(t.shape.begin(), t.shape.begin() + t.num_dims),
                 std::vector<std::byte>(t.data, t.data + t.num_bytes));
  edit(w, *src);
  const std::string path = test::temp_dir() + "/edited.gguf";
  EXPECT_TRUE(w.write(path).is_ok());
  auto weights = load_model(path);
  EXPECT_TRUE(weights.has_value()) << weights.status().message();
  auto head = load_classifier_head(**weights);
  return head.has_value() ? "" : head.status().message();
}

TEST(ClassifierHeadTest, BrokenHeadsAreLoadErrorsNamingTheTensorOrKey) {
  // A classifier tensor in a file that is not of pooling type rank.
  EXPECT_NE(gguf_head_error([](GgufFileWriter& w, const GgufFile&) {
              w.set_u32("qwen3.pooling_type", 3);
            }).find("pooling_type is not 4"),
            std::string::npos);
  // Labels that do not match the rows.
  EXPECT_NE(gguf_head_error([](GgufFileWriter& w, const GgufFile& f) {
              GgufValue v = *f.find("qwen3.classifier.output_labels");
              v.array_strings.push_back("maybe");
              w.set("qwen3.classifier.output_labels", v);
            }).find("classifier.output_labels"),
            std::string::npos);
  // A BERT-style pre-classifier.
  EXPECT_NE(gguf_head_error([](GgufFileWriter& w, const GgufFile&) {
              w.add_tensor("cls.weight", DType::kF32, {64, 64}, std::vector<std::byte>(64 * 64 * 4));
            }).find("BERT-style"),
            std::string::npos);
  // A bias of the wrong size.
  EXPECT_NE(gguf_head_error([](GgufFileWriter& w, const GgufFile&) {
              w.add_tensor("cls.output.bias", DType::kF32, {3}, std::vector<std::byte>(12));
            }).find("cls.output.bias"),
            std::string::npos);

  // A Hugging Face checkpoint: an id2label entry outside the head's labels.
  const std::string dir = test::temp_dir();
  std::filesystem::copy(test::fixture_path("tiny/qwen3_classifier/model.safetensors"),
                        dir + "/model.safetensors");
  auto config =
      nlohmann::json::parse(test::read_text(test::fixture_path("tiny/qwen3_classifier/config.json")));
  config["id2label"] = {{"0", "a"}, {"5", "b"}};
  std::ofstream(dir + "/config.json") << config.dump();
  const auto w = load(dir);
  ASSERT_TRUE(w);
  auto bad = load_classifier_head(*w);
  ASSERT_FALSE(bad.has_value());
  EXPECT_NE(bad.status().message().find("id2label entry '5'"), std::string::npos) << bad.status().message();
}

}  // namespace
}  // namespace inferd
