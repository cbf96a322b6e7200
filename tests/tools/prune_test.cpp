// `inferd prune`: the layer list, and GGUF models rewritten without layers: the kept layers'
// tensors byte for byte under their new numbers, block_count lowered, the model loading and
// running. Heads and FFN channels: the pruned model computes what the whole model computes with
// the cut heads' and channels' output weights zeroed (GGUF and safetensors, GQA and MHA), the
// calibration finds the head and channel that add nothing; refusals naming the problem.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <set>

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
  auto none = prune_model(in, dir + "/same.gguf", {});
  ASSERT_TRUE(none.has_value()) << none.status().message();
  EXPECT_EQ(none->layers_out, 2);
  auto r = prune_model(in, dir + "/one.gguf", {.drop_layers = {0}});
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
  auto imp = structure_importance(**weights, tokens, 32, 0, pool);
  ASSERT_TRUE(imp.has_value()) << imp.status().message();
  ASSERT_EQ(imp->layer.size(), 4u);
  EXPECT_EQ(imp->tokens, 96);
  EXPECT_LT(imp->layer[2], 1e-9);  // cos(x, x) = 1
  for (size_t l : {0u, 1u, 3u}) EXPECT_GT(imp->layer[l], 1e-4) << l;
  for (double v : imp->layer) EXPECT_LE(v, 2.0);
  EXPECT_EQ(least_important_layers(imp->layer, 1), (std::vector<int64_t>{2}));
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
    auto r = prune_model(in, dir + "/x.gguf", {.drop_layers = drop});
    ASSERT_FALSE(r.has_value()) << needle;
    EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().message();
  }
  auto self = prune_model(in, in, {.drop_layers = {0}});
  ASSERT_FALSE(self.has_value());
  EXPECT_NE(self.status().message().find("differ"), std::string::npos) << self.status().message();
  test::write_bytes(dir + "/junk.gguf", std::vector<std::byte>(64, std::byte{7}));
  EXPECT_FALSE(prune_model(dir + "/junk.gguf", dir + "/y.gguf", {.drop_layers = {0}}).has_value());
}

// The tiny Qwen2 (f32; 2 layers, 4 query heads in 2 KV groups of head size 16, 128 FFN channels)
// rewritten through `edit(name, values, rows, cols)` on every tensor.
using Edit = std::function<void(const std::string&, std::vector<float>&, int64_t, int64_t)>;
std::string edited_qwen2(const std::string& path, const Edit& edit,
                         const std::map<std::string, uint32_t>& keys = {}) {
  auto in = GgufFile::open(test::fixture_path("tiny/qwen2/model-f32.gguf"));
  EXPECT_TRUE(in.has_value());
  GgufFileWriter out;
  for (const auto& [key, value] : in->metadata()) out.set(key, value);
  for (const auto& [key, value] : keys) out.set_u32(key, value);
  for (const TensorView& t : in->tensors()) {
    std::vector<int64_t> shape(t.shape.begin(), t.shape.begin() + t.num_dims);
    std::vector<float> v(static_cast<size_t>(t.num_elements()));
    std::memcpy(v.data(), t.data, t.num_bytes);
    edit(t.name, v, t.num_dims < 2 ? 1 : t.num_rows(), t.row_length());
    if (v.size() != static_cast<size_t>(t.num_elements()))
      shape[0] =
          t.num_dims < 2 ? static_cast<int64_t>(v.size()) : static_cast<int64_t>(v.size()) / t.row_length();
    std::vector<std::byte> bytes(v.size() * sizeof(float));
    std::memcpy(bytes.data(), v.data(), bytes.size());
    out.add_tensor(t.name, t.dtype, shape, bytes);
  }
  EXPECT_TRUE(out.write(path).is_ok());
  return path;
}

