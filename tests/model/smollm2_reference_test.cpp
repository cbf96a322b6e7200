// The default model (SmolLM2-135M-Instruct Q4_1), teacher-forced, against llama.cpp
// (scripts/fixtures/make_llamacpp_reference.py, llama-cpp-python) and against transformers on
// the dequantized weights (scripts/fixtures/make_smollm2_hf_reference.py).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "engine/sampler.h"
#include "model/default_model.h"
#include "model/model_loader.h"
#include "model_test_util.h"
#include "test_support.h"

namespace inferd {
namespace {

std::unique_ptr<ModelWeights> load_default_or_skip() {
  auto path = default_model_path();
  if (!path) {
    if (test::prerequisites_required()) ADD_FAILURE() << path.status().message();
    return nullptr;
  }
  auto m = load_model(*path);
  EXPECT_TRUE(m.has_value()) << m.status().message();
  return m ? std::move(*m) : nullptr;
}

TEST(SmolLM2Test, ConfigFromGguf) {
  auto m = load_default_or_skip();
  INFERD_REQUIRE_OR_SKIP(m != nullptr, "default model not installed");
  const ModelConfig& c = m->config;
  EXPECT_EQ(c.arch, Architecture::kLlama);
  EXPECT_EQ(c.num_layers, 30);
  EXPECT_EQ(c.hidden_size, 576);
  EXPECT_EQ(c.num_heads, 9);
  EXPECT_EQ(c.num_kv_heads, 3);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.vocab_size, 49152);
  EXPECT_TRUE(c.tie_word_embeddings);
}

struct Agreement {
  int64_t positions = 0;
  double top1 = 0;           // share of positions whose argmax equals the reference's
  double max_top_diff = 0;   // max |ours - ref| over the reference's top-10 of every position
  double max_last_diff = 0;  // max |ours - ref| over the whole vocabulary at each last position
  double max_last_ref = 0;
};

// Teacher-forced comparison with a recorded reference (top-10 per position, full last logits).
Agreement compare_with(Transformer& model, const std::string& reference_json) {
  const std::string dir = test::fixture_path("smollm2");
  auto j = nlohmann::json::parse(test::read_text(dir + "/" + reference_json));
  const auto last_logits = test::read_f32(dir + "/" + j["last_logits_file"].get<std::string>());
  const int64_t vocab = model.config().vocab_size;
  Agreement a;
  int64_t agree = 0;
  size_t prompt_index = 0;
  for (const auto& p : j["prompts"]) {
    const auto ids = p["ids"].get<std::vector<int32_t>>();
    const auto top_ids = p["top_ids"].get<std::vector<std::vector<int32_t>>>();
    const auto top_logits = p["top_logits"].get<std::vector<std::vector<float>>>();
    EXPECT_EQ(top_ids.size(), ids.size());
    auto ours = test::all_logits(model, {ids}, 0, false);
    EXPECT_EQ(ours.size(), ids.size() * static_cast<size_t>(vocab));
    if (ours.size() != ids.size() * static_cast<size_t>(vocab)) return a;
    for (size_t pos = 0; pos < ids.size(); ++pos) {
      std::span<const float> row(ours.data() + pos * static_cast<size_t>(vocab), static_cast<size_t>(vocab));
      ++a.positions;
      if (argmax(row) == top_ids[pos][0]) ++agree;
      for (size_t k = 0; k < top_ids[pos].size(); ++k) {
        const double d =
            std::fabs(static_cast<double>(row[static_cast<size_t>(top_ids[pos][k])]) - top_logits[pos][k]);
        a.max_top_diff = std::max(a.max_top_diff, d);
      }
    }
    const float* ref_last = last_logits.data() + prompt_index * static_cast<size_t>(vocab);
    const float* our_last = ours.data() + (ids.size() - 1) * static_cast<size_t>(vocab);
    for (int64_t v = 0; v < vocab; ++v) {
      a.max_last_diff = std::max(a.max_last_diff, std::fabs(static_cast<double>(our_last[v]) - ref_last[v]));
      a.max_last_ref = std::max(a.max_last_ref, std::fabs(static_cast<double>(ref_last[v])));
    }
    ++prompt_index;
  }
  a.top1 = static_cast<double>(agree) / static_cast<double>(a.positions);
  return a;
}

void print(const char* peer, const Agreement& a) {
  std::printf(
      "[ figures  ] SmolLM2 Q4_1 vs %s: %lld positions, top-1 agreement %.2f%%, max |diff| on the "
      "reference's top-10 %.4g, max |diff| over the vocab at last positions %.4g (max |logit| %.2f)\n",
      peer, static_cast<long long>(a.positions), 100 * a.top1, a.max_top_diff, a.max_last_diff,
      a.max_last_ref);
}

Agreement run_against(const char* reference_json, const char* peer, BackendKind path) {
  auto m = load_default_or_skip();
  if (!m) return {};
  ThreadPool pool(2);
  Transformer model(*m, pool, {.backend = path});
  const Agreement a = compare_with(model, reference_json);
  print(peer, a);
  EXPECT_GE(a.positions, 3 * 64);
  return a;
}

// Both round activations to 8 bits inside the quantized dot products, but not identically
// (llama.cpp keeps Q8_1's scale and sum in f16, inferd in f32), so a few near-ties may flip: 97.6 %
// to 98.4 % of 251 positions agree depending on the build (a sanitizer build rounds some sums
// differently), against 100 % on the exact reference below.
TEST(SmolLM2Test, TeacherForcedLogitsAgreeWithLlamaCpp) {
  const Agreement a = run_against("llamacpp_reference.json", "llama.cpp", BackendKind::kPacked);
  INFERD_REQUIRE_OR_SKIP(a.positions > 0, "default model not installed");
  EXPECT_GE(a.top1, 0.97);
  EXPECT_LT(a.max_last_diff, 0.05 * a.max_last_ref);
}

// The f32 path (weights expanded to f32) is not faster than llama.cpp but closer to the reference.
TEST(SmolLM2Test, TeacherForcedLogitsAgreeWithLlamaCppOnTheF32Path) {
  const Agreement a =
      run_against("llamacpp_reference.json", "llama.cpp (inferd f32 path)", BackendKind::kF32);
  INFERD_REQUIRE_OR_SKIP(a.positions > 0, "default model not installed");
  EXPECT_GE(a.top1, 0.97);
  EXPECT_LT(a.max_last_diff, 0.05 * a.max_last_ref);
}

// The int8 path against the exact reference: the activation rounding moves logits by about one
// unit at most and keeps the argmax at nearly every position.
TEST(SmolLM2Test, Int8PathStaysCloseToTransformersOnDequantizedWeights) {
  const Agreement a = run_against("hf_dequant_reference.json",
                                  "transformers (f32, dequantized; inferd int8 path)", BackendKind::kPacked);
  INFERD_REQUIRE_OR_SKIP(a.positions > 0, "default model not installed");
  EXPECT_GE(a.top1, 0.96);
  EXPECT_LT(a.max_last_diff, 0.05 * a.max_last_ref);
}

// transformers in f32 on gguf-py's dequantization of the same file: the exact reference, which
// inferd's f32 path matches.
TEST(SmolLM2Test, TeacherForcedLogitsMatchTransformersOnDequantizedWeights) {
  const Agreement a =
      run_against("hf_dequant_reference.json", "transformers (f32, dequantized weights)", BackendKind::kF32);
  INFERD_REQUIRE_OR_SKIP(a.positions > 0, "default model not installed");
  EXPECT_EQ(a.top1, 1.0);
  EXPECT_LT(a.max_last_diff, 1e-4 * a.max_last_ref);
}

}  // namespace
}  // namespace inferd
