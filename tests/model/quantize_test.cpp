// `inferd quantize`: the row quantizers against gguf-py's files, the GGUF writer round trip, and a
// whole model quantized, reloaded and run.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>

#include "model/gguf_file.h"
#include "model/gguf_writer.h"
#include "model/model_loader.h"
#include "model/model_quantizer.h"
#include "model/transformer.h"
#include "model_test_util.h"
#include "tensor/dequantize.h"
#include "tensor/quantize.h"
#include "test_support.h"

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
  auto r4 = quantize_model(dir + "/q8.gguf", dir + "/q4.gguf", DType::kQ4_0, {}, /*pure=*/true);
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

TEST(QuantizeTest, ErrorsNameTheProblem) {
  const std::string dir = test::temp_dir();
  auto missing = quantize_model(dir + "/nope.gguf", dir + "/out.gguf", DType::kQ8_0);
  ASSERT_FALSE(missing.has_value());
  EXPECT_NE(missing.status().message().find("nope.gguf"), std::string::npos);
  auto hf = quantize_model(test::fixture_path("tiny/qwen2"), dir + "/out.gguf", DType::kQ8_0);
  ASSERT_FALSE(hf.has_value());
  EXPECT_NE(hf.status().message().find("Hugging Face"), std::string::npos);
  auto k = quantize_model(test::fixture_path("tiny/qwen2/model-f32.gguf"), dir + "/out.gguf", DType::kQ6_K);
  ASSERT_FALSE(k.has_value());
  auto unwritable =
      quantize_model(test::fixture_path("tiny/qwen2/model-f32.gguf"), "/proc/nope/out.gguf", DType::kQ8_0);
  ASSERT_FALSE(unwritable.has_value());
  EXPECT_NE(unwritable.status().message().find("/proc/nope"), std::string::npos);
}

}  // namespace
}  // namespace inferd
