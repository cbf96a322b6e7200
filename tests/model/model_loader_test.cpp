#include "model/model_loader.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>

#include "test_support.h"

namespace inferd {
namespace {

using test::GgufWriter;

struct Spec {
  std::string arch = "llama";
  std::string skip_tensor;                              // leave this tensor out
  std::string bad_shape_tensor;                         // give this tensor one row too many
  std::string rope_scaling;                             // rope.scaling.type when set
  std::vector<std::pair<std::string, float>> f32_keys;  // more metadata: "rope.scaling.factor" -> 4
  std::vector<float> rope_freqs;                        // a rope_freqs.weight tensor when not empty
};

// A complete 1-layer model (hidden 8, 2 heads of 4, 1 kv head, ffn 16, vocab 10) as GGUF bytes.
std::vector<std::byte> tiny_gguf(const Spec& s) {
  GgufWriter w;
  const std::string a = s.arch;
  w.add_string("general.architecture", a);
  w.add_u32(a + ".context_length", 64);
  w.add_u32(a + ".embedding_length", 8);
  w.add_u32(a + ".block_count", 1);
  w.add_u32(a + ".feed_forward_length", 16);
  w.add_u32(a + ".attention.head_count", 2);
  w.add_u32(a + ".attention.head_count_kv", 1);
  w.add_f32(a + ".attention.layer_norm_rms_epsilon", 1e-5f);
  if (!s.rope_scaling.empty()) w.add_string(a + ".rope.scaling.type", s.rope_scaling);
  for (const auto& [key, value] : s.f32_keys) w.add_f32(a + "." + key, value);
  if (!s.rope_freqs.empty()) {
    std::vector<std::byte> data(s.rope_freqs.size() * sizeof(float));
    std::memcpy(data.data(), s.rope_freqs.data(), data.size());
    w.add_tensor("rope_freqs.weight", {static_cast<int64_t>(s.rope_freqs.size())}, 0, data);
  }
  auto add = [&](const std::string& name, std::vector<int64_t> shape) {
    if (name == s.skip_tensor) return;
    if (name == s.bad_shape_tensor) shape[0] += 1;
    int64_t n = 1;
    for (auto d : shape) n *= d;
    std::vector<std::byte> data(static_cast<size_t>(n) * 4, std::byte{0});
    w.add_tensor(name, shape, 0, data);
  };
  add("token_embd.weight", {10, 8});
  add("output_norm.weight", {8});
  add("blk.0.attn_norm.weight", {8});
  add("blk.0.attn_q.weight", {8, 8});
  add("blk.0.attn_k.weight", {4, 8});
  add("blk.0.attn_v.weight", {4, 8});
  add("blk.0.attn_output.weight", {8, 8});
  if (a == "qwen3") {
    add("blk.0.attn_q_norm.weight", {4});
    add("blk.0.attn_k_norm.weight", {4});
  }
  add("blk.0.ffn_norm.weight", {8});
  add("blk.0.ffn_gate.weight", {16, 8});
  add("blk.0.ffn_up.weight", {16, 8});
  add("blk.0.ffn_down.weight", {8, 16});
  return w.bytes();
}

Expected<std::unique_ptr<ModelWeights>> load_spec(const Spec& s) {
  const std::string path = test::temp_dir() + "/model.gguf";
  test::write_bytes(path, tiny_gguf(s));
  return load_model(path);
}

TEST(ModelLoaderTest, LoadsCraftedGguf) {
  auto m = load_spec({});
  ASSERT_TRUE(m.has_value()) << m.status().message();
  const ModelConfig& c = (*m)->config;
  EXPECT_EQ(c.arch, Architecture::kLlama);
  EXPECT_EQ(c.head_dim, 4);
  EXPECT_EQ(c.vocab_size, 10);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.rope_pairing, RopePairing::kInterleaved);
  EXPECT_EQ((*m)->lm_head.data, (*m)->token_embedding.data);
}

void expect_load_error(const Spec& s, const std::string& fragment) {
  auto m = load_spec(s);
  ASSERT_FALSE(m.has_value());
  EXPECT_NE(m.status().message().find(fragment), std::string::npos) << m.status().message();
  EXPECT_NE(m.status().message().find("model.gguf"), std::string::npos) << m.status().message();
}

TEST(ModelLoaderTest, MissingTensorNamed) {
  expect_load_error({.skip_tensor = "blk.0.ffn_up.weight"}, "missing tensor 'blk.0.ffn_up.weight'");
  expect_load_error({.arch = "qwen3", .skip_tensor = "blk.0.attn_k_norm.weight"}, "blk.0.attn_k_norm.weight");
}

TEST(ModelLoaderTest, ShapeMismatchNamed) {
  expect_load_error({.bad_shape_tensor = "blk.0.attn_k.weight"},
                    "'blk.0.attn_k.weight' has shape [5, 8], expected [4, 8]");
}

TEST(ModelLoaderTest, UnknownArchitectureAndFeatures) {
  expect_load_error({.arch = "mamba"}, "unsupported architecture 'mamba'");
  expect_load_error({.rope_scaling = "longrope"}, "rope scaling type 'longrope' is not supported");
  expect_load_error({.rope_scaling = "yarn"}, "rope scaling 'yarn' without 'llama.rope.scaling.factor'");
  expect_load_error({.rope_scaling = "yarn",
                     .f32_keys = {{"rope.scaling.factor", 4}, {"rope.scaling.yarn_ext_factor", 0.5f}}},
                    "yarn_ext_factor");
  expect_load_error(
      {.rope_scaling = "linear", .f32_keys = {{"rope.scaling.factor", 2}}, .rope_freqs = {1, 2}},
      "rope frequency factors (rope_freqs) together with rope scaling 'linear'");
  expect_load_error({.rope_freqs = {1, 2, 3}}, "rope frequency factors: 3 values, expected head_dim / 2 = 2");
  auto none = load_spec({.rope_scaling = "none"});
  EXPECT_TRUE(none.has_value());
}

// The keys llama.cpp's converter writes, read with transformers' meaning.
TEST(ModelLoaderTest, GgufRopeScaling) {
  auto linear = load_spec({.rope_scaling = "linear", .f32_keys = {{"rope.scaling.factor", 4}}});
  ASSERT_TRUE(linear.has_value()) << linear.status().message();
  EXPECT_EQ((*linear)->config.rope_scaling.type, RopeScalingType::kLinear);
  EXPECT_DOUBLE_EQ((*linear)->config.rope_scaling.factor, 4.0);
  auto old_linear = load_spec({.f32_keys = {{"rope.scale_linear", 0.5f}}});  // the older spelling
  ASSERT_TRUE(old_linear.has_value()) << old_linear.status().message();
  EXPECT_EQ((*old_linear)->config.rope_scaling.type, RopeScalingType::kLinear);
  EXPECT_DOUBLE_EQ((*old_linear)->config.rope_scaling.factor, 2.0);

  auto yarn = load_spec({.rope_scaling = "yarn", .f32_keys = {{"rope.scaling.factor", 4}}});
  ASSERT_TRUE(yarn.has_value()) << yarn.status().message();
  const RopeScaling& y = (*yarn)->config.rope_scaling;
  EXPECT_EQ(y.type, RopeScalingType::kYarn);
  EXPECT_EQ(y.original_context, 64);  // no original_context_length: the context length
  EXPECT_DOUBLE_EQ(y.beta_fast, 32.0);
  EXPECT_DOUBLE_EQ(y.beta_slow, 1.0);
  EXPECT_NEAR(y.attention_factor, 0.1 * std::log(4.0) + 1.0, 1e-12);
  auto yarn_attn = load_spec({.rope_scaling = "yarn",
                              .f32_keys = {{"rope.scaling.factor", 4},
                                           {"rope.scaling.yarn_attn_factor", 1.5f},
                                           {"rope.scaling.yarn_beta_fast", 16}}});
  ASSERT_TRUE(yarn_attn.has_value()) << yarn_attn.status().message();
  EXPECT_DOUBLE_EQ((*yarn_attn)->config.rope_scaling.attention_factor, 1.5);
  EXPECT_DOUBLE_EQ((*yarn_attn)->config.rope_scaling.beta_fast, 16.0);

  auto freqs = load_spec({.rope_freqs = {1.0f, 8.0f}});
  ASSERT_TRUE(freqs.has_value()) << freqs.status().message();
  EXPECT_EQ((*freqs)->config.rope_scaling.type, RopeScalingType::kNone);
  EXPECT_EQ((*freqs)->config.rope_scaling.freq_factors, (std::vector<float>{1.0f, 8.0f}));
}

TEST(ModelLoaderTest, MissingPathAndNotGguf) {
  auto m = load_model("/nonexistent/x.gguf");
  ASSERT_FALSE(m.has_value());
  EXPECT_NE(m.status().message().find("no such file"), std::string::npos);
  const std::string dir = test::temp_dir();
  const std::string junk = dir + "/junk.gguf";
  test::write_bytes(junk, std::vector<std::byte>(100, std::byte{7}));
  auto j = load_model(junk);
  ASSERT_FALSE(j.has_value());
  EXPECT_NE(j.status().message().find("bad magic"), std::string::npos);
  auto d = load_model(dir);  // a directory without config.json
  ASSERT_FALSE(d.has_value());
  EXPECT_NE(d.status().message().find("config.json"), std::string::npos);
}

const char* kQwen2Config = R"({"architectures": ["Qwen2ForCausalLM"], "vocab_size": 100, "hidden_size": 64,
  "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128,
  "max_position_embeddings": 512, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "tie_word_embeddings": true})";

