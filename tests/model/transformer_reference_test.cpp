// The forward pass against Hugging Face transformers' logits (tests/fixtures/tiny, written by
// scripts/fixtures/make_tiny_models.py), for every architecture, dtype and file format.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "model/model_loader.h"
#include "model/transformer.h"
#include "model_test_util.h"
#include "test_support.h"

namespace inferd {
namespace {

struct Reference {
  std::vector<std::vector<int32_t>> prompts;
  std::vector<float> logits;               // transformers in float32
  std::vector<float> logits_bf16_compute;  // transformers run natively in bf16 (bf16 variants)
  // transformers on the weights rounded as the F16 / Q8_0 GGUF files store them (f32 variants)
  std::map<std::string, std::vector<float>> logits_rounded_weights;
};

Reference load_reference(const std::string& variant) {
  const std::string dir = test::fixture_path("tiny/" + variant);
  auto j = nlohmann::json::parse(test::read_text(dir + "/reference.json"));
  Reference r;
  for (const auto& p : j["prompts"]) r.prompts.push_back(p.get<std::vector<int32_t>>());
  r.logits = test::read_f32(dir + "/" + j["logits_file"].get<std::string>());
  if (j.contains("logits_file_bf16_compute")) {
    r.logits_bf16_compute = test::read_f32(dir + "/" + j["logits_file_bf16_compute"].get<std::string>());
  }
  for (const char* label : {"f16", "q8_0"}) {
    const std::string key = std::string("logits_file_") + label + "_weights";
    if (j.contains(key))
      r.logits_rounded_weights[label] = test::read_f32(dir + "/" + j[key].get<std::string>());
  }
  return r;
}

struct Case {
  std::string variant;
  std::string file;  // "" = the Hugging Face directory
  double tolerance;  // max |diff| / max |ref| over all positions of all prompts
  // Positions allowed past `tolerance` (but within 3x): a quantized MoE file whose rounding moves
  // a token's k-th and (k+1)-th router probabilities past each other routes it to another
  // expert, a jump no bound on rounding covers. 0 for every dense case.
  int routing_flips = 0;
};

// Checks got against want ([positions, vocab]) to `tolerance` of max |want|, letting at most
// c.routing_flips positions exceed it by up to 3x; returns the largest error.
double expect_close(const Case& c, const std::vector<float>& got, const std::vector<float>& want,
                    size_t vocab, double tolerance, const char* what) {
  const double err = test::relative_max_error(got.data(), want.data(), got.size());
  if (c.routing_flips == 0) {
    EXPECT_LT(err, tolerance) << what;
    return err;
  }
  double max_ref = 0;
  for (float v : want) max_ref = std::max(max_ref, static_cast<double>(std::abs(v)));
  const size_t positions = got.size() / vocab;
  int over = 0;
  for (size_t t = 0; t < positions; ++t) {
    double e = 0;
    for (size_t i = t * vocab; i < (t + 1) * vocab; ++i)
      e = std::max(e, static_cast<double>(std::abs(got[i] - want[i])));
    over += e / max_ref >= tolerance;
  }
  std::printf("[ figures  ]   %s: %d of %zu positions past %.0e (routing flips, at most %d)\n", what, over,
              positions, tolerance, c.routing_flips);
  EXPECT_LE(over, c.routing_flips) << what;
  EXPECT_LT(err, 3 * tolerance) << what;
  return err;
}

std::ostream& operator<<(std::ostream& os, const Case& c) {
  return os << c.variant << "/" << c.file;
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  std::string name = info.param.variant + "_" + (info.param.file.empty() ? "safetensors" : info.param.file);
  for (auto& ch : name) {
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  }
  return name;
}

class ReferenceLogitsTest : public ::testing::TestWithParam<Case> {};

TEST_P(ReferenceLogitsTest, MatchesTransformers) {
  const Case& tc = GetParam();
  const Reference ref = load_reference(tc.variant);
  std::string path = test::fixture_path("tiny/" + tc.variant);
  if (!tc.file.empty()) path += "/" + tc.file;
  auto weights = load_model(path);
  ASSERT_TRUE(weights.has_value()) << weights.status().message();
  ThreadPool pool(2);
  Transformer model(**weights, pool);
  auto got = test::all_logits(model, ref.prompts, 0, /*together=*/false);
  ASSERT_EQ(got.size(), ref.logits.size());
  const auto vocab = static_cast<size_t>(model.config().vocab_size);
  const double err = expect_close(tc, got, ref.logits, vocab, tc.tolerance, "vs transformers f32");
  std::printf("[ figures  ] %s/%s: max |diff| / max |ref| = %.3g (bound %.0e)\n", tc.variant.c_str(),
              tc.file.empty() ? "safetensors" : tc.file.c_str(), err, tc.tolerance);
  if (!ref.logits_bf16_compute.empty()) {
    const double e16 = test::relative_max_error(got.data(), ref.logits_bf16_compute.data(), got.size());
    std::printf("[ figures  ] %s vs transformers bf16 compute: %.3g (bound 3e-2)\n", tc.variant.c_str(), e16);
    EXPECT_LT(e16, 3e-2);
    // The default path's BF16 dot products round activations to bf16; the f32 path computes on
    // the same bf16 weights exactly, as transformers' f32 run does.
    Transformer exact(**weights, pool, {.backend = BackendKind::kF32});
    auto exact_logits = test::all_logits(exact, ref.prompts, 0, /*together=*/false);
    const double e = test::relative_max_error(exact_logits.data(), ref.logits.data(), got.size());
    std::printf("[ figures  ] %s (f32 path) vs transformers f32: %.3g (bound 1e-4)\n", tc.variant.c_str(), e);
    EXPECT_LT(e, 1e-4);
  }
  // A quantized file must equal, to f32 rounding, transformers run on the very same rounded
  // weights: this separates loader/kernel errors from the format's own rounding.
  // Q8_0 runs the int8 kernels by default (activations rounded to 8 bits); the f32 path must
  // meet the 1e-4 bound, the int8 path the format's.
  for (const auto& [label, rounded] : ref.logits_rounded_weights) {
    if (tc.file != "model-" + label + ".gguf") continue;
    Transformer exact(**weights, pool, {.backend = BackendKind::kF32});
    auto exact_logits = test::all_logits(exact, ref.prompts, 0, /*together=*/false);
    const double e = test::relative_max_error(exact_logits.data(), rounded.data(), got.size());
    std::printf(
        "[ figures  ] %s/%s (f32 path) vs transformers on the same %s-rounded weights: %.3g (bound 1e-4)\n",
        tc.variant.c_str(), tc.file.c_str(), label.c_str(), e);
    EXPECT_LT(e, 1e-4);
    const double e8 =
        expect_close(tc, got, rounded, vocab, tc.tolerance, "default path vs the same rounded weights");
    std::printf("[ figures  ] %s/%s (default path) vs the same: %.3g (bound %.0e)\n", tc.variant.c_str(),
                tc.file.c_str(), e8, tc.tolerance);
  }
}

// Bounds: F32 1e-4 (the issue's); BF16 weights: the default path's BF16 dot products (activations
// rounded to bf16) 2e-2 against transformers run in f32 on the same bf16 weights (measured
// 0.7-0.9e-2) and 3e-2 against transformers' own bf16 arithmetic (which is itself 1.3-1.7e-2
// away from its f32 result on these models), the f32 path 1e-4 against the f32 run; GGUF F16 1e-2 and Q8_0
// 5e-2 against the f32 model (the formats' own rounding; see docs/model.md), and both 1e-4 against
// transformers on identically rounded weights. MoE Q8_0 files: the same bounds at all but at most 2
// of the 48 positions, where 8-bit rounding flipped a router's choice (measured: 1 position each,
// at 0.066-0.083; the median position is 0.012-0.014 from f32, below dense Qwen3's 0.017).
INSTANTIATE_TEST_SUITE_P(
    Tiny, ReferenceLogitsTest,
    ::testing::Values(Case{"llama_tied", "", 1e-4}, Case{"llama_untied", "", 1e-4}, Case{"qwen2", "", 1e-4},
                      Case{"qwen3", "", 1e-4}, Case{"llama_bf16", "", 2e-2}, Case{"qwen2_bf16", "", 2e-2},
                      Case{"qwen3_bf16", "", 2e-2}, Case{"llama_tied", "model-f32.gguf", 1e-4},
                      Case{"llama_untied", "model-f32.gguf", 1e-4}, Case{"qwen2", "model-f32.gguf", 1e-4},
                      Case{"qwen3", "model-f32.gguf", 1e-4}, Case{"llama_tied", "model-f16.gguf", 1e-2},
                      Case{"llama_untied", "model-f16.gguf", 1e-2}, Case{"qwen2", "model-f16.gguf", 1e-2},
                      Case{"qwen3", "model-f16.gguf", 1e-2}, Case{"llama_tied", "model-q8_0.gguf", 5e-2},
                      Case{"llama_untied", "model-q8_0.gguf", 5e-2}, Case{"qwen2", "model-q8_0.gguf", 5e-2},
                      Case{"qwen3", "model-q8_0.gguf", 5e-2}, Case{"qwen3_moe", "", 1e-4},
                      Case{"qwen2_moe", "", 1e-4}, Case{"qwen3_moe", "model-f32.gguf", 1e-4},
                      Case{"qwen2_moe", "model-f32.gguf", 1e-4},
                      Case{"qwen3_moe", "model-q8_0.gguf", 5e-2, 2},
                      Case{"qwen2_moe", "model-q8_0.gguf", 5e-2, 2}),
    case_name);

// RoPE scaling (scripts/fixtures/make_tiny_models.py: every prompt in the scaled regime; the
// dynamic-NTK variant's 29-token prompt past its 16-token context, its reference transformers
// decoding token by token). GGUF: llama.cpp's keys (linear, yarn) and rope_freqs.weight (llama3);
// llama.cpp writes no dynamic NTK.
INSTANTIATE_TEST_SUITE_P(RopeScaling, ReferenceLogitsTest,
                         ::testing::Values(Case{"llama_rope_llama3", "", 1e-4},
                                           Case{"qwen2_rope_yarn", "", 1e-4},
                                           Case{"llama_rope_linear", "", 1e-4},
                                           Case{"qwen2_rope_dynamic", "", 1e-4},
                                           Case{"llama_rope_llama3", "model-f32.gguf", 1e-4},
                                           Case{"qwen2_rope_yarn", "model-f32.gguf", 1e-4},
                                           Case{"llama_rope_linear", "model-f32.gguf", 1e-4}),
                         case_name);

class BatchInvarianceTest : public ::testing::TestWithParam<std::string> {};

void check_batch_invariance(const ModelWeights& weights, const Reference& ref);

// Several sequences of different lengths in one flattened batch give exactly (bitwise) the
// logits each gives alone; so does any chunking of the prompts.
TEST_P(BatchInvarianceTest, BatchedAndChunkedEqualAlone) {
  const Reference ref = load_reference(GetParam());
  auto weights = load_model(test::fixture_path("tiny/" + GetParam()));
  ASSERT_TRUE(weights.has_value()) << weights.status().message();
  check_batch_invariance(**weights, ref);
}

// The int8 kernels (Q8_0 GGUF) keep the invariance too.
TEST(TransformerTest, Q8GgufBatchedAndChunkedEqualAlone) {
  const Reference ref = load_reference("qwen2");
  auto weights = load_model(test::fixture_path("tiny/qwen2/model-q8_0.gguf"));
  ASSERT_TRUE(weights.has_value()) << weights.status().message();
  check_batch_invariance(**weights, ref);
}

void check_batch_invariance(const ModelWeights& weights, const Reference& ref) {
  ThreadPool pool(3);
  Transformer model(weights, pool);
  const auto alone = test::all_logits(model, ref.prompts, 0, false);
  ASSERT_FALSE(alone.empty());
  EXPECT_EQ(test::all_logits(model, ref.prompts, 0, true), alone);
  for (int64_t chunk : {1, 7, 16, 100}) {
    auto chunked = test::all_logits(model, ref.prompts, chunk, true);
    ASSERT_EQ(chunked.size(), alone.size());
    EXPECT_LT(test::relative_max_error(chunked.data(), alone.data(), alone.size()), 1e-5)
        << "chunk " << chunk;
    EXPECT_EQ(chunked, alone) << "chunk " << chunk;
  }
  // Another block size changes where K/V live, not the result.
  EXPECT_EQ(test::all_logits(model, ref.prompts, 5, true, /*block_size=*/3), alone);
}

INSTANTIATE_TEST_SUITE_P(Tiny, BatchInvarianceTest,
                         ::testing::Values("llama_untied", "qwen2", "qwen3", "qwen2_rope_yarn",
                                           "qwen2_rope_dynamic", "qwen3_moe", "qwen2_moe"));

// Mixture of experts on the int8 kernels: each expert runs over whichever rows the step routed
// to it, and a token's logits still do not depend on the others.
TEST(TransformerTest, MoeQ8GgufBatchedAndChunkedEqualAlone) {
  for (const char* variant : {"qwen3_moe", "qwen2_moe"}) {
    const Reference ref = load_reference(variant);
    auto weights = load_model(test::fixture_path(std::string("tiny/") + variant + "/model-q8_0.gguf"));
    ASSERT_TRUE(weights.has_value()) << weights.status().message();
    check_batch_invariance(**weights, ref);
  }
}

// The f32 reference path (BackendKind::kF32) keeps MoE batch-invariant too.
TEST(TransformerTest, MoeF32PathBatchedEqualAlone) {
  const Reference ref = load_reference("qwen2_moe");
  auto weights = load_model(test::fixture_path("tiny/qwen2_moe"));
  ASSERT_TRUE(weights.has_value()) << weights.status().message();
  ThreadPool pool(3);
  Transformer model(**weights, pool, {.backend = BackendKind::kF32});
  const auto alone = test::all_logits(model, ref.prompts, 0, false);
  ASSERT_FALSE(alone.empty());
  EXPECT_LT(test::relative_max_error(alone.data(), ref.logits.data(), alone.size()), 1e-4);
  EXPECT_EQ(test::all_logits(model, ref.prompts, 0, true), alone);
  EXPECT_EQ(test::all_logits(model, ref.prompts, 7, true), alone);
}

// K/V stored as f16, bf16 or in 8 bits (the engine's default is f16): logits stay close to f32
// storage, within each format's rounding (8 bits: a step of 1/127 of a head's largest value, or
// 3 mantissa bits for FP8).
TEST(TransformerTest, HalfPrecisionAndEightBitKvCacheStayClose) {
  const Reference ref = load_reference("qwen3");
  auto weights = load_model(test::fixture_path("tiny/qwen3"));
  ASSERT_TRUE(weights.has_value());
  ThreadPool pool(2);
  Transformer model(**weights, pool);
  for (KvDType dtype : {KvDType::kF16, KvDType::kBF16, KvDType::kInt8, KvDType::kFp8}) {
    auto got = test::all_logits(model, ref.prompts, 0, false, 16, dtype);
    ASSERT_EQ(got.size(), ref.logits.size());
    const double err = test::relative_max_error(got.data(), ref.logits.data(), got.size());
    std::printf("[ figures  ] qwen3 with %s KV cache vs transformers f32: %.3g\n",
                std::string(kv_dtype_name(dtype)).c_str(), err);
    const double bound = dtype == KvDType::kF16    ? 2e-3
                         : dtype == KvDType::kBF16 ? 2e-2
                         : dtype == KvDType::kInt8 ? 2e-2
                                                   : 8e-2;
    EXPECT_LT(err, bound);
    EXPECT_EQ(test::all_logits(model, ref.prompts, 7, true, 16, dtype), got);  // still batch-invariant
  }
}

TEST(TransformerTest, RejectsInconsistentBatch) {
  auto weights = load_model(test::fixture_path("tiny/qwen2"));
  ASSERT_TRUE(weights.has_value()) << weights.status().message();
  ThreadPool pool(1);
  Transformer model(**weights, pool);
  const ModelConfig& c = model.config();
  KvCache cache(c.num_layers, 2, 16, c.kv_dim());
  std::vector<int32_t> table{0, 1};
  std::vector<float> logits(static_cast<size_t>(c.vocab_size));
  int32_t id = 5, pos = 0, seq = 0, row = 0;
  int64_t slot = 0;
  AttentionSequence s{0, 1, 1, table};
  auto run = [&] {
    ForwardBatch b{{&id, 1}, {&pos, 1}, {&slot, 1}, {&seq, 1}, {&s, 1}, {&row, 1}};
    return model.forward(b, cache, logits);
  };
  EXPECT_TRUE(run().is_ok());
  id = static_cast<int32_t>(c.vocab_size);
  EXPECT_NE(run().message().find("outside the vocabulary"), std::string::npos);
  id = 5;
  slot = 32;
  EXPECT_NE(run().message().find("outside the cache"), std::string::npos);
  slot = 0;
  pos = 3;
  EXPECT_NE(run().message().find("position"), std::string::npos);
}

}  // namespace
}  // namespace inferd
