// `inferd prune --drop-layers`: the layer list, and GGUF models rewritten without layers: the
// kept layers' tensors byte for byte under their new numbers, block_count lowered, the model
// loading and running; refusals naming the problem.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>

#include "formats/gguf_file.h"
#include "formats/gguf_writer.h"
#include "model/model_loader.h"
#include "model/model_test_util.h"
#include "model/transformer.h"
#include "test_support.h"
#include "tools/model_pruner.h"

namespace inferd {
namespace {

TEST(PruneTest, LayerListsTakeIndicesAndRanges) {
  auto l = parse_layer_list("12,3,5-7,5");
  ASSERT_TRUE(l.has_value()) << l.status().message();
  EXPECT_EQ(*l, (std::vector<int64_t>{3, 5, 6, 7, 12}));
  for (const char* bad : {"", "a", "3-1", "-2", "1,,2", "4-", "2.5", "1,x-3"}) {
    auto r = parse_layer_list(bad);
    ASSERT_FALSE(r.has_value()) << bad;
    EXPECT_NE(r.status().message().find("--drop-layers"), std::string::npos) << r.status().message();
  }
}

std::map<std::string, const TensorView*> by_name(const GgufFile& f) {
  std::map<std::string, const TensorView*> m;
  for (const TensorView& t : f.tensors()) m[t.name] = &t;
  return m;
}

TEST(PruneTest, KeptLayersAreRenumberedAndTheModelRuns) {
  const std::string in = test::fixture_path("tiny/qwen2/model-f32.gguf");
  const std::string dir = test::temp_dir();
  auto none = prune_gguf_layers(in, dir + "/same.gguf", {});
  ASSERT_TRUE(none.has_value()) << none.status().message();
  EXPECT_EQ(none->layers_out, 2);
  auto r = prune_gguf_layers(in, dir + "/one.gguf", {0});
  ASSERT_TRUE(r.has_value()) << r.status().message();
  EXPECT_EQ(r->layers_in, 2);
  EXPECT_EQ(r->layers_out, 1);
  EXPECT_LT(r->output_bytes, r->input_bytes);

  auto a = GgufFile::open(in);
  auto b = GgufFile::open(dir + "/one.gguf");
  ASSERT_TRUE(a.has_value() && b.has_value());
  auto count = b->get_int("qwen2.block_count");
  ASSERT_TRUE(count.has_value() && count->has_value());
  EXPECT_EQ(**count, 1);
  const auto ta = by_name(*a), tb = by_name(*b);
  int64_t layer_tensors = 0;
  for (const auto& [name, t] : ta) {
    std::string expect = name;
    if (name.rfind("blk.0.", 0) == 0) continue;  // dropped: the new blk.0 is the old blk.1
    if (name.rfind("blk.1.", 0) == 0) {
      expect = "blk.0." + name.substr(6);
      ++layer_tensors;
    }
    ASSERT_TRUE(tb.contains(expect)) << expect;
    const TensorView* u = tb.at(expect);
    EXPECT_EQ(u->dtype, t->dtype) << name;
    ASSERT_EQ(u->num_bytes, t->num_bytes) << name;
    EXPECT_EQ(std::memcmp(u->data, t->data, t->num_bytes), 0) << name;
  }
  EXPECT_GT(layer_tensors, 5);
  EXPECT_EQ(static_cast<int64_t>(tb.size()), r->tensors_out);
  EXPECT_EQ(static_cast<int64_t>(ta.size()) - static_cast<int64_t>(tb.size()), layer_tensors);

  // Dropping nothing is the model; dropping a layer is a model of one layer with other logits.
  auto full = load_model(in), same = load_model(dir + "/same.gguf"), one = load_model(dir + "/one.gguf");
  ASSERT_TRUE(full.has_value() && same.has_value()) << same.status().message();
  ASSERT_TRUE(one.has_value()) << one.status().message();
  EXPECT_EQ((*one)->config.num_layers, 1);
  ThreadPool pool(2);
  Transformer mf(**full, pool), ms(**same, pool), m1(**one, pool);
  const std::vector<std::vector<int32_t>> prompts = {{1, 2, 3, 4, 5, 6, 7, 8}, {100, 7, 42}};
  const auto lf = test::all_logits(mf, prompts, 0, false);
  ASSERT_FALSE(lf.empty());
  EXPECT_EQ(lf, test::all_logits(ms, prompts, 0, false));
  const auto l1 = test::all_logits(m1, prompts, 0, false);
  ASSERT_EQ(l1.size(), lf.size());
  EXPECT_NE(l1, lf);
  for (const float x : l1) ASSERT_TRUE(std::isfinite(x));
}

// The tiny Qwen2 (2 layers) grown to 4: layers 2 and 3 are copies of 1 and 0, and layer 2's
// attention output and MLP down projections are zero, so it adds nothing to the residual stream.
std::string four_layers_one_idle(const std::string& dir) {
  auto in = GgufFile::open(test::fixture_path("tiny/qwen2/model-f32.gguf"));
  EXPECT_TRUE(in.has_value());
  GgufFileWriter out;
  for (const auto& [key, value] : in->metadata()) out.set(key, value);
  out.set_u32("qwen2.block_count", 4);
  for (const TensorView& t : in->tensors()) {
    std::vector<int64_t> shape(t.shape.begin(), t.shape.begin() + t.num_dims);
    std::vector<std::byte> bytes(t.data, t.data + t.num_bytes);
    out.add_tensor(t.name, t.dtype, shape, bytes);
    for (const auto& [from, to] : {std::pair{"blk.1.", "blk.2."}, std::pair{"blk.0.", "blk.3."}}) {
      if (t.name.rfind(from, 0) != 0) continue;
      const std::string name = to + t.name.substr(6);
      const bool idle = name == "blk.2.attn_output.weight" || name == "blk.2.ffn_down.weight";
      out.add_tensor(name, t.dtype, shape, idle ? std::vector<std::byte>(t.num_bytes) : bytes);
    }
  }
  const std::string path = dir + "/four.gguf";
  EXPECT_TRUE(out.write(path).is_ok());
  return path;
}

TEST(PruneTest, BlockInfluenceFindsTheLayerThatDoesNothing) {
  const std::string dir = test::temp_dir();
  auto weights = load_model(four_layers_one_idle(dir));
  ASSERT_TRUE(weights.has_value()) << weights.status().message();
  ASSERT_EQ((*weights)->config.num_layers, 4);
  std::vector<int32_t> tokens;
  for (int i = 0; i < 96; ++i) tokens.push_back((i * 37 + 11) % 200);
  ThreadPool pool(2);
  auto imp = layer_importance(**weights, tokens, 32, 0, pool);
  ASSERT_TRUE(imp.has_value()) << imp.status().message();
  ASSERT_EQ(imp->influence.size(), 4u);
  EXPECT_EQ(imp->tokens, 96);
  EXPECT_LT(imp->influence[2], 1e-9);  // cos(x, x) = 1
  for (size_t l : {0u, 1u, 3u}) EXPECT_GT(imp->influence[l], 1e-4) << l;
  for (double v : imp->influence) EXPECT_LE(v, 2.0);
  EXPECT_EQ(least_important_layers(imp->influence, 1), (std::vector<int64_t>{2}));
  // Never the first or the last layer, whatever their influence; asking too many gives all others.
  EXPECT_EQ(least_important_layers({0.0, 0.5, 0.2, 0.0}, 1), (std::vector<int64_t>{2}));
  EXPECT_EQ(least_important_layers({0.0, 0.5, 0.2, 0.0}, 5), (std::vector<int64_t>{1, 2}));
}

TEST(PruneTest, RefusalsNameTheProblem) {
  const std::string in = test::fixture_path("tiny/qwen2/model-f32.gguf");
  const std::string dir = test::temp_dir();
  const std::pair<std::vector<int64_t>, const char*> bad[] = {
      {{2}, "out of range"},
      {{0, 1}, "every layer"},
  };
  for (const auto& [drop, needle] : bad) {
    auto r = prune_gguf_layers(in, dir + "/x.gguf", drop);
    ASSERT_FALSE(r.has_value()) << needle;
    EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().message();
  }
  auto self = prune_gguf_layers(in, in, {0});
  ASSERT_FALSE(self.has_value());
  EXPECT_NE(self.status().message().find("differ"), std::string::npos) << self.status().message();
  test::write_bytes(dir + "/junk.gguf", std::vector<std::byte>(64, std::byte{7}));
  EXPECT_FALSE(prune_gguf_layers(dir + "/junk.gguf", dir + "/y.gguf", {0}).has_value());
}

}  // namespace
}  // namespace inferd