TEST(ModelLoaderTest, HfConfig) {
  auto c = parse_hf_config("config.json", kQwen2Config);
  ASSERT_TRUE(c.has_value()) << c.status().message();
  EXPECT_EQ(c->arch, Architecture::kQwen2);
  EXPECT_TRUE(c->attention_bias);
  EXPECT_EQ(c->head_dim, 16);
  EXPECT_DOUBLE_EQ(c->rope_theta, 1e6);
  EXPECT_EQ(c->rope_pairing, RopePairing::kNeox);

  auto v5 = parse_hf_config("config.json", R"({"architectures": ["Qwen3ForCausalLM"], "vocab_size": 100,
    "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 32, "intermediate_size": 128, "rope_parameters": {"rope_type": "default", "rope_theta": 5000.0}})");
  ASSERT_TRUE(v5.has_value()) << v5.status().message();
  EXPECT_TRUE(v5->qk_norm);
  EXPECT_EQ(v5->head_dim, 32);
  EXPECT_DOUBLE_EQ(v5->rope_theta, 5000.0);
}

TEST(ModelLoaderTest, HfConfigErrors) {
  auto expect = [](const std::string& text, const std::string& fragment) {
    auto c = parse_hf_config("config.json", text);
    ASSERT_FALSE(c.has_value()) << text;
    EXPECT_NE(c.status().message().find(fragment), std::string::npos) << c.status().message();
  };
  expect(R"({"architectures": ["MistralForCausalLM"]})", "unsupported architecture 'MistralForCausalLM'");
  expect("{not json", "not a JSON object");
  std::string scaled = kQwen2Config;
  scaled.insert(1, R"("rope_scaling": {"rope_type": "longrope", "factor": 4.0}, )");
  expect(scaled, "rope scaling type 'longrope' is not supported");
  std::string bad_heads = kQwen2Config;
  bad_heads.replace(bad_heads.find("\"num_key_value_heads\": 2"), 24, "\"num_key_value_heads\": 3");
  expect(bad_heads, "not a multiple of num_kv_heads");
  std::string no_hidden = kQwen2Config;
  no_hidden.replace(no_hidden.find("\"hidden_size\""), 13, "\"hidden_sizeX\"");
  expect(no_hidden, "missing field 'hidden_size'");
}

