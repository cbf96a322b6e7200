// RoPE scaling read from config.json (transformers 4's rope_scaling and 5's rope_parameters) and
// its frequencies against transformers' own on full-size configs (tests/fixtures/rope, written
// by scripts/fixtures/make_tiny_models.py --rope-cases).
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "kernels/rope_scaling.h"
#include "model/model_loader.h"
#include "test_support.h"

namespace inferd {
namespace {

using nlohmann::json;

// A Llama config.json with `rope` merged in (vocab 100, hidden 64, 4 heads: head_dim 16).
json llama_config(const json& rope) {
  json j = {{"architectures", {"LlamaForCausalLM"}},
            {"vocab_size", 100},
            {"hidden_size", 64},
            {"num_hidden_layers", 1},
            {"num_attention_heads", 4},
            {"intermediate_size", 128},
            {"max_position_embeddings", 1024}};
  j.update(rope);
  return j;
}

Expected<ModelConfig> parse(const json& rope) {
  return parse_hf_config("config.json", llama_config(rope).dump());
}

TEST(RopeConfigTest, BothSpellings) {
  auto v4 = parse({{"rope_theta", 500000.0},
                   {"rope_scaling",
                    {{"rope_type", "llama3"},
                     {"factor", 8.0},
                     {"low_freq_factor", 1.0},
                     {"high_freq_factor", 4.0},
                     {"original_max_position_embeddings", 256}}}});
  ASSERT_TRUE(v4.has_value()) << v4.status().message();
  EXPECT_DOUBLE_EQ(v4->rope_theta, 500000.0);
  EXPECT_EQ(v4->rope_scaling.type, RopeScalingType::kLlama3);
  EXPECT_EQ(v4->rope_scaling.original_context, 256);
  EXPECT_DOUBLE_EQ(v4->rope_scaling.factor, 8.0);
  EXPECT_DOUBLE_EQ(v4->rope_scaling.high_freq_factor, 4.0);

  // transformers 5: rope_theta inside rope_parameters (and it wins over a top-level one).
  auto v5 = parse({{"rope_theta", 1.0e4},
                   {"rope_parameters", {{"rope_type", "linear"}, {"rope_theta", 2.0e4}, {"factor", 2.0}}}});
  ASSERT_TRUE(v5.has_value()) << v5.status().message();
  EXPECT_DOUBLE_EQ(v5->rope_theta, 2.0e4);
  EXPECT_EQ(v5->rope_scaling.type, RopeScalingType::kLinear);
  EXPECT_DOUBLE_EQ(v5->rope_scaling.factor, 2.0);

  // The old "type" key (Qwen2.5's config.json).
  auto qwen = parse(
      {{"rope_scaling", {{"type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 256}}}});
  ASSERT_TRUE(qwen.has_value()) << qwen.status().message();
  const RopeScaling& y = qwen->rope_scaling;
  EXPECT_EQ(y.type, RopeScalingType::kYarn);
  EXPECT_EQ(y.original_context, 256);
  EXPECT_DOUBLE_EQ(y.beta_fast, 32.0);
  EXPECT_DOUBLE_EQ(y.beta_slow, 1.0);
  EXPECT_TRUE(y.truncate);
  EXPECT_NEAR(y.attention_factor, 0.1 * std::log(4.0) + 1.0, 1e-15);

  auto dynamic = parse({{"rope_scaling", {{"type", "dynamic"}, {"factor", 2.0}}}});
  ASSERT_TRUE(dynamic.has_value()) << dynamic.status().message();
  EXPECT_EQ(dynamic->rope_scaling.type, RopeScalingType::kDynamic);
  EXPECT_EQ(dynamic->rope_scaling.original_context, 1024);  // max_position_embeddings

  auto plain = parse({{"rope_scaling", nullptr}, {"rope_theta", 1.0e6}});
  ASSERT_TRUE(plain.has_value()) << plain.status().message();
  EXPECT_EQ(plain->rope_scaling.type, RopeScalingType::kNone);
}

// transformers' defaults and precedences: a top-level original_max_position_embeddings over
// rope_scaling's, yarn's factor from the context ratio when null, zero betas meaning the defaults,
// the attention factor from mscale / mscale_all_dim.
TEST(RopeConfigTest, TransformersDefaults) {
  auto top = parse(
      {{"original_max_position_embeddings", 128},
       {"rope_scaling", {{"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 64}}}});
  ASSERT_TRUE(top.has_value()) << top.status().message();
  EXPECT_EQ(top->rope_scaling.original_context, 128);
  auto missing = parse({{"rope_scaling", {{"rope_type", "yarn"}, {"factor", 4.0}}}});
  ASSERT_TRUE(missing.has_value()) << missing.status().message();
  EXPECT_EQ(missing->rope_scaling.original_context, 1024);
  auto implicit = parse({{"rope_scaling",
                          {{"rope_type", "yarn"},
                           {"factor", nullptr},
                           {"original_max_position_embeddings", 256},
                           {"beta_fast", 0},
                           {"beta_slow", 2},
                           {"truncate", false},
                           {"mscale", 0.707},
                           {"mscale_all_dim", 1.0}}}});
  ASSERT_TRUE(implicit.has_value()) << implicit.status().message();
  const RopeScaling& s = implicit->rope_scaling;
  EXPECT_DOUBLE_EQ(s.factor, 4.0);
  EXPECT_DOUBLE_EQ(s.beta_fast, 32.0);
  EXPECT_DOUBLE_EQ(s.beta_slow, 2.0);
  EXPECT_FALSE(s.truncate);
  EXPECT_NEAR(s.attention_factor, (0.1 * 0.707 * std::log(4.0) + 1) / (0.1 * std::log(4.0) + 1), 1e-15);
  auto given = parse({{"rope_scaling", {{"rope_type", "yarn"}, {"factor", 4.0}, {"attention_factor", 1.5}}}});
  ASSERT_TRUE(given.has_value()) << given.status().message();
  EXPECT_DOUBLE_EQ(given->rope_scaling.attention_factor, 1.5);
}

TEST(RopeConfigTest, RefusesWhatItCannotComputeNamingIt) {
  auto expect = [](const json& rope, const std::string& fragment) {
    auto c = parse(rope);
    ASSERT_FALSE(c.has_value()) << rope.dump();
    EXPECT_NE(c.status().message().find(fragment), std::string::npos) << c.status().message();
    EXPECT_NE(c.status().message().find("config.json"), std::string::npos) << c.status().message();
  };
  expect({{"rope_scaling",
           {{"rope_type", "longrope"}, {"short_factor", {1.0}}, {"long_factor", {1.0}}, {"factor", 4.0}}}},
         "rope scaling type 'longrope' is not supported (supported: default, linear, dynamic, yarn, llama3)");
  expect({{"rope_parameters", {{"rope_type", "su"}}}}, "rope scaling type 'su'");
  expect({{"rope_scaling", {{"type", "linear"}, {"factor", 2.0}, {"extrapolation_factor", 1.0}}}},
         "key 'extrapolation_factor' is not supported with rope type 'linear'");
  expect({{"rope_scaling", {{"type", "dynamic"}, {"factor", 2.0}, {"low_freq_factor", 1.0}}}},
         "key 'low_freq_factor' is not supported with rope type 'dynamic'");
  expect({{"rope_scaling", {{"type", "linear"}}}}, "rope_scaling: missing field 'factor'");
  expect({{"rope_scaling",
           {{"rope_type", "llama3"}, {"factor", 8.0}, {"original_max_position_embeddings", 64}}}},
         "missing field 'low_freq_factor'");
  expect({{"rope_scaling", {{"type", "linear"}, {"factor", 0.0}}}},
         "factor = 0.000000 must be a positive number");
  expect({{"partial_rotary_factor", 0.5}}, "partial_rotary_factor 0.5 is not supported");
  expect({{"rope_parameters", {{"rope_type", "default"}, {"partial_rotary_factor", 0.25}}}},
         "partial_rotary_factor 0.25");
}

// Every case of the fixture: the config parsed as inferd does, frequencies as inferd computes
// them (dynamic NTK: at position seq_len - 1), against transformers' inv_freq and attention_scaling.
TEST(RopeConfigTest, FrequenciesMatchTransformersOnFullSizeConfigs) {
  const json doc = json::parse(test::read_text(test::fixture_path("rope/inv_freq_cases.json")));
  ASSERT_GE(doc["cases"].size(), 8u);
  for (const json& tc : doc["cases"]) {
    const std::string name = tc["name"];
    json config = tc["config"];
    config.update({{"architectures", {"LlamaForCausalLM"}},
                   {"vocab_size", 100},
                   {"num_hidden_layers", 1},
                   {"intermediate_size", 128}});
    auto c = parse_hf_config(name, config.dump());
    ASSERT_TRUE(c.has_value()) << name << ": " << c.status().message();
    ASSERT_EQ(c->head_dim, tc["head_dim"].get<int64_t>()) << name;
    const RopeFrequencies rope(c->head_dim, c->rope_theta, c->rope_scaling);
    std::vector<float> got(static_cast<size_t>(rope.size()));
    const int64_t pos = tc["seq_len"].is_null() ? 0 : tc["seq_len"].get<int64_t>() - 1;
    rope.compute(pos, got.data());
    const auto want = tc["inv_freq"].get<std::vector<double>>();
    ASSERT_EQ(got.size(), want.size()) << name;
    double worst = 0;
    for (size_t i = 0; i < got.size(); ++i)
      worst = std::max(worst, std::fabs(got[i] - want[i]) / std::fabs(want[i]));
    std::printf("[ figures  ] %s: max relative |inv_freq - transformers'| = %.3g\n", name.c_str(), worst);
    EXPECT_LE(worst, 2.5e-7) << name;  // within 2 f32 ulps
    EXPECT_NEAR(rope.attention_factor(), tc["attention_factor"].get<double>(), 1e-7) << name;
  }
}

}  // namespace
}  // namespace inferd
