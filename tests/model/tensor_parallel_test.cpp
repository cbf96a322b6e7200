// Tensor parallelism's math without MPI: the ranks are threads of this process joined by an
// in-memory group, each with its own slice of a tiny fixture (model/tensor_parallel.h). Their
// logits must equal one process's within the rounding of summing partial results in another
// order; the MPI transport itself is tested end to end in tests/e2e/test_tensor_parallel.py.
#include <gtest/gtest.h>

#include <thread>

#include "model/model_loader.h"
#include "model/tensor_parallel.h"
#include "model/transformer.h"
#include "model_test_util.h"
#include "test_support.h"
#include "thread_groups.h"

namespace inferd {
namespace {

using test::SharedGroup;
using test::ThreadGroup;

const std::vector<std::vector<int32_t>> kPrompts = {
    {1, 5, 9, 14, 2, 7, 33, 4, 8}, {3, 3, 60, 12, 5}, {11, 2, 6, 40, 9, 1, 17}};

// Rank 0's logits of kPrompts on `ranks` slices of `path`, in chunks of 3 tokens, all prompts
// batched together.
std::vector<float> split_logits(const std::string& path, int ranks,
                                std::vector<TensorShard>* shards = nullptr) {
  SharedGroup shared(ranks);
  std::vector<std::vector<float>> out(static_cast<size_t>(ranks));
  std::vector<std::thread> threads;
  if (shards) shards->resize(static_cast<size_t>(ranks));
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      auto fail = [&](const Status& s) {
        std::fprintf(stderr, "rank %d: %s\n", r, s.message().c_str());
        std::abort();  // the other ranks would wait at the barrier forever
      };
      auto w = load_model(path);
      if (!w) fail(w.status());
      auto shard = plan_tensor_shard(**w, r, ranks);
      if (!shard) fail(shard.status());
      if (shards) (*shards)[static_cast<size_t>(r)] = *shard;
      if (Status s = shard_weights(**w, *shard); !s.is_ok()) fail(s);
      ThreadPool pool(1);
      Transformer model(**w, pool);
      ThreadGroup group(shared, r);
      if (Status s = model.set_tensor_parallel(&group); !s.is_ok()) fail(s);
      out[static_cast<size_t>(r)] = test::all_logits(model, kPrompts, 3, true);
    });
  }
  for (auto& t : threads) t.join();
  return out[0];
}

struct SplitCase {
  std::string file;  // under tests/fixtures/tiny
  int ranks;
};

class TensorParallelTest : public ::testing::TestWithParam<SplitCase> {};

TEST_P(TensorParallelTest, RankZerosLogitsEqualOneProcess) {
  const std::string path = test::fixture_path("tiny/" + GetParam().file);
  auto whole = load_model(path);
  ASSERT_TRUE(whole.has_value()) << whole.status().message();
  ThreadPool pool(1);
  Transformer model(**whole, pool);
  const std::vector<float> want = test::all_logits(model, kPrompts, 3, true);
  ASSERT_FALSE(want.empty());
  const std::vector<float> got = split_logits(path, GetParam().ranks);
  ASSERT_EQ(got.size(), want.size());
  const double err = test::relative_max_error(got.data(), want.data(), got.size());
  std::printf("[ figures  ]   %s on %d ranks: max |diff| / max |logit| = %.2e\n", GetParam().file.c_str(),
              GetParam().ranks, err);
  EXPECT_LT(err, 1e-5);
  // Greedy choices are the same at every position.
  const auto vocab = static_cast<size_t>((*whole)->config.vocab_size);
  for (size_t p = 0; p < want.size() / vocab; ++p) {
    const auto row = [&](const std::vector<float>& v) {
      return std::max_element(v.begin() + static_cast<std::ptrdiff_t>(p * vocab),
                              v.begin() + static_cast<std::ptrdiff_t>((p + 1) * vocab)) -
             v.begin();
    };
    EXPECT_EQ(row(got), row(want)) << "position " << p;
  }
}