// Zeroes the columns `cols` of a [rows, row_len] matrix.
void zero_columns(std::vector<float>& v, int64_t rows, int64_t row_len, const std::set<int64_t>& cols) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c : cols) v[static_cast<size_t>(r * row_len + c)] = 0.0f;
}

std::set<int64_t> head_columns(const std::vector<int64_t>& heads, int64_t head_dim) {
  std::set<int64_t> cols;
  for (int64_t h : heads)
    for (int64_t i = 0; i < head_dim; ++i) cols.insert(h * head_dim + i);
  return cols;
}

// The columns of `n` not in `kept`.
std::set<int64_t> complement(const std::vector<int64_t>& kept, int64_t n) {
  std::set<int64_t> out;
  for (int64_t i = 0; i < n; ++i)
    if (std::find(kept.begin(), kept.end(), i) == kept.end()) out.insert(i);
  return out;
}

std::vector<float> logits_of(const std::string& path) {
  auto w = load_model(path);
  EXPECT_TRUE(w.has_value()) << w.status().message();
  if (!w.has_value()) return {};
  ThreadPool pool(2);
  Transformer m(**w, pool);
  return test::all_logits(m, {{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, {100, 7, 42}}, 0, false);
}

float max_difference(const std::vector<float>& a, const std::vector<float>& b) {
  float worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(a[i] - b[i]));
  return worst;
}

void expect_close(const std::vector<float>& a, const std::vector<float>& b, float tolerance) {
  ASSERT_EQ(a.size(), b.size());
  ASSERT_FALSE(a.empty());
  EXPECT_LE(max_difference(a, b), tolerance);
}

// Heads kept per layer (one of each KV group: group 0 is heads 0-1, group 1 heads 2-3) and FFN
// channels kept per layer (96 of 128).
const std::vector<std::vector<int64_t>> kKeepHeads = {{0, 3}, {1, 2}};
std::vector<std::vector<int64_t>> keep_channels() {
  std::vector<std::vector<int64_t>> keep(2);
  for (int64_t j = 0; j < 128; ++j) {
    if (j % 4 != 1) keep[0].push_back(j);
    if (j % 4 != 2) keep[1].push_back(j);
  }
  return keep;
}

// The tiny model with the cut heads' columns of O and the cut channels' columns of down zeroed:
// what the pruned model must compute.
std::string zeroed_reference(const std::string& path, const std::vector<std::vector<int64_t>>& heads,
                             const std::vector<std::vector<int64_t>>& channels) {
  return edited_qwen2(path, [&](const std::string& name, std::vector<float>& v, int64_t rows, int64_t cols) {
    for (size_t l = 0; l < 2; ++l) {
      const std::string blk = "blk." + std::to_string(l) + ".";
      if (!heads.empty() && name == blk + "attn_output.weight") {
        const std::set<int64_t> gone = complement(heads[l], 4);
        zero_columns(v, rows, cols, head_columns({gone.begin(), gone.end()}, 16));
      }
      if (!channels.empty() && name == blk + "ffn_down.weight")
        zero_columns(v, rows, cols, complement(channels[l], 128));
    }
  });
}