const char* kQwen3MoeConfig = R"({"architectures": ["Qwen3MoeForCausalLM"], "vocab_size": 100,
  "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
  "intermediate_size": 96, "moe_intermediate_size": 32, "num_local_experts": 8, "num_experts_per_tok": 2,
  "norm_topk_prob": true, "decoder_sparse_step": 2, "mlp_only_layers": [3]})";

TEST(ModelLoaderTest, HfMoeConfig) {
  auto c = parse_hf_config("config.json", kQwen3MoeConfig);
  ASSERT_TRUE(c.has_value()) << c.status().message();
  EXPECT_EQ(c->arch, Architecture::kQwen3Moe);
  EXPECT_EQ(c->arch_name, "qwen3moe");
  EXPECT_TRUE(c->qk_norm);
  EXPECT_FALSE(c->attention_bias);
  EXPECT_EQ(c->num_experts, 8);  // transformers 5 writes Qwen3-MoE's num_experts as num_local_experts
  EXPECT_EQ(c->num_experts_per_tok, 2);
  EXPECT_EQ(c->moe_intermediate_size, 32);
  EXPECT_EQ(c->shared_expert_intermediate_size, 0);
  EXPECT_TRUE(c->norm_topk_prob);
  // decoder_sparse_step 2: layers 1 and 3 are MoE, but 3 is listed in mlp_only_layers.
  EXPECT_FALSE(c->is_moe_layer(0));
  EXPECT_TRUE(c->is_moe_layer(1));
  EXPECT_FALSE(c->is_moe_layer(2));
  EXPECT_FALSE(c->is_moe_layer(3));

  // Qwen2-MoE: transformers' defaults for what config.json leaves out, Q/K/V biases on.
  auto q2 = parse_hf_config("config.json", R"({"architectures": ["Qwen2MoeForCausalLM"], "vocab_size": 100,
    "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 96})");
  ASSERT_TRUE(q2.has_value()) << q2.status().message();
  EXPECT_EQ(q2->arch, Architecture::kQwen2Moe);
  EXPECT_TRUE(q2->attention_bias);
  EXPECT_FALSE(q2->qk_norm);
  EXPECT_EQ(q2->num_experts, 60);
  EXPECT_EQ(q2->num_experts_per_tok, 4);
  EXPECT_EQ(q2->moe_intermediate_size, 1408);
  EXPECT_EQ(q2->shared_expert_intermediate_size, 5632);
  EXPECT_FALSE(q2->norm_topk_prob);
  EXPECT_TRUE(q2->is_moe_layer(0) && q2->is_moe_layer(1));
}

