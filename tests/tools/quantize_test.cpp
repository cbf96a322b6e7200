// `inferd quantize`: the row quantizers against gguf-py's files, the GGUF writer round trip, and a
// whole model quantized, reloaded and run.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>

#include "common/half.h"
#include "formats/gguf_file.h"
#include "formats/gguf_writer.h"
#include "formats/safetensors_file.h"
#include "formats/safetensors_writer.h"
#include "model/model_loader.h"
#include "model/model_test_util.h"
#include "model/transformer.h"
#include "tensor/dequantize.h"
#include "tensor/quantize.h"
#include "test_support.h"
#include "tools/model_quantizer.h"

namespace inferd {
namespace {

// Our Q8_0 and F16 of the tiny f32 model are byte for byte what gguf-py wrote for the fixtures.
TEST(QuantizeTest, RowsMatchGgufPyByteForByte) {
  auto f32 = GgufFile::open(test::fixture_path("tiny/qwen2/model-f32.gguf"));
  ASSERT_TRUE(f32.has_value()) << f32.status().message();
  for (const char* name : {"model-q8_0.gguf", "model-f16.gguf"}) {
    auto ref = GgufFile::open(test::fixture_path(std::string("tiny/qwen2/") + name));
    ASSERT_TRUE(ref.has_value());
    int64_t compared = 0;
    for (const TensorView& want : ref->tensors()) {
      if (want.num_dims < 2) continue;
      const TensorView* src = f32->find_tensor(want.name);
      ASSERT_NE(src, nullptr) << want.name;
      std::vector<std::byte> got(want.num_bytes);
      for (int64_t r = 0; r < src->num_rows(); ++r)
        quantize_row(want.dtype, reinterpret_cast<const float*>(src->row(r)),
                     got.data() + r * want.row_bytes(), src->row_length());
      EXPECT_EQ(0, std::memcmp(got.data(), want.data, want.num_bytes)) << name << " " << want.name;
      ++compared;
    }
    EXPECT_EQ(compared, 15);
  }
}

// Q4_0 / Q4_1 / BF16: every value comes back within half a quantization step.
TEST(QuantizeTest, RoundTripWithinHalfAStep) {
  std::mt19937 rng(9);
  auto x = test::random_floats(32 * 40, rng);
  for (int j = 0; j < 32; ++j) x[static_cast<size_t>(j)] = 0.0f;  // an all-zero block
  for (DType dtype : {DType::kQ4_0, DType::kQ4_1, DType::kQ8_0, DType::kBF16, DType::kF16}) {
    std::vector<std::byte> q(static_cast<size_t>(dtype_bytes(dtype, 32 * 40)));
    quantize_row(dtype, x.data(), q.data(), 32 * 40);
    std::vector<float> y(x.size());
    dequantize_row(dtype, q.data(), y.data(), 32 * 40);
    for (size_t b = 0; b < 40; ++b) {
      float lo = x[b * 32], hi = x[b * 32], amax = 0;
      for (size_t j = 0; j < 32; ++j) {
        lo = std::min(lo, x[b * 32 + j]);
        hi = std::max(hi, x[b * 32 + j]);
        amax = std::max(amax, std::fabs(x[b * 32 + j]));
      }
      float step = 0;
      switch (dtype) {
        case DType::kQ4_0: step = amax / 8; break;
        case DType::kQ4_1: step = (hi - lo) / 15; break;
        case DType::kQ8_0: step = amax / 127; break;
        default: step = 0; break;
      }
      for (size_t j = 0; j < 32; ++j) {
        const float v = x[b * 32 + j];
        // Q4_0's scale is set by the largest-magnitude value (-8 steps), so the far side clamps at
        // +7 steps: up to a whole step there. Scales are stored as f16 (relative 2^-11).
        float bound = 0;
        switch (dtype) {
          case DType::kBF16: bound = std::fabs(v) / 128; break;
          case DType::kF16: bound = std::fabs(v) / 1024 + 1e-7f; break;
          case DType::kQ4_0: bound = step * 1.01f + std::fabs(v) / 1024 + 1e-7f; break;
          default: bound = step * 0.51f + std::fabs(v) / 1024 + 1e-7f; break;
        }
        ASSERT_LE(std::fabs(y[b * 32 + j] - v), bound)
            << dtype_info(dtype).name << " block " << b << " value " << j;
      }
    }
  }
}

// Every metadata kind, nested arrays and tensors survive write + parse.
TEST(GgufWriterTest, RoundTrip) {
  GgufFileWriter w;
  GgufValue s;
  s.type = GgufType::kString;
  s.string_value = "qwen2";
  w.set("general.architecture", s);
  w.set_u32("qwen2.block_count", 7);
  GgufValue f;
  f.type = GgufType::kF32;
  f.float_value = 0.5;
  w.set("x.f", f);
  GgufValue b;
  b.type = GgufType::kBool;
  b.int_value = 1;
  w.set("x.b", b);
  GgufValue i64;
  i64.type = GgufType::kI64;
  i64.int_value = -5;
  w.set("x.i64", i64);
  GgufValue strs;
  strs.type = GgufType::kArray;
  strs.array_type = GgufType::kString;
  strs.array_strings = {"a", "", "ccc"};
  w.set("x.strs", strs);
  GgufValue ints;
  ints.type = GgufType::kArray;
  ints.array_type = GgufType::kI32;
  ints.array_ints = {1, -2, 3};
  w.set("x.ints", ints);
  GgufValue nested;
  nested.type = GgufType::kArray;
  nested.array_type = GgufType::kArray;
  nested.array_nested = {ints, strs};
  w.set("x.nested", nested);
  std::vector<float> t1 = {1, 2, 3, 4, 5, 6};
  std::vector<std::byte> d1(sizeof(float) * t1.size());
  std::memcpy(d1.data(), t1.data(), d1.size());
  w.add_tensor("a.weight", DType::kF32, {2, 3}, d1);
  std::vector<std::byte> d2(34, std::byte{1});
  w.add_tensor("b.weight", DType::kQ8_0, {1, 32}, d2);
  const std::string path = test::temp_dir() + "/writer.gguf";
  ASSERT_TRUE(w.write(path).is_ok());
  auto g = GgufFile::open(path);
  ASSERT_TRUE(g.has_value()) << g.status().message();
  EXPECT_EQ(*g->get_string("general.architecture").value(), "qwen2");
  EXPECT_EQ(*g->get_int("qwen2.block_count").value(), 7);
  EXPECT_EQ(*g->get_float("x.f").value(), 0.5);
  EXPECT_EQ(g->find("x.b")->int_value, 1);
  EXPECT_EQ(g->find("x.i64")->int_value, -5);
  EXPECT_EQ(g->find("x.strs")->array_strings, strs.array_strings);
  EXPECT_EQ(g->find("x.ints")->array_ints, ints.array_ints);
  ASSERT_EQ(g->find("x.nested")->array_nested.size(), 2u);
  EXPECT_EQ(g->find("x.nested")->array_nested[1].array_strings, strs.array_strings);
  const TensorView* a = g->find_tensor("a.weight");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->shape[0], 2);
  EXPECT_EQ(a->shape[1], 3);
  EXPECT_EQ(0, std::memcmp(a->data, d1.data(), d1.size()));
  const TensorView* bt = g->find_tensor("b.weight");
  ASSERT_NE(bt, nullptr);
  EXPECT_EQ(bt->dtype, DType::kQ8_0);
  EXPECT_EQ(0, std::memcmp(bt->data, d2.data(), d2.size()));
}

// The tiny f32 model quantized to Q8_0 by inferd is the fixture gguf-py wrote: same logits, bit
// for bit; Q4_0 runs and stays near the f32 model.
TEST(QuantizeTest, QuantizedModelLoadsAndMatchesTheFixture) {
  const std::string dir = test::temp_dir();
  int64_t calls = 0;
  auto r = quantize_model(test::fixture_path("tiny/qwen2/model-f32.gguf"), dir + "/q8.gguf", DType::kQ8_0,
                          [&](int64_t done, int64_t total, const std::string&) {
                            ++calls;
                            EXPECT_LE(done, total);
                          });
  ASSERT_TRUE(r.has_value()) << r.status().message();
  EXPECT_EQ(r->converted, 15);
  EXPECT_EQ(r->kept, 11);
  EXPECT_EQ(calls, 26);
  auto ours = load_model(dir + "/q8.gguf");
  auto theirs = load_model(test::fixture_path("tiny/qwen2/model-q8_0.gguf"));
  auto f32 = load_model(test::fixture_path("tiny/qwen2/model-f32.gguf"));
  ASSERT_TRUE(ours.has_value()) << ours.status().message();
  ASSERT_TRUE(theirs.has_value() && f32.has_value());
  ThreadPool pool(2);
  Transformer a(**ours, pool), b(**theirs, pool), c(**f32, pool);
  const std::vector<std::vector<int32_t>> prompts = {{1, 2, 3, 4, 5, 6, 7, 8}, {100, 7, 42}};
  const auto la = test::all_logits(a, prompts, 0, false);
  ASSERT_FALSE(la.empty());
  EXPECT_EQ(la, test::all_logits(b, prompts, 0, false));
  auto r4 = quantize_model(dir + "/q8.gguf", dir + "/q4.gguf", DType::kQ4_0, {}, {.pure = true});
  ASSERT_TRUE(r4.has_value()) << r4.status().message();
  EXPECT_EQ(r4->kept_q8, 0);
  // Not pure: the (tied) token embedding stays Q8_0.
  auto r4k = quantize_model(dir + "/q8.gguf", dir + "/q4k.gguf", DType::kQ4_0);
  ASSERT_TRUE(r4k.has_value()) << r4k.status().message();
  EXPECT_EQ(r4k->kept_q8, 1);
  auto q4k = GgufFile::open(dir + "/q4k.gguf");
  ASSERT_TRUE(q4k.has_value());
  EXPECT_EQ(q4k->find_tensor("token_embd.weight")->dtype, DType::kQ8_0);
  EXPECT_EQ(q4k->find_tensor("blk.0.ffn_up.weight")->dtype, DType::kQ4_0);
  auto q4 = load_model(dir + "/q4.gguf");
  ASSERT_TRUE(q4.has_value()) << q4.status().message();
  Transformer d(**q4, pool);
  const auto l4 = test::all_logits(d, prompts, 0, false);
  const auto lf = test::all_logits(c, prompts, 0, false);
  // Fewer bits, further from the f32 model (these tiny random models magnify rounding).
  const double e8 = test::relative_max_error(la.data(), lf.data(), lf.size());
  const double e4 = test::relative_max_error(l4.data(), lf.data(), lf.size());
  EXPECT_GT(e4, e8);
  EXPECT_LT(e4, 1.0);
  EXPECT_EQ((*q4)->config.num_layers, (*f32)->config.num_layers);
}

// A MoE GGUF: stacked experts re-typed like any matrix, routers and the shared-expert gates kept
// F32 (as llama-quantize and the converter keep them), so our Q8_0 runs exactly as gguf-py's.
TEST(QuantizeTest, MoeGgufKeepsRoutersF32) {
  const std::string dir = test::temp_dir();
  auto r =
      quantize_model(test::fixture_path("tiny/qwen2_moe/model-f32.gguf"), dir + "/q8.gguf", DType::kQ8_0);
  ASSERT_TRUE(r.has_value()) << r.status().message();
  EXPECT_EQ(r->kept_f32_routers, 4);  // 2 layers x (router, shared-expert gate)
  auto q8 = GgufFile::open(dir + "/q8.gguf");
  ASSERT_TRUE(q8.has_value());
  EXPECT_EQ(q8->find_tensor("blk.1.ffn_gate_inp.weight")->dtype, DType::kF32);
  EXPECT_EQ(q8->find_tensor("blk.1.ffn_gate_inp_shexp.weight")->dtype, DType::kF32);
  EXPECT_EQ(q8->find_tensor("blk.1.ffn_down_exps.weight")->dtype, DType::kQ8_0);
  EXPECT_EQ(q8->find_tensor("blk.1.ffn_down_exps.weight")->shape_string(), "[8, 64, 32]");
  auto ours = load_model(dir + "/q8.gguf");
  auto theirs = load_model(test::fixture_path("tiny/qwen2_moe/model-q8_0.gguf"));
  ASSERT_TRUE(ours.has_value() && theirs.has_value()) << ours.status().message();
  ThreadPool pool(2);
  Transformer a(**ours, pool), b(**theirs, pool);
  const std::vector<std::vector<int32_t>> prompts = {{1, 2, 3, 4, 5, 6, 7, 8}, {100, 7, 42}};
  const auto la = test::all_logits(a, prompts, 0, false);
  ASSERT_FALSE(la.empty());
  EXPECT_EQ(la, test::all_logits(b, prompts, 0, false));
  // A Hugging Face MoE directory is not stacked into GGUF: refused, not written half.
  auto hf = quantize_model(test::fixture_path("tiny/qwen3_moe"), dir + "/hf.gguf", DType::kQ8_0);
  ASSERT_FALSE(hf.has_value());
  EXPECT_NE(hf.status().message().find("mixture-of-experts"), std::string::npos) << hf.status().message();
}

// inferd's own formats: INT8 within half a step of its row scale, FP8 within half a step of its
// 3-bit mantissa, INT4 groups never worse (squared error) than the plain min / max grid.
TEST(QuantizeTest, OwnFormatsRoundTrip) {
  std::mt19937 rng(17);
  const int64_t n = 640;  // 5 groups of 128, 10 of 64
  auto x = test::random_floats(static_cast<size_t>(n), rng);
  for (int j = 0; j < 128; ++j) x[static_cast<size_t>(j)] *= 1e-3f;  // a group of small values
  x[300] = 3.0f;                                                     // an outlier
  std::vector<float> zeros(static_cast<size_t>(n), 0.0f);
  for (const auto* src : {&x, &zeros}) {
    for (DType dtype : {DType::kI8, DType::kF8_E4M3, DType::kQ4_G128, DType::kQ4_G64}) {
      SCOPED_TRACE(std::string(dtype_info(dtype).name));
      std::vector<std::byte> q(static_cast<size_t>(dtype_bytes(dtype, n)));
      float scale = -1;
      quantize_row(dtype, src->data(), q.data(), n, &scale);
      std::vector<float> y(static_cast<size_t>(n));
      dequantize_row(dtype, q.data(), y.data(), n);
      float amax = 0;
      for (float v : *src) amax = std::max(amax, std::fabs(v));
      if (dtype == DType::kI8 || dtype == DType::kF8_E4M3) {
        EXPECT_EQ(scale, amax / (dtype == DType::kI8 ? 127.0f : 448.0f));
        for (int64_t i = 0; i < n; ++i) {
          const float v = (*src)[static_cast<size_t>(i)], got = y[static_cast<size_t>(i)] * scale;
          const float bound = dtype == DType::kI8 ? 0.5001f * scale + 1e-9f
                                                  : std::fabs(v) / 16 * 1.001f + scale * 0x1p-10f + 1e-9f;
          ASSERT_LE(std::fabs(got - v), bound) << i;
        }
        continue;
      }
      const int64_t g = q4_group_size(dtype);
      for (int64_t b = 0; b < n / g; ++b) {
        const float* xb = src->data() + b * g;
        float lo = xb[0], hi = xb[0];
        for (int64_t j = 0; j < g; ++j) {
          lo = std::min(lo, xb[j]);
          hi = std::max(hi, xb[j]);
        }
        // The plain grid with its f16 (d, m) and the best codes for them.
        const float d = f16_to_f32(f32_to_f16((hi - lo) / 15)), m = f16_to_f32(f32_to_f16(lo));
        double plain = 0, ours = 0;
        for (int64_t j = 0; j < g; ++j) {
          const float l = d > 0 ? std::min(15.0f, std::max(0.0f, std::nearbyint((xb[j] - m) / d))) : 0.0f;
          plain += std::pow(l * d + m - xb[j], 2);
          ours += std::pow(y[static_cast<size_t>(b * g + j)] - xb[j], 2);
          EXPECT_LE(std::fabs(y[static_cast<size_t>(b * g + j)] - xb[j]), 2 * (hi - lo) / 15 + 1e-6f);
        }
        EXPECT_LE(ours, plain + 1e-12) << "group " << b;
      }
    }
  }
}

// GGUF in, inferd's formats out: per-row scales beside their tensors, no llama.cpp file type,
// and the models run (packed and f32 paths agree) near the f32 model, INT4 further than INT8.
TEST(QuantizeTest, OwnFormatsFromGgufRunNearTheF32Model) {
  const std::string dir = test::temp_dir();
  const std::string src = test::fixture_path("tiny/qwen2/model-f32.gguf");
  auto f32 = load_model(src);
  ASSERT_TRUE(f32.has_value());
  ThreadPool pool(2);
  Transformer reference(**f32, pool);
  const std::vector<std::vector<int32_t>> prompts = {{1, 2, 3, 4, 5, 6, 7, 8}, {100, 7, 42}};
  const auto lf = test::all_logits(reference, prompts, 0, false);
  std::map<DType, double> error;
  for (DType dtype : {DType::kI8, DType::kF8_E4M3, DType::kQ4_G128}) {
    SCOPED_TRACE(std::string(dtype_info(dtype).name));
    const std::string path = dir + "/" + std::string(dtype_info(dtype).name) + ".gguf";
    auto r = quantize_model(src, path, dtype);
    ASSERT_TRUE(r.has_value()) << r.status().message();
    auto g = GgufFile::open(path);
    ASSERT_TRUE(g.has_value()) << g.status().message();
    EXPECT_EQ(g->find("general.file_type"), nullptr);
    const TensorView* up = g->find_tensor("blk.0.ffn_up.weight");      // [128, 64]
    const TensorView* down = g->find_tensor("blk.0.ffn_down.weight");  // [64, 128]
    ASSERT_TRUE(up != nullptr && down != nullptr);
    if (dtype == DType::kQ4_G128) {
      EXPECT_EQ(up->dtype, DType::kQ4_G64);  // rows of 64
      EXPECT_EQ(down->dtype, DType::kQ4_G128);
      EXPECT_EQ(g->find_tensor("token_embd.weight")->dtype, DType::kQ8_0);
      EXPECT_EQ(r->smaller_groups, 12);
      EXPECT_EQ(r->kept_q8, 1);
    } else {
      EXPECT_EQ(up->dtype, dtype);
      ASSERT_NE(up->row_scale, nullptr);
      const TensorView* scale = g->find_tensor("blk.0.ffn_up.weight_scale");
      ASSERT_NE(scale, nullptr);
      EXPECT_EQ(scale->dtype, DType::kF32);
      EXPECT_EQ(scale->num_elements(), 128);
      EXPECT_EQ(r->converted, 15);
    }
    auto m = load_model(path);
    ASSERT_TRUE(m.has_value()) << m.status().message();
    Transformer packed(**m, pool);
    Transformer plain(**m, pool, {.backend = BackendKind::kF32});
    const auto lp = test::all_logits(packed, prompts, 0, false);
    const auto lq = test::all_logits(plain, prompts, 0, false);
    // The f32 path multiplies exact weights by f32 activations; the packed one rounds activations
    // to int8 (integer formats) or sums in another order (FP8).
    EXPECT_LT(test::relative_max_error(lp.data(), lq.data(), lq.size()), 0.05);
    error[dtype] = test::relative_max_error(lq.data(), lf.data(), lf.size());
    EXPECT_LT(error[dtype], 1.0);
  }
  EXPECT_LT(error[DType::kI8], error[DType::kQ4_G128]);
  EXPECT_LT(error[DType::kI8], 0.05);
}

// A Hugging Face directory in, a directory out: safetensors with the quantized tensors, config.json
// naming the type, other files copied; the result loads and runs near the original.
TEST(QuantizeTest, HuggingFaceDirectoryBecomesAQuantizedDirectory) {
  const std::string dir = test::temp_dir();
  const std::string src = test::fixture_path("tiny/qwen2");
  auto original = load_model(src);
  ASSERT_TRUE(original.has_value());
  ThreadPool pool(2);
  Transformer reference(**original, pool);
  const std::vector<std::vector<int32_t>> prompts = {{5, 6, 7, 8, 9}, {200, 3}};
  const auto lf = test::all_logits(reference, prompts, 0, false);
  for (DType dtype : {DType::kI8, DType::kF8_E4M3, DType::kQ4_G128}) {
    SCOPED_TRACE(std::string(dtype_info(dtype).name));
    const std::string out = dir + "/" + std::string(dtype_info(dtype).name);
    auto r = quantize_model(src, out, dtype);
    ASSERT_TRUE(r.has_value()) << r.status().message();
    EXPECT_TRUE(std::filesystem::exists(out + "/generation_config.json"));
    std::ifstream cf(out + "/config.json");
    const auto config = nlohmann::json::parse(cf);
    EXPECT_EQ(config["quantization_config"]["weight_type"], std::string(dtype_info(dtype).name));
    auto st = SafetensorsFile::open(out + "/model.safetensors");
    ASSERT_TRUE(st.has_value()) << st.status().message();
    const TensorView* q = st->find_tensor("model.layers.0.self_attn.q_proj.weight");
    ASSERT_NE(q, nullptr);
    EXPECT_EQ(q->dtype, dtype == DType::kQ4_G128 ? DType::kQ4_G64 : dtype);
    EXPECT_EQ(q->row_length(), 64);
    if (dtype == DType::kQ4_G128) {
      EXPECT_EQ(st->find_tensor("model.layers.0.mlp.down_proj.weight")->dtype, DType::kQ4_G128);
      EXPECT_EQ(st->find_tensor("model.embed_tokens.weight")->dtype, DType::kQ8_0);
    }
    auto m = load_model(out);
    ASSERT_TRUE(m.has_value()) << m.status().message();
    Transformer t(**m, pool);
    const auto lq = test::all_logits(t, prompts, 0, false);
    EXPECT_LT(test::relative_max_error(lq.data(), lf.data(), lf.size()), dtype == DType::kI8 ? 0.05 : 1.0);
  }
  // GGUF block types cannot be written as safetensors (the error says to name a .gguf output),
  // and the output cannot be the input.
  auto q8 = quantize_model(src, dir + "/q8", DType::kQ8_0);
  ASSERT_FALSE(q8.has_value());
  EXPECT_NE(q8.status().message().find(".gguf"), std::string::npos);
  auto same = quantize_model(src, src, DType::kI8);
  ASSERT_FALSE(same.has_value());
}

// A Hugging Face directory written as GGUF is what llama.cpp's converter writes (the fixtures'
// GGUF files were written by gguf-py the same way): every tensor byte for byte in F32 and Q8_0,
// Llama's Q / K rows permuted, the same architecture keys (rope scaling's too, and llama3's
// rope_freqs.weight); and it runs like the original.
TEST(QuantizeTest, HuggingFaceDirectoryToGgufMatchesTheConverter) {
  const std::string dir = test::temp_dir();
  for (const char* model : {"llama_tied", "llama_untied", "qwen2", "qwen3", "llama_rope_llama3",
                            "qwen2_rope_yarn", "llama_rope_linear"}) {
    for (DType dtype : {DType::kF32, DType::kQ8_0}) {
      if (dtype != DType::kF32 && std::string(model).find("_rope_") != std::string::npos)
        continue;  // f32 only
      SCOPED_TRACE(std::string(model) + " " + std::string(dtype_info(dtype).name));
      const std::string out = dir + "/" + model + "-" + std::string(dtype_info(dtype).name) + ".gguf";
      auto r = quantize_model(test::fixture_path(std::string("tiny/") + model), out, dtype);
      ASSERT_TRUE(r.has_value()) << r.status().message();
      auto ours = GgufFile::open(out);
      auto want = GgufFile::open(test::fixture_path(
          std::string("tiny/") + model + (dtype == DType::kF32 ? "/model-f32.gguf" : "/model-q8_0.gguf")));
      ASSERT_TRUE(ours.has_value() && want.has_value());
      ASSERT_EQ(ours->tensors().size(), want->tensors().size());
      for (const TensorView& w : want->tensors()) {
        const TensorView* o = ours->find_tensor(w.name);
        ASSERT_NE(o, nullptr) << w.name;
        EXPECT_EQ(o->dtype, w.dtype) << w.name;
        ASSERT_EQ(o->num_bytes, w.num_bytes) << w.name;
        EXPECT_EQ(0, std::memcmp(o->data, w.data, w.num_bytes)) << w.name;
      }
      for (const auto& [key, value] : want->metadata()) {
        if (key == "general.name") continue;
        const GgufValue* v = ours->find(key);
        ASSERT_NE(v, nullptr) << key;
        EXPECT_EQ(v->int_value, value.int_value) << key;
        EXPECT_NEAR(v->float_value, value.float_value, 1e-9) << key;
        EXPECT_EQ(v->string_value, value.string_value) << key;
      }
    }
  }
  // It loads and runs like the Hugging Face directory (Llama: RoPE pairs re-permuted).
  auto hf = load_model(test::fixture_path("tiny/llama_untied"));
  auto gguf = load_model(dir + "/llama_untied-F32.gguf");
  ASSERT_TRUE(hf.has_value() && gguf.has_value());
  ThreadPool pool(2);
  Transformer a(**hf, pool, {.backend = BackendKind::kF32}), b(**gguf, pool, {.backend = BackendKind::kF32});
  const std::vector<std::vector<int32_t>> prompts = {{1, 2, 3, 4, 5, 6, 7}, {9, 8}};
  const auto la = test::all_logits(a, prompts, 0, false);
  const auto lb = test::all_logits(b, prompts, 0, false);
  EXPECT_LT(test::relative_max_error(lb.data(), la.data(), la.size()), 1e-4);
  // Dynamic NTK has no GGUF form: refused, not dropped.
  auto dynamic =
      quantize_model(test::fixture_path("tiny/qwen2_rope_dynamic"), dir + "/dynamic.gguf", DType::kF32);
  ASSERT_FALSE(dynamic.has_value());
  EXPECT_NE(dynamic.status().message().find("dynamic NTK rope scaling has no GGUF form"), std::string::npos)
      << dynamic.status().message();
}

// Files with row-scaled tensors are checked when they open: the scale tensor must exist, hold
// one value per row, and FP8 weights no NaN code; safetensors block types must be known.
TEST(QuantizeTest, RowScaledAndBlockTypedTensorsAreChecked) {
  const std::string dir = test::temp_dir();
  auto bytes = [](size_t n, uint8_t v) { return std::vector<std::byte>(n, std::byte{v}); };
  struct Case {
    const char* what;
    DType dtype;
    std::vector<std::byte> data;
    int64_t scales;  // 0: no scale tensor
  };
  const Case cases[] = {{"w_scale", DType::kI8, bytes(64, 3), 0},
                        {"2 values for 2 rows", DType::kI8, bytes(64, 3), 2},
                        {"3 values for 2 rows", DType::kI8, bytes(64, 3), 3},
                        {"NaN code", DType::kF8_E4M3, bytes(64, 0x7f), 2}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    GgufFileWriter w;
    w.add_tensor("w", c.dtype, {2, 32}, c.data);
    if (c.scales > 0)
      w.add_tensor("w_scale", DType::kF32, {c.scales}, bytes(4 * static_cast<size_t>(c.scales), 0));
    ASSERT_TRUE(w.write(dir + "/t.gguf").is_ok());
    auto g = GgufFile::open(dir + "/t.gguf");
    if (std::string(c.what) == "2 values for 2 rows") {
      ASSERT_TRUE(g.has_value()) << g.status().message();
      EXPECT_EQ(g->find_tensor("w")->row_scale[1], 0.0f);
      continue;
    }
    ASSERT_FALSE(g.has_value());
    EXPECT_NE(g.status().message().find(c.what), std::string::npos) << g.status().message();
  }
  // Safetensors: a block-typed tensor round-trips; an unknown block type is refused.
  std::mt19937 rng(3);
  std::vector<std::byte> storage;
  TensorView q = test::random_tensor(DType::kQ4_G128, 3, 256, rng, &storage);
  SafetensorsWriter sw;
  sw.add_tensor("q", DType::kQ4_G128, {3, 256}, std::vector<std::byte>(q.data, q.data + q.num_bytes));
  ASSERT_TRUE(sw.write(dir + "/q.safetensors").is_ok());
  auto st = SafetensorsFile::open(dir + "/q.safetensors");
  ASSERT_TRUE(st.has_value()) << st.status().message();
  const TensorView* back = st->find_tensor("q");
  ASSERT_NE(back, nullptr);
  EXPECT_EQ(back->dtype, DType::kQ4_G128);
  EXPECT_EQ(back->row_length(), 256);
  EXPECT_EQ(0, std::memcmp(back->data, q.data, q.num_bytes));
  sw.set_metadata("inferd.block_type.r", "Q9_9");
  sw.add_tensor("r", DType::kF32, {1}, std::vector<std::byte>(4));
  ASSERT_TRUE(sw.write(dir + "/bad.safetensors").is_ok());
  auto bad = SafetensorsFile::open(dir + "/bad.safetensors");
  ASSERT_FALSE(bad.has_value());
  EXPECT_NE(bad.status().message().find("Q9_9"), std::string::npos);
}

// Random corruption of files holding inferd's types (row scales, FP8, safetensors block types)
// never crashes (ASan in CI); what still parses has every tensor inside the buffer and a row
// scale for every row-scaled tensor, and decodes.
TEST(QuantizeTest, RandomMutationsOfOwnFormatsNeverCrash) {
  std::mt19937 rng(77);
  std::vector<std::byte> s8, s4, sf;
  TensorView i8 = test::random_tensor(DType::kI8, 3, 64, rng, &s8);
  TensorView f8 = test::random_tensor(DType::kF8_E4M3, 2, 32, rng, &sf);
  TensorView q4 = test::random_tensor(DType::kQ4_G128, 2, 128, rng, &s4);
  const std::string dir = test::temp_dir();
  auto bytes_of = [](const TensorView& t) { return std::vector<std::byte>(t.data, t.data + t.num_bytes); };
  auto scales_of = [](const TensorView& t) {
    std::vector<std::byte> b(static_cast<size_t>(t.num_rows()) * sizeof(float));
    std::memcpy(b.data(), t.row_scale, b.size());
    return b;
  };
  GgufFileWriter g;
  g.add_tensor("a", DType::kI8, {3, 64}, bytes_of(i8));
  g.add_tensor("a_scale", DType::kF32, {3}, scales_of(i8));
  g.add_tensor("b", DType::kF8_E4M3, {2, 32}, bytes_of(f8));
  g.add_tensor("b_scale", DType::kF32, {2}, scales_of(f8));
  g.add_tensor("c", DType::kQ4_G128, {2, 128}, bytes_of(q4));
  ASSERT_TRUE(g.write(dir + "/m.gguf").is_ok());
  SafetensorsWriter w;
  w.add_tensor("a", DType::kI8, {3, 64}, bytes_of(i8));
  w.add_tensor("a_scale", DType::kF32, {3}, scales_of(i8));
  w.add_tensor("c", DType::kQ4_G128, {2, 128}, bytes_of(q4));
  ASSERT_TRUE(w.write(dir + "/m.safetensors").is_ok());
  for (const char* name : {"m.gguf", "m.safetensors"}) {
    SCOPED_TRACE(name);
    const std::vector<std::byte> good = test::read_bytes(dir + "/" + name);
    int accepted = 0;
    for (int iter = 0; iter < 3000; ++iter) {
      auto b = good;
      for (int e = 0, edits = 1 + static_cast<int>(rng() % 3); e < edits && !b.empty(); ++e) {
        const size_t pos = rng() % b.size();
        if (rng() % 5 == 0) {
          b.resize(pos);
        } else {
          b[pos] = static_cast<std::byte>(rng() & 0xff);
        }
      }
      // The views (and their row scales) live as long as the parsed file object.
      std::optional<GgufFile> gguf;
      std::optional<SafetensorsFile> st;
      if (std::string(name) == "m.gguf") {
        auto f = GgufFile::parse("m", b.data(), b.size());
        if (!f.has_value()) continue;
        gguf.emplace(std::move(f).value());
      } else {
        auto f = SafetensorsFile::parse("m", b.data(), b.size());
        if (!f.has_value()) continue;
        st.emplace(std::move(f).value());
      }
      const std::vector<TensorView>& tensors = gguf ? gguf->tensors() : st->tensors();
      ++accepted;
      for (const TensorView& t : tensors) {
        ASSERT_GE(t.data, b.data());
        ASSERT_LE(t.data + t.num_bytes, b.data() + b.size());
        ASSERT_EQ(dtype_has_row_scale(t.dtype), t.row_scale != nullptr) << t.name;
        if (t.num_dims != 2) continue;
        std::vector<float> row(static_cast<size_t>(t.row_length()));
        for (int64_t r = 0; r < t.num_rows(); ++r) dequantize_tensor_row(t, r, row.data());
      }
    }
    EXPECT_GT(accepted, 0);
  }
}

TEST(QuantizeTest, ErrorsNameTheProblem) {
  const std::string dir = test::temp_dir();
  auto missing = quantize_model(dir + "/nope.gguf", dir + "/out.gguf", DType::kQ8_0);
  ASSERT_FALSE(missing.has_value());
  EXPECT_NE(missing.status().message().find("nope.gguf"), std::string::npos);
  auto hf = quantize_model(test::fixture_path("tiny/qwen2"), dir + "/out", DType::kQ8_0);
  ASSERT_FALSE(hf.has_value());
  EXPECT_NE(hf.status().message().find("GGUF"), std::string::npos);
  auto k = quantize_model(test::fixture_path("tiny/qwen2/model-f32.gguf"), dir + "/out.gguf", DType::kQ6_K);
  ASSERT_FALSE(k.has_value());
  auto unwritable =
      quantize_model(test::fixture_path("tiny/qwen2/model-f32.gguf"), "/proc/nope/out.gguf", DType::kQ8_0);
  ASSERT_FALSE(unwritable.has_value());
  EXPECT_NE(unwritable.status().message().find("/proc/nope"), std::string::npos);
}

}  // namespace
}  // namespace inferd