TEST(PruneTest, CutHeadsAndChannelsComputeWhatZeroedOnesDo) {
  const std::string in = test::fixture_path("tiny/qwen2/model-f32.gguf");
  const std::string dir = test::temp_dir();
  const PrunePlan plan{.drop_layers = {}, .keep_heads = kKeepHeads, .keep_channels = keep_channels()};
  auto r = prune_model(in, dir + "/cut.gguf", plan);
  ASSERT_TRUE(r.has_value()) << r.status().message();
  EXPECT_EQ(r->heads_in, 4);
  EXPECT_EQ(r->heads_out, 2);
  EXPECT_EQ(r->kv_heads_out, 2);  // one query head left per KV group
  EXPECT_EQ(r->ffn_out, 96);
  EXPECT_EQ(r->requantized, 0);  // f32: every cut is a copy
  EXPECT_LT(r->output_bytes, r->input_bytes);
  auto f = GgufFile::open(dir + "/cut.gguf");
  ASSERT_TRUE(f.has_value());
  for (const auto& [key, want] : std::map<std::string, int64_t>{{"qwen2.attention.head_count", 2},
                                                                {"qwen2.attention.head_count_kv", 2},
                                                                {"qwen2.attention.key_length", 16},
                                                                {"qwen2.feed_forward_length", 96}}) {
    auto v = f->get_int(key);
    ASSERT_TRUE(v.has_value() && v->has_value()) << key;
    EXPECT_EQ(**v, want) << key;
  }
  auto w = load_model(dir + "/cut.gguf");
  ASSERT_TRUE(w.has_value()) << w.status().message();
  EXPECT_EQ((*w)->config.q_dim(), 32);
  EXPECT_EQ((*w)->config.hidden_size, 64);
  const std::vector<float> cut = logits_of(dir + "/cut.gguf");
  const std::vector<float> whole = logits_of(in);
  const std::vector<float> zeroed =
      logits_of(zeroed_reference(dir + "/zeroed.gguf", kKeepHeads, keep_channels()));
  expect_close(cut, zeroed, 1e-4f);
  ASSERT_EQ(cut.size(), whole.size());
  EXPECT_GT(max_difference(cut, whole), 1e-2f);  // the cut matters far beyond the tolerance
  // Heads alone and channels alone too; and with a layer dropped, the kept layer's lists apply.
  auto heads_only = prune_model(in, dir + "/heads.gguf", {.keep_heads = kKeepHeads});
  ASSERT_TRUE(heads_only.has_value()) << heads_only.status().message();
  expect_close(logits_of(dir + "/heads.gguf"), logits_of(zeroed_reference(dir + "/zh.gguf", kKeepHeads, {})),
               1e-4f);
  auto ffn_only = prune_model(in, dir + "/ffn.gguf", {.keep_channels = keep_channels()});
  ASSERT_TRUE(ffn_only.has_value()) << ffn_only.status().message();
  expect_close(logits_of(dir + "/ffn.gguf"),
               logits_of(zeroed_reference(dir + "/zf.gguf", {}, keep_channels())), 1e-4f);
  auto with_drop = prune_model(in, dir + "/drop.gguf", {.drop_layers = {0}, .keep_heads = kKeepHeads});
  ASSERT_TRUE(with_drop.has_value()) << with_drop.status().message();
  auto dropped_then = prune_model(dir + "/zh.gguf", dir + "/zh-drop.gguf", {.drop_layers = {0}});
  ASSERT_TRUE(dropped_then.has_value());
  expect_close(logits_of(dir + "/drop.gguf"), logits_of(dir + "/zh-drop.gguf"), 1e-4f);
}