TEST(ModelLoaderTest, HfMoeConfigErrors) {
  auto expect = [](std::string text, const std::string& from, const std::string& to,
                   const std::string& fragment) {
    text.replace(text.find(from), from.size(), to);
    auto c = parse_hf_config("config.json", text);
    ASSERT_FALSE(c.has_value()) << text;
    EXPECT_NE(c.status().message().find(fragment), std::string::npos) << c.status().message();
  };
  expect(kQwen3MoeConfig, "\"num_experts_per_tok\": 2", "\"num_experts_per_tok\": 9",
         "num_experts_per_tok = 9");
  expect(kQwen3MoeConfig, "\"mlp_only_layers\": [3]", "\"mlp_only_layers\": [4]",
         "mlp_only_layers lists layer 4");
  expect(kQwen3MoeConfig, "\"decoder_sparse_step\": 2", "\"decoder_sparse_step\": 0", "decoder_sparse_step");
  expect(kQwen3MoeConfig, "\"num_local_experts\": 8", "\"num_local_experts\": 0", "num_experts is 0");
}

// The MoE fields of the GGUF fixtures (written as llama.cpp's converter writes them).
TEST(ModelLoaderTest, GgufMoeConfig) {
  auto q3 = load_model(test::fixture_path("tiny/qwen3_moe/model-q8_0.gguf"));
  ASSERT_TRUE(q3.has_value()) << q3.status().message();
  const ModelConfig& c = (*q3)->config;
  EXPECT_EQ(c.arch, Architecture::kQwen3Moe);
  EXPECT_EQ(c.num_experts, 8);
  EXPECT_EQ(c.num_experts_per_tok, 2);
  EXPECT_EQ(c.moe_intermediate_size, 32);
  EXPECT_TRUE(c.norm_topk_prob);                          // llama.cpp renormalizes for qwen3moe
  EXPECT_EQ(c.mlp_only_layers, std::vector<int64_t>{0});  // layer 0 has no router in the file
  const LayerWeights& moe = (*q3)->layers[1];
  ASSERT_TRUE(moe.is_moe());
  EXPECT_FALSE((*q3)->layers[0].is_moe());
  ASSERT_EQ(moe.moe.expert_down.size(), 8u);
  EXPECT_EQ(moe.moe.expert_down[3].name, "blk.1.ffn_down_exps.weight[3]");
  EXPECT_EQ(moe.moe.expert_down[3].dtype, DType::kQ8_0);
  EXPECT_EQ(moe.moe.expert_down[3].shape_string(), "[64, 32]");
  EXPECT_EQ(moe.moe.router.dtype, DType::kF32);  // the converter keeps the router in F32
  EXPECT_FALSE(moe.moe.has_shared_expert());

  auto q2 = load_model(test::fixture_path("tiny/qwen2_moe/model-f32.gguf"));
  ASSERT_TRUE(q2.has_value()) << q2.status().message();
  EXPECT_EQ((*q2)->config.arch, Architecture::kQwen2Moe);
  EXPECT_FALSE((*q2)->config.norm_topk_prob);
  EXPECT_EQ((*q2)->config.shared_expert_intermediate_size, 64);
  EXPECT_TRUE((*q2)->config.mlp_only_layers.empty());
  EXPECT_TRUE((*q2)->layers[0].moe.has_shared_expert());
  EXPECT_EQ((*q2)->layers[0].moe.shared_expert_gate.shape_string(), "[1, 64]");
}