INSTANTIATE_TEST_SUITE_P(Tiny, TensorParallelTest,
                         ::testing::Values(SplitCase{"qwen2", 2}, SplitCase{"qwen2/model-q8_0.gguf", 2},
                                           SplitCase{"qwen3", 2}, SplitCase{"qwen3/model-f16.gguf", 2},
                                           SplitCase{"llama_untied", 2}, SplitCase{"llama_tied", 2},
                                           SplitCase{"qwen2_bf16", 2}, SplitCase{"qwen2_moe", 2},
                                           SplitCase{"qwen2_moe/model-f32.gguf", 2},
                                           SplitCase{"qwen3_moe", 2}),
                         [](const auto& info) {
                           std::string n = info.param.file + "_" + std::to_string(info.param.ranks);
                           for (auto& ch : n)
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return n;
                         });

// Every rank's slice covers the model once: heads, channels and vocabulary rows without gaps.
TEST(TensorParallelPlanTest, SlicesCoverTheModelAndRefuseWhatCannotSplit) {
  auto w = load_model(test::fixture_path("tiny/qwen2/model-q8_0.gguf"));
  ASSERT_TRUE(w.has_value());
  const ModelConfig& c = (*w)->config;
  int64_t kv = 0, inter = 0, vocab = 0;
  for (int r = 0; r < 2; ++r) {
    auto s = plan_tensor_shard(**w, r, 2);
    ASSERT_TRUE(s.has_value()) << s.status().message();
    EXPECT_EQ(s->kv_head_begin, kv);
    EXPECT_EQ(s->inter_begin, inter);
    EXPECT_EQ(s->vocab_begin, vocab);
    EXPECT_EQ(s->inter_begin % 32, 0) << "a Q8_0 down projection splits on whole blocks";
    kv = s->kv_head_end, inter = s->inter_end, vocab = s->vocab_end;
  }
  EXPECT_EQ(kv, c.num_kv_heads);
  EXPECT_EQ(inter, c.intermediate_size);
  EXPECT_EQ(vocab, c.vocab_size);
  auto too_many = plan_tensor_shard(**w, 0, static_cast<int>(c.num_kv_heads) + 1);
  ASSERT_FALSE(too_many.has_value());
  EXPECT_NE(too_many.status().message().find("KV heads"), std::string::npos);
  // A MoE model: every expert's channels and the shared expert's split as the dense MLP's do.
  auto moe = load_model(test::fixture_path("tiny/qwen2_moe"));
  ASSERT_TRUE(moe.has_value());
  const ModelConfig& mc = (*moe)->config;
  int64_t expert = 0, shared = 0;
  for (int rank = 0; rank < 2; ++rank) {
    auto s = plan_tensor_shard(**moe, rank, 2);
    ASSERT_TRUE(s.has_value()) << s.status().message();
    EXPECT_EQ(s->moe_inter_begin, expert);
    EXPECT_EQ(s->shared_inter_begin, shared);
    EXPECT_LT(s->moe_inter_begin, s->moe_inter_end);
    expert = s->moe_inter_end, shared = s->shared_inter_end;
  }
  EXPECT_EQ(expert, mc.moe_intermediate_size);
  EXPECT_EQ(shared, mc.shared_expert_intermediate_size);
  // Its Q8_0 file: 32 expert channels are one block of 32, which two ranks cannot share.
  auto q8 = load_model(test::fixture_path("tiny/qwen2_moe/model-q8_0.gguf"));
  ASSERT_TRUE(q8.has_value());
  auto refused = plan_tensor_shard(**q8, 0, 2);
  ASSERT_FALSE(refused.has_value());
  EXPECT_NE(refused.status().message().find("32 expert intermediate channels do not split into 2"),
            std::string::npos)
      << refused.status().message();
}

}  // namespace
}  // namespace inferd