TEST(PruneTest, WithOneQueryHeadPerKvHeadTheKvHeadsGoToo) {
  // The tiny Qwen2 as multi-head attention: each K / V head (and bias) repeated for its two query
  // heads computes exactly what the grouped model computes.
  const std::string dir = test::temp_dir();
  const std::string mha =
      edited_qwen2(dir + "/mha.gguf",
                   [](const std::string& name, std::vector<float>& v, int64_t rows, int64_t cols) {
                     const bool kv = name.find("attn_k.") != std::string::npos ||
                                     name.find("attn_v.") != std::string::npos;
                     if (!kv) return;
                     const int64_t len = rows == 1 ? 1 : cols;  // a bias is one row of 32 values
                     std::vector<float> out;
                     for (int64_t h = 0; h < 4; ++h)
                       for (int64_t i = 0; i < 16; ++i) {
                         const int64_t src = (h / 2) * 16 + i;
                         out.insert(out.end(), v.begin() + src * len, v.begin() + (src + 1) * len);
                       }
                     v = std::move(out);
                   },
                   {{"qwen2.attention.head_count_kv", 4}});
  expect_close(logits_of(mha), logits_of(test::fixture_path("tiny/qwen2/model-f32.gguf")), 1e-4f);
  auto keep = heads_to_keep({{0.5, 0.1, 0.9, 0.7}, {0.2, 0.8, 0.3, 0.1}}, 4, 4, 0.5);
  ASSERT_TRUE(keep.has_value()) << keep.status().message();
  EXPECT_EQ(*keep, (std::vector<std::vector<int64_t>>{{2, 3}, {1, 2}}));
  auto r = prune_model(mha, dir + "/cut.gguf", {.keep_heads = *keep});
  ASSERT_TRUE(r.has_value()) << r.status().message();
  EXPECT_EQ(r->kv_heads_in, 4);
  EXPECT_EQ(r->kv_heads_out, 2);
  EXPECT_EQ(r->heads_out, 2);
  auto w = load_model(dir + "/cut.gguf");
  ASSERT_TRUE(w.has_value()) << w.status().message();
  EXPECT_EQ((*w)->config.num_kv_heads, 2);
  EXPECT_EQ((*w)->layers[0].bk.size(), 32u);
  const std::string zeroed = edited_qwen2(
      dir + "/zeroed.gguf", [&](const std::string& name, std::vector<float>& v, int64_t rows, int64_t cols) {
        for (size_t l = 0; l < 2; ++l)
          if (name == "blk." + std::to_string(l) + ".attn_output.weight") {
            const std::set<int64_t> gone = complement((*keep)[l], 4);
            zero_columns(v, rows, cols, head_columns({gone.begin(), gone.end()}, 16));
          }
      });
  expect_close(logits_of(dir + "/cut.gguf"), logits_of(zeroed), 1e-4f);
}

TEST(PruneTest, CalibrationFindsTheHeadAndChannelThatAddNothing) {
  // Head 1's columns of O and channel 5's column of down are zero in both layers.
  const std::string dir = test::temp_dir();
  const std::string idle = edited_qwen2(
      dir + "/idle.gguf", [](const std::string& name, std::vector<float>& v, int64_t rows, int64_t cols) {
        if (name.find("attn_output.weight") != std::string::npos)
          zero_columns(v, rows, cols, head_columns({1}, 16));
        if (name.find("ffn_down.weight") != std::string::npos) zero_columns(v, rows, cols, {5});
      });
  auto weights = load_model(idle);
  ASSERT_TRUE(weights.has_value()) << weights.status().message();
  std::vector<int32_t> tokens;
  for (int i = 0; i < 64; ++i) tokens.push_back((i * 37 + 11) % 200);
  ThreadPool pool(2);
  auto imp = structure_importance(**weights, tokens, 32, 0, pool);
  ASSERT_TRUE(imp.has_value()) << imp.status().message();
  ASSERT_EQ(imp->head.size(), 2u);
  ASSERT_EQ(imp->channel.size(), 2u);
  EXPECT_EQ(imp->num_kv_heads, 2);
  for (size_t l = 0; l < 2; ++l) {
    ASSERT_EQ(imp->head[l].size(), 4u);
    ASSERT_EQ(imp->channel[l].size(), 128u);
    for (size_t h = 0; h < 4; ++h) {
      if (h == 1)
        EXPECT_EQ(imp->head[l][h], 0.0);
      else
        EXPECT_GT(imp->head[l][h], 0.0) << l << " " << h;
    }
    for (size_t j = 0; j < 128; ++j) {
      if (j == 5)
        EXPECT_EQ(imp->channel[l][j], 0.0);
      else
        EXPECT_GT(imp->channel[l][j], 0.0) << l << " " << j;
    }
  }
  auto heads = heads_to_keep(imp->head, 4, 2, 0.5);
  ASSERT_TRUE(heads.has_value()) << heads.status().message();
  for (const auto& kept : *heads) {
    ASSERT_EQ(kept.size(), 2u);
    EXPECT_EQ(kept[0], 0);  // group 0 loses head 1
    EXPECT_TRUE(kept[1] == 2 || kept[1] == 3);
  }
  auto channels = channels_to_keep(imp->channel, 0.25);
  ASSERT_TRUE(channels.has_value()) << channels.status().message();
  for (const auto& kept : *channels) {
    EXPECT_EQ(kept.size(), 96u);
    EXPECT_TRUE(std::is_sorted(kept.begin(), kept.end()));
    EXPECT_EQ(std::find(kept.begin(), kept.end(), 5), kept.end());
  }
}