// Both Hugging Face layouts: one tensor per expert (qwen3_moe) and transformers 5's fused
// gate_up_proj / down_proj (qwen2_moe), sliced into the same per-expert views.
TEST(ModelLoaderTest, HfMoeExpertLayouts) {
  auto q3 = load_model(test::fixture_path("tiny/qwen3_moe"));
  ASSERT_TRUE(q3.has_value()) << q3.status().message();
  EXPECT_EQ((*q3)->layers[1].moe.expert_gate[5].name, "model.layers.1.mlp.experts.5.gate_proj.weight");
  auto q2 = load_model(test::fixture_path("tiny/qwen2_moe"));
  ASSERT_TRUE(q2.has_value()) << q2.status().message();
  const MoeWeights& m = (*q2)->layers[1].moe;
  EXPECT_EQ(m.expert_up[2].name, "model.layers.1.mlp.experts.gate_up_proj[2]");
  EXPECT_EQ(m.expert_up[2].shape_string(), "[32, 64]");
  // Expert 2's up rows follow its gate rows in the fused tensor.
  EXPECT_EQ(m.expert_up[2].data, m.expert_gate[2].data + 32 * 64 * sizeof(float));
  EXPECT_EQ(m.expert_gate[3].data, m.expert_up[2].data + 32 * 64 * sizeof(float));
  // Loading the same weights either way gives the same per-expert bytes as the GGUF.
  auto g = load_model(test::fixture_path("tiny/qwen2_moe/model-f32.gguf"));
  ASSERT_TRUE(g.has_value()) << g.status().message();
  const MoeWeights& gm = (*g)->layers[1].moe;
  for (size_t e = 0; e < 8; ++e) {
    EXPECT_EQ(std::memcmp(gm.expert_up[e].data, m.expert_up[e].data, gm.expert_up[e].num_bytes), 0) << e;
    EXPECT_EQ(std::memcmp(gm.expert_down[e].data, m.expert_down[e].data, gm.expert_down[e].num_bytes), 0)
        << e;
  }
  EXPECT_EQ((*g)->weight_bytes, (*q2)->weight_bytes);
}

}  // namespace
}  // namespace inferd
