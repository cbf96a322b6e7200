// `inferd prune --drop-layers`: the layer list, and GGUF models rewritten without layers: the
// kept layers' tensors byte for byte under their new numbers, block_count lowered, the model
// loading and running; refusals naming the problem.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>

#include "formats/gguf_file.h"
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