TEST(PruneTest, QuantizedMatricesCopyWholeBlocksAndRoundSplitOnesAgain) {
  const std::string in = test::fixture_path("tiny/qwen2/model-q8_0.gguf");
  const std::string dir = test::temp_dir();
  auto r = prune_model(in, dir + "/cut.gguf", {.keep_heads = kKeepHeads, .keep_channels = keep_channels()});
  ASSERT_TRUE(r.has_value()) << r.status().message();
  // O's columns are cut in heads of 16 values and down's in single channels: Q8_0 blocks of 32
  // are split, so both are rounded again, per layer.
  EXPECT_EQ(r->requantized, 4);
  auto a = GgufFile::open(in);
  auto b = GgufFile::open(dir + "/cut.gguf");
  ASSERT_TRUE(a.has_value() && b.has_value());
  const auto ta = by_name(*a), tb = by_name(*b);
  // Rows of Q (layer 1 keeps heads 1 and 2: rows 16-47) and of gate are whole: copied byte for byte.
  const std::pair<std::string, std::vector<int64_t>> copied[] = {
      {"blk.1.attn_q.weight", {16, 17, 47}}, {"blk.0.ffn_gate.weight", keep_channels()[0]}};
  for (const auto& [name, rows] : copied) {
    const TensorView* s = ta.at(name);
    const TensorView* d = tb.at(name);
    EXPECT_EQ(d->dtype, DType::kQ8_0);
    const auto row = static_cast<size_t>(dtype_bytes(s->dtype, s->row_length()));
    const std::vector<int64_t> at =
        name == "blk.1.attn_q.weight" ? std::vector<int64_t>{0, 1, 31} : std::vector<int64_t>{0, 1, 95};
    for (size_t i = 0; i < at.size(); ++i) {
      const auto src =
          static_cast<size_t>(name == "blk.1.attn_q.weight" ? rows[i] : rows[static_cast<size_t>(at[i])]);
      EXPECT_EQ(std::memcmp(d->data + static_cast<size_t>(at[i]) * row, s->data + src * row, row), 0)
          << name << " row " << at[i];
    }
  }
  EXPECT_EQ(tb.at("blk.0.ffn_down.weight")->dtype, DType::kQ8_0);
  EXPECT_EQ(tb.at("blk.0.ffn_down.weight")->row_length(), 96);
  // The rounded model stays close to the f32 cut of the same model.
  ASSERT_TRUE(prune_model(test::fixture_path("tiny/qwen2/model-f32.gguf"), dir + "/cut32.gguf",
                          {.keep_heads = kKeepHeads, .keep_channels = keep_channels()})
                  .has_value());
  const std::vector<float> q = logits_of(dir + "/cut.gguf"), f = logits_of(dir + "/cut32.gguf");
  ASSERT_EQ(q.size(), f.size());
  double err = 0, norm = 0;
  for (size_t i = 0; i < q.size(); ++i) {
    err += (q[i] - f[i]) * (q[i] - f[i]);
    norm += f[i] * f[i];
  }
  EXPECT_LT(std::sqrt(err / norm), 0.05);
}

