// LoRA adapters against peft's logits (tests/fixtures/tiny_lora, written by
// scripts/fixtures/make_tiny_loras.py): both adapter formats on both base formats, every target
// module, two ranks (and a rank pattern), rsLoRA, F32 / F16 / BF16 adapter weights; a batch
// mixing adapters and the base row by row as each prompt alone; refusals naming what is wrong.
#include "model/lora_adapter.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>

#include "formats/safetensors_writer.h"
#include "model/model_loader.h"
#include "model/transformer.h"
#include "model_test_util.h"
#include "test_support.h"

namespace inferd {
namespace {

struct LoraReference {
  std::vector<std::vector<int32_t>> prompts;
  std::vector<float> logits;
};

LoraReference load_lora_reference(const std::string& adapter) {
  const std::string dir = test::fixture_path("tiny_lora/" + adapter);
  auto j = nlohmann::json::parse(test::read_text(dir + "/reference.json"));
  LoraReference r;
  for (const auto& p : j["prompts"]) r.prompts.push_back(p.get<std::vector<int32_t>>());
  r.logits = test::read_f32(dir + "/" + j["logits_file"].get<std::string>());
  return r;
}

std::string base_path(const std::string& base, const std::string& file) {
  return test::fixture_path("tiny/" + base) + (file.empty() ? "" : "/" + file);
}

std::string adapter_path(const std::string& adapter, const std::string& file) {
  return test::fixture_path("tiny_lora/" + adapter) + (file.empty() ? "" : "/" + file);
}

struct LoraCase {
  std::string base, base_file;        // "" = the Hugging Face directory
  std::string adapter, adapter_file;  // "" = the PEFT directory
  double tolerance;                   // max |diff| / max |ref|
};

std::ostream& operator<<(std::ostream& os, const LoraCase& c) {
  return os << c.base << "/" << c.base_file << " + " << c.adapter << "/" << c.adapter_file;
}

class LoraReferenceTest : public ::testing::TestWithParam<LoraCase> {};

TEST_P(LoraReferenceTest, MatchesPeft) {
  const LoraCase& tc = GetParam();
  const LoraReference ref = load_lora_reference(tc.adapter);
  auto weights = load_model(base_path(tc.base, tc.base_file));
  ASSERT_TRUE(weights.has_value()) << weights.status().message();
  auto adapter = load_lora_adapter(adapter_path(tc.adapter, tc.adapter_file), **weights, 64);
  ASSERT_TRUE(adapter.has_value()) << adapter.status().message();
  ThreadPool pool(2);
  Transformer model(**weights, pool);
  ASSERT_TRUE(model.enable_lora().is_ok());
  const std::vector<const LoraAdapter*> adapters(ref.prompts.size(), adapter->get());
  const auto got = test::all_logits(model, ref.prompts, 0, true, 16, KvDType::kF32, adapters);
  ASSERT_EQ(got.size(), ref.logits.size());
  const double err = test::relative_max_error(got.data(), ref.logits.data(), got.size());
  std::printf("[ figures  ]   max |diff| / max |ref| = %.2e\n", err);
  EXPECT_LT(err, tc.tolerance);
  // The same base without the adapter is far from the reference: the update is applied.
  const auto base_only = test::all_logits(model, ref.prompts, 0, true);
  EXPECT_GT(test::relative_max_error(base_only.data(), ref.logits.data(), got.size()), 5 * err);
}

INSTANTIATE_TEST_SUITE_P(
    Tiny, LoraReferenceTest,
    ::testing::Values(
        LoraCase{"qwen2", "", "qwen2_all", "", 1e-4},
        LoraCase{"qwen2", "model-f32.gguf", "qwen2_all", "", 1e-4},
        LoraCase{"qwen2", "model-f32.gguf", "qwen2_all", "adapter-f32.gguf", 1e-4},
        LoraCase{"qwen2", "", "qwen2_all", "adapter-f32.gguf", 1e-4},
        LoraCase{"qwen2", "", "qwen2_all", "adapter-f16.gguf", 5e-3},
        // The int8 path: the reference is on f32 weights, so only near it (the base alone is 1.6).
        LoraCase{"qwen2", "model-q8_0.gguf", "qwen2_all", "adapter-f32.gguf", 0.25},
        LoraCase{"qwen3", "", "qwen3_all", "", 1e-4},
        LoraCase{"qwen3", "model-f32.gguf", "qwen3_all", "adapter-f32.gguf", 1e-4},
        LoraCase{"llama_untied", "", "llama_untied_all", "", 1e-4},
        LoraCase{"llama_untied", "model-f32.gguf", "llama_untied_all", "adapter-f32.gguf", 1e-4},
        // Q and K rows in the other format's order: permuted at load.
        LoraCase{"llama_untied", "model-f32.gguf", "llama_untied_all", "", 1e-4},
        LoraCase{"llama_untied", "", "llama_untied_all", "adapter-f32.gguf", 1e-4},
        LoraCase{"qwen2", "", "qwen2_mixed", "", 1e-4},
        LoraCase{"llama_untied", "", "llama_untied_mixed", "", 1e-4},
        LoraCase{"qwen2", "", "qwen2_attn", "", 1e-4}));

// The same adapter as PEFT files and as a GGUF adapter (F32) is the same update, bit for bit.
TEST(LoraAdapterTest, PeftAndGgufFormsGiveTheSameLogits) {
  for (const char* name : {"qwen2", "llama_untied"}) {
    for (const char* base_file : {"", "model-f32.gguf"}) {
      auto weights = load_model(base_path(name, base_file));
      ASSERT_TRUE(weights.has_value());
      auto peft = load_lora_adapter(adapter_path(std::string(name) + "_all", ""), **weights, 64);
      auto gguf =
          load_lora_adapter(adapter_path(std::string(name) + "_all", "adapter-f32.gguf"), **weights, 64);
      ASSERT_TRUE(peft.has_value() && gguf.has_value());
      EXPECT_EQ((*peft)->format, "peft");
      EXPECT_EQ((*gguf)->format, "gguf");
      EXPECT_EQ((*peft)->fingerprint_lo, (*gguf)->fingerprint_lo) << name << " " << base_file;
      EXPECT_EQ((*peft)->fingerprint_hi, (*gguf)->fingerprint_hi);
      ThreadPool pool(2);
      Transformer model(**weights, pool);
      ASSERT_TRUE(model.enable_lora().is_ok());
      const LoraReference ref = load_lora_reference(std::string(name) + "_all");
      const auto a = test::all_logits(model, ref.prompts, 0, true, 16, KvDType::kF32,
                                      std::vector<const LoraAdapter*>(ref.prompts.size(), peft->get()));
      const auto b = test::all_logits(model, ref.prompts, 0, true, 16, KvDType::kF32,
                                      std::vector<const LoraAdapter*>(ref.prompts.size(), gguf->get()));
      ASSERT_FALSE(a.empty());
      EXPECT_EQ(a, b) << name << " " << base_file;
    }
  }
}

// Three adapters and the base in one batch (prompt i gets adapter i % 4), whole prompts and in
// chunks, give each prompt's logits bit for bit as it alone; on the f32 and the int8 path.
TEST(LoraAdapterTest, ABatchMixingAdaptersAndTheBaseEqualsEachPromptAlone) {
  for (const char* file : {"", "model-q8_0.gguf", "model-f16.gguf"}) {
    auto weights = load_model(base_path("qwen2", file));
    ASSERT_TRUE(weights.has_value());
    std::vector<std::shared_ptr<const LoraAdapter>> held;
    for (const char* a : {"qwen2_all", "qwen2_mixed", "qwen2_attn"}) {
      auto adapter = load_lora_adapter(adapter_path(a, ""), **weights, 64);
      ASSERT_TRUE(adapter.has_value()) << adapter.status().message();
      held.push_back(*adapter);
    }
    ThreadPool pool(2);
    Transformer model(**weights, pool);
    ASSERT_TRUE(model.enable_lora().is_ok());
    std::vector<std::vector<int32_t>> prompts = load_lora_reference("qwen2_all").prompts;
    const auto more = prompts;
    prompts.insert(prompts.end(), more.begin(), more.end());  // each prompt with two adapters
    std::vector<const LoraAdapter*> adapters;
    for (size_t i = 0; i < prompts.size(); ++i) adapters.push_back(i % 4 == 3 ? nullptr : held[i % 4].get());
    const auto alone = test::all_logits(model, prompts, 0, false, 16, KvDType::kF32, adapters);
    ASSERT_FALSE(alone.empty());
    EXPECT_EQ(test::all_logits(model, prompts, 0, true, 16, KvDType::kF32, adapters), alone) << file;
    EXPECT_EQ(test::all_logits(model, prompts, 5, true, 16, KvDType::kF32, adapters), alone) << file;
    EXPECT_EQ(test::all_logits(model, prompts, 1, true, 16, KvDType::kF32, adapters), alone) << file;
    // Different adapters give different logits for the same prompt.
    const size_t vocab = static_cast<size_t>(weights.value()->config.vocab_size);
    const size_t len0 = prompts[0].size() * vocab;
    const auto same_prompt_other =
        test::all_logits(model, {prompts[0]}, 0, false, 16, KvDType::kF32, {held[1].get()});
    EXPECT_NE(std::vector<float>(alone.begin(), alone.begin() + static_cast<std::ptrdiff_t>(len0)),
              same_prompt_other);
  }
}

// A copy of a fixture adapter with its config edited, in a fresh directory.
std::string edited_adapter(const std::string& adapter, const std::function<void(nlohmann::json&)>& edit) {
  const std::string dir = test::temp_dir();
  std::filesystem::copy(adapter_path(adapter, ""), dir, std::filesystem::copy_options::recursive);
  auto j = nlohmann::json::parse(test::read_text(dir + "/adapter_config.json"));
  edit(j);
  const std::string text = j.dump();
  test::write_bytes(dir + "/adapter_config.json",
                    std::vector<std::byte>(reinterpret_cast<const std::byte*>(text.data()),
                                           reinterpret_cast<const std::byte*>(text.data()) + text.size()));
  return dir;
}

std::string refusal(const std::string& path, const ModelWeights& base, int64_t max_rank = 64) {
  auto a = load_lora_adapter(path, base, max_rank);
  EXPECT_FALSE(a.has_value()) << path;
  return a.has_value() ? "" : a.status().message();
}

TEST(LoraAdapterTest, MismatchedAdaptersAreRefusedNamingTheProblem) {
  auto qwen2 = load_model(base_path("qwen2", ""));
  ASSERT_TRUE(qwen2.has_value());
  const ModelWeights& base = **qwen2;
  using ::testing::HasSubstr;
  // Another base's adapter: Qwen3's Q is [128, 64] (head_dim 32), Qwen2's [64, 64].
  EXPECT_THAT(refusal(adapter_path("qwen3_all", ""), base), HasSubstr("q_proj.lora_A.weight"));
  EXPECT_THAT(refusal(adapter_path("qwen3_all", ""), base), HasSubstr("do not fit"));
  EXPECT_THAT(refusal(adapter_path("llama_untied_all", "adapter-f32.gguf"), base),
              HasSubstr("architecture 'llama'"));
  EXPECT_THAT(refusal(adapter_path("qwen2_all", ""), base, 4), HasSubstr("above --max-lora-rank 4"));
  EXPECT_THAT(
      refusal(edited_adapter("qwen2_all", [](auto& j) { j["target_modules"].push_back("lm_head"); }), base),
      HasSubstr("target module 'lm_head'"));
  EXPECT_THAT(refusal(edited_adapter("qwen2_all", [](auto& j) { j["use_dora"] = true; }), base),
              HasSubstr("use_dora"));
  EXPECT_THAT(refusal(edited_adapter("qwen2_all", [](auto& j) { j["bias"] = "all"; }), base),
              HasSubstr("bias"));
  EXPECT_THAT(refusal(edited_adapter("qwen2_all", [](auto& j) { j["modules_to_save"] = {"lm_head"}; }), base),
              HasSubstr("modules_to_save"));
  EXPECT_THAT(refusal(edited_adapter("qwen2_all", [](auto& j) { j["r"] = 4; }), base),
              HasSubstr("the config says 4"));
  EXPECT_THAT(refusal(edited_adapter("qwen2_all",
                                     [](auto& j) {
                                       j["rank_pattern"] = {{"(", 2}};
                                     }),
                      base),
              HasSubstr("rank_pattern"));
  EXPECT_THAT(refusal(test::temp_dir() + "/nothing", base), HasSubstr("no such LoRA adapter"));
  EXPECT_THAT(refusal(base_path("qwen2", "model-f32.gguf"), base), HasSubstr("not a LoRA adapter"));
  // An adapter whose tensors name no target (an embedding update), and one without weights.
  const std::string embed = edited_adapter("qwen2_all", [](auto&) {});
  SafetensorsWriter writer;
  writer.add_tensor("base_model.model.model.embed_tokens.lora_embedding_A", DType::kF32, {8, 256},
                    std::vector<std::byte>(8 * 256 * 4));
  ASSERT_TRUE(writer.write(embed + "/adapter_model.safetensors").is_ok());
  EXPECT_THAT(refusal(embed, base),
              HasSubstr("'base_model.model.model.embed_tokens.lora_embedding_A' is not a LoRA"));
  const std::string bad = edited_adapter("qwen2_all", [](auto&) {});
  std::filesystem::remove(bad + "/adapter_model.safetensors");
  EXPECT_THAT(refusal(bad, base), HasSubstr("no adapter_model.safetensors"));
  // A MoE base's experts cannot take MLP updates.
  auto moe = load_model(base_path("qwen2_moe", ""));
  ASSERT_TRUE(moe.has_value());
  EXPECT_THAT(refusal(adapter_path("qwen2_all", ""), **moe), HasSubstr("mixture-of-experts"));
}

// Random damage to an adapter's files (bytes flipped, cut short, config fields replaced by other
// JSON values): every load returns an adapter or an error, never a crash (ASan / UBSan in CI).
TEST(LoraAdapterTest, DamagedAdapterFilesLoadOrFailCleanly) {
  auto weights = load_model(base_path("qwen2", ""));
  ASSERT_TRUE(weights.has_value());
  std::mt19937 rng(77);
  const auto gguf = test::read_bytes(adapter_path("qwen2_all", "adapter-f16.gguf"));
  const auto st = test::read_bytes(adapter_path("qwen2_all", "adapter_model.safetensors"));
  const std::string dir = test::temp_dir();
  int refused = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const bool as_gguf = trial % 2 == 0;
    std::vector<std::byte> bytes = as_gguf ? gguf : st;
    const int kind = std::uniform_int_distribution<int>(0, 2)(rng);
    if (kind == 0) {
      bytes.resize(std::uniform_int_distribution<size_t>(0, bytes.size())(rng));
    } else {
      const int flips = std::uniform_int_distribution<int>(1, 8)(rng);
      // Mostly in the header, where the structure is.
      const size_t span = kind == 1 ? std::min<size_t>(bytes.size(), 512) : bytes.size();
      for (int f = 0; f < flips; ++f)
        bytes[std::uniform_int_distribution<size_t>(0, span - 1)(rng)] =
            static_cast<std::byte>(std::uniform_int_distribution<int>(0, 255)(rng));
    }
    std::string path;
    if (as_gguf) {
      path = dir + "/a.gguf";
      test::write_bytes(path, bytes);
    } else {
      path = edited_adapter("qwen2_all", [](auto&) {});
      test::write_bytes(path + "/adapter_model.safetensors", bytes);
    }
    auto a = load_lora_adapter(path, **weights, 64);
    refused += !a.has_value();
  }
  const std::vector<nlohmann::json> values = {
      nullptr, -1, 0, 1e30, "x", nlohmann::json::array(), nlohmann::json::object(), true, {{"q_proj", "x"}}};
  for (const char* field : {"r", "lora_alpha", "target_modules", "rank_pattern", "alpha_pattern",
                            "use_rslora", "bias", "peft_type", "modules_to_save", "use_dora"}) {
    for (const auto& v : values) {
      auto a = load_lora_adapter(edited_adapter("qwen2_all", [&](auto& j) { j[field] = v; }), **weights, 64);
      refused += !a.has_value();
    }
  }
  std::printf("[ figures  ]   %d of %d damaged adapters refused\n", refused, 300 + 10 * 9);
  EXPECT_GT(refused, 100);
}

TEST(LoraAdapterTest, ABatchWithAdaptersNeedsEnableLoraAndBaseRowsComputeAsWithoutLora) {
  auto weights = load_model(base_path("qwen2", ""));
  ASSERT_TRUE(weights.has_value());
  auto adapter = load_lora_adapter(adapter_path("qwen2_all", ""), **weights, 64);
  ASSERT_TRUE(adapter.has_value());
  ThreadPool pool(2);
  Transformer model(**weights, pool);
  const std::vector<std::vector<int32_t>> prompts{{1, 2, 3}};
  EXPECT_TRUE(test::all_logits(model, prompts, 0, true, 16, KvDType::kF32, {adapter->get()}).empty());
  ASSERT_TRUE(model.enable_lora().is_ok());
  EXPECT_FALSE(test::all_logits(model, prompts, 0, true, 16, KvDType::kF32, {adapter->get()}).empty());
  // Rows of the base compute exactly as without LoRA, on every weight path, alone and beside
  // adapter rows.
  for (const char* file : {"", "model-q8_0.gguf", "model-f16.gguf"}) {
    auto w = load_model(base_path("qwen2", file));
    ASSERT_TRUE(w.has_value());
    auto a = load_lora_adapter(adapter_path("qwen2_all", ""), **w, 64);
    ASSERT_TRUE(a.has_value());
    Transformer plain(**w, pool), lora(**w, pool);
    ASSERT_TRUE(lora.enable_lora().is_ok());
    const auto ref = load_lora_reference("qwen2_all");
    const auto want = test::all_logits(plain, ref.prompts, 0, true);
    ASSERT_FALSE(want.empty());
    EXPECT_EQ(test::all_logits(lora, ref.prompts, 0, true), want) << file;
    std::vector<std::vector<int32_t>> both = ref.prompts;
    both.insert(both.end(), ref.prompts.begin(), ref.prompts.end());
    std::vector<const LoraAdapter*> adapters(ref.prompts.size(), nullptr);
    adapters.resize(both.size(), a->get());
    const auto mixed = test::all_logits(lora, both, 0, true, 16, KvDType::kF32, adapters);
    ASSERT_EQ(mixed.size(), 2 * want.size());
    EXPECT_TRUE(std::equal(want.begin(), want.end(), mixed.begin())) << file;
  }
}

}  // namespace
}  // namespace inferd
