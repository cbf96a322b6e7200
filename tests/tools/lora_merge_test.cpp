// `inferd quantize --lora` (the adapter merged into the weights for export) and `inferd
// perplexity --lora` (a model scored with an adapter), against peft's logits and each other.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>

#include "eval/perplexity.h"
#include "model/lora_adapter.h"
#include "model/model_loader.h"
#include "model/model_test_util.h"
#include "model/transformer.h"
#include "test_support.h"
#include "tools/model_quantizer.h"

namespace inferd {
namespace {

std::vector<std::vector<int32_t>> reference_prompts(const std::string& adapter, std::vector<float>* logits) {
  const std::string dir = test::fixture_path("tiny_lora/" + adapter);
  auto j = nlohmann::json::parse(test::read_text(dir + "/reference.json"));
  *logits = test::read_f32(dir + "/" + j["logits_file"].get<std::string>());
  std::vector<std::vector<int32_t>> prompts;
  for (const auto& p : j["prompts"]) prompts.push_back(p.get<std::vector<int32_t>>());
  return prompts;
}

struct MergeCase {
  std::string base, adapter, adapter_file, output;  // base: under tests/fixtures/tiny
};

class LoraMergeTest : public ::testing::TestWithParam<MergeCase> {};

// Merged into f32 weights, the model alone gives peft's logits of base + adapter.
TEST_P(LoraMergeTest, TheMergedModelGivesThePeftLogits) {
  const MergeCase& c = GetParam();
  const std::string out = test::temp_dir() + "/" + c.output;
  QuantizeOptions options;
  options.lora =
      test::fixture_path("tiny_lora/" + c.adapter) + (c.adapter_file.empty() ? "" : "/" + c.adapter_file);
  auto r = quantize_model(test::fixture_path("tiny/" + c.base), out, DType::kF32, {}, options);
  ASSERT_TRUE(r.has_value()) << r.status().message();
  EXPECT_EQ(r->lora_merged, 2 * 7);  // every target of both layers
  auto merged = load_model(out);
  ASSERT_TRUE(merged.has_value()) << merged.status().message();
  ThreadPool pool(2);
  Transformer model(**merged, pool);
  std::vector<float> want;
  const auto prompts = reference_prompts(c.adapter, &want);
  const auto got = test::all_logits(model, prompts, 0, true);
  ASSERT_EQ(got.size(), want.size());
  const double err = test::relative_max_error(got.data(), want.data(), got.size());
  std::printf("[ figures  ]   merged: max |diff| / max |ref| = %.2e\n", err);
  EXPECT_LT(err, 1e-4);
}

INSTANTIATE_TEST_SUITE_P(
    Tiny, LoraMergeTest,
    ::testing::Values(MergeCase{"qwen2", "qwen2_all", "", "merged"},
                      MergeCase{"qwen2/model-f32.gguf", "qwen2_all", "adapter-f32.gguf", "merged.gguf"},
                      // Q and K rows permuted on the way to GGUF: the update too.
                      MergeCase{"llama_untied", "llama_untied_all", "", "merged.gguf"},
                      MergeCase{"llama_untied/model-f32.gguf", "llama_untied_all", "", "merged.gguf"},
                      MergeCase{"qwen2", "qwen2_mixed", "", "merged"}));

TEST(LoraMergeTest, RefusesAnAdapterOfAnotherModelAndCalibrationTogether) {
  const std::string dir = test::temp_dir();
  QuantizeOptions options;
  options.lora = test::fixture_path("tiny_lora/qwen3_all");
  auto r = quantize_model(test::fixture_path("tiny/qwen2"), dir + "/out", DType::kF32, {}, options);
  ASSERT_FALSE(r.has_value());
  EXPECT_NE(r.status().message().find("do not fit"), std::string::npos) << r.status().message();
  options.lora = test::fixture_path("tiny_lora/qwen2_all");
  options.calibration_file = test::fixture_path("text/calibration.txt");
  r = quantize_model(test::fixture_path("tiny/qwen2"), dir + "/out", DType::kQ4_G128, {}, options);
  ASSERT_FALSE(r.has_value());
  EXPECT_NE(r.status().message().find("--lora and --calibration"), std::string::npos) << r.status().message();
}

// Perplexity with the adapter applied equals the merged model's, and differs from the base's.
TEST(LoraPerplexityTest, ScoringWithTheAdapterEqualsScoringTheMergedModel) {
  const std::string out = test::temp_dir() + "/merged";
  QuantizeOptions options;
  options.lora = test::fixture_path("tiny_lora/qwen2_all");
  ASSERT_TRUE(quantize_model(test::fixture_path("tiny/qwen2"), out, DType::kF32, {}, options).has_value());
  auto base = load_model(test::fixture_path("tiny/qwen2"));
  auto merged = load_model(out);
  ASSERT_TRUE(base.has_value() && merged.has_value());
  auto adapter = load_lora_adapter(options.lora, **base, 64);
  ASSERT_TRUE(adapter.has_value());
  std::mt19937 rng(5);
  std::vector<int32_t> ids(3 * 32);
  for (auto& t : ids) t = std::uniform_int_distribution<int32_t>(0, 255)(rng);
  ThreadPool pool(2);
  Transformer with_lora(**base, pool), merged_model(**merged, pool), plain(**base, pool);
  ASSERT_TRUE(with_lora.enable_lora().is_ok());
  auto a = perplexity(with_lora, ids, {.context = 32, .lora = adapter->get()});
  auto m = perplexity(merged_model, ids, {.context = 32});
  auto p = perplexity(plain, ids, {.context = 32});
  ASSERT_TRUE(a.has_value() && m.has_value() && p.has_value()) << a.status().message();
  std::printf("[ figures  ]   perplexity: base %.4f, with the adapter %.4f, merged %.4f\n", p->perplexity,
              a->perplexity, m->perplexity);
  EXPECT_NEAR(a->perplexity, m->perplexity, 1e-4 * m->perplexity);
  EXPECT_GT(std::abs(a->perplexity - p->perplexity), 0.01 * p->perplexity);
}

}  // namespace
}  // namespace inferd