TEST(PruneTest, AHuggingFaceDirectoryIsWrittenAsSafetensors) {
  const std::string dir = test::temp_dir();
  const PrunePlan plan{.drop_layers = {1}, .keep_heads = kKeepHeads, .keep_channels = keep_channels()};
  auto r = prune_model(test::fixture_path("tiny/qwen2"), dir + "/hf", plan);
  ASSERT_TRUE(r.has_value()) << r.status().message();
  EXPECT_EQ(r->layers_out, 1);
  auto g = prune_model(test::fixture_path("tiny/qwen2/model-f32.gguf"), dir + "/g.gguf", plan);
  ASSERT_TRUE(g.has_value()) << g.status().message();
  EXPECT_EQ(r->tensors_out, g->tensors_out);
  auto w = load_model(dir + "/hf");
  ASSERT_TRUE(w.has_value()) << w.status().message();
  EXPECT_EQ((*w)->config.num_layers, 1);
  EXPECT_EQ((*w)->config.num_heads, 2);
  EXPECT_EQ((*w)->config.head_dim, 16);
  EXPECT_EQ((*w)->config.intermediate_size, 96);
  // The same model as the GGUF cut (the fixture's GGUF and safetensors hold the same weights).
  expect_close(logits_of(dir + "/hf"), logits_of(dir + "/g.gguf"), 1e-4f);
  EXPECT_TRUE(std::filesystem::exists(dir + "/hf/generation_config.json"));
}

TEST(PruneTest, HeadAndChannelRefusalsNameTheProblem) {
  const std::vector<std::vector<double>> scores = {{1, 2, 3, 4}, {4, 3, 2, 1}};
  for (double ratio : {0.0, 1.0, 0.2, -0.5}) {  // 0.2 of a group of 2 removes none
    auto r = heads_to_keep(scores, 4, 2, ratio);
    ASSERT_FALSE(r.has_value()) << ratio;
    EXPECT_NE(r.status().message().find("--prune-heads"), std::string::npos) << r.status().message();
  }
  EXPECT_FALSE(heads_to_keep(scores, 4, 3, 0.5).has_value());  // no equal groups
  const std::vector<std::vector<double>> channels(2, std::vector<double>(128, 1.0));
  for (double ratio : {0.0, 0.1, 0.9, 1.0}) {  // 0.1 keeps all 128, 0.9 keeps none (multiples of 32)
    auto r = channels_to_keep(channels, ratio);
    ASSERT_FALSE(r.has_value()) << ratio;
    EXPECT_NE(r.status().message().find("--prune-ffn"), std::string::npos) << r.status().message();
  }
  const std::string in = test::fixture_path("tiny/qwen2/model-f32.gguf");
  const std::string dir = test::temp_dir();
  const std::pair<PrunePlan, const char*> bad[] = {
      {{.keep_heads = {{0, 1, 2}, {0, 1, 2}}}, "unequal numbers of query heads"},
      {{.keep_heads = {{0, 2}, {0, 1, 2, 3}}}, "as many heads"},
      {{.keep_heads = {{0, 2}}}, "each of the model's 2 layers"},
      {{.keep_heads = {{2, 0}, {0, 2}}}, "not distinct heads"},
      {{.keep_channels = {{0, 1}, {0}}}, "as many channels"},
      {{.keep_channels = {{0, 200}, {0, 1}}}, "not distinct channels"},
  };
  for (const auto& [plan, needle] : bad) {
    auto r = prune_model(in, dir + "/x.gguf", plan);
    ASSERT_FALSE(r.has_value()) << needle;
    EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().message();
  }
  auto moe = prune_model(test::fixture_path("tiny/qwen2_moe/model-f32.gguf"), dir + "/m.gguf",
                         {.keep_channels = {{0, 1}, {0, 1}}});
  ASSERT_FALSE(moe.has_value());
  EXPECT_NE(moe.status().message().find("mixture-of-experts"), std::string::npos) << moe.status().message();
}

}  // namespace
}  // namespace inferd
