// Pipeline parallelism's math without MPI: the stages are threads of this process joined by
// in-memory mailboxes, each with its own layers of a tiny fixture (model/pipeline_parallel.h).
// Every kernel is batch-invariant, so stage 0's logits must equal one process's bit for bit,
// whatever the micro-batches cut; the MPI transport is tested end to end in
// tests/e2e/test_tensor_parallel.py.
#include "model/pipeline_parallel.h"

#include <gtest/gtest.h>

#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <thread>
#include <tuple>

#include "model/model_loader.h"
#include "model/transformer.h"
#include "model_test_util.h"
#include "test_support.h"
#include "thread_groups.h"

namespace inferd {
namespace {

using test::Mailboxes;
using test::SharedGroup;
using test::ThreadGroup;
using test::ThreadPipeline;

std::vector<std::vector<int32_t>> prompts(uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::vector<int32_t>> out;
  for (int len : {71, 40, 9, 33}) {
    std::vector<int32_t> p;
    for (int i = 0; i < len; ++i) p.push_back(static_cast<int32_t>(rng() % 256));
    out.push_back(p);
  }
  return out;
}

// Rank 0's logits of `ps` on `stages` stages of `tensor` ranks each of `path`, `chunk` tokens per
// sequence and step: thread (s, r) holds stage s's layers, sliced for tensor rank r.
std::vector<float> grid_logits(const std::string& path, int tensor, int stages,
                               const std::vector<std::vector<int32_t>>& ps, int64_t chunk) {
  std::vector<std::unique_ptr<SharedGroup>> stage_groups;  // the tensor ranks of each stage
  for (int s = 0; s < stages; ++s) stage_groups.push_back(std::make_unique<SharedGroup>(tensor));
  std::vector<Mailboxes> lanes(static_cast<size_t>(tensor));  // each tensor rank's pipeline
  std::vector<std::vector<float>> out(static_cast<size_t>(tensor * stages));
  std::vector<std::thread> threads;
  for (int s = 0; s < stages; ++s) {
    for (int r = 0; r < tensor; ++r) {
      threads.emplace_back([&, s, r] {
        auto fail = [&](const Status& st) {
          std::fprintf(stderr, "stage %d rank %d: %s\n", s, r, st.message().c_str());
          std::abort();  // the others would wait for it
        };
        auto w = load_model(path);
        if (!w) fail(w.status());
        auto stage = plan_pipeline_stage(**w, s, stages);
        if (!stage) fail(stage.status());
        if (Status st = pipeline_weights(**w, *stage); !st.is_ok()) fail(st);
        auto shard = plan_tensor_shard(**w, r, tensor);
        if (!shard) fail(shard.status());
        if (Status st = shard_weights(**w, *shard); !st.is_ok()) fail(st);
        ThreadPool pool(1);
        Transformer model(**w, pool);
        ThreadGroup group(*stage_groups[static_cast<size_t>(s)], r);
        ThreadPipeline pipeline(lanes[static_cast<size_t>(r)], s, stages);
        if (Status st = model.set_tensor_parallel(&group); !st.is_ok()) fail(st);
        if (Status st = model.set_pipeline(&pipeline); !st.is_ok()) fail(st);
        out[static_cast<size_t>(s * tensor + r)] = test::all_logits(model, ps, chunk, true);
      });
    }
  }
  for (auto& t : threads) t.join();
  return out[0];
}

std::vector<float> staged_logits(const std::string& path, int stages,
                                 const std::vector<std::vector<int32_t>>& ps, int64_t chunk) {
  return grid_logits(path, 1, stages, ps, chunk);
}

class PipelineParallelTest : public ::testing::TestWithParam<std::string> {};

TEST_P(PipelineParallelTest, StageZerosLogitsEqualOneProcessBitForBit) {
  const std::string path = test::fixture_path("tiny/" + GetParam());
  auto whole = load_model(path);
  ASSERT_TRUE(whole.has_value()) << whole.status().message();
  ThreadPool pool(1);
  Transformer model(**whole, pool);
  // chunk 0: every prompt whole in one step (153 tokens: 4 micro-batches that cut through
  // sequences); 16: several steps of 64 tokens (2 micro-batches); 3: steps of 12 (one).
  for (int64_t chunk : {0, 16, 3}) {
    const auto ps = prompts(static_cast<uint64_t>(chunk) + 1);
    const std::vector<float> want = test::all_logits(model, ps, chunk, true);
    const std::vector<float> got = staged_logits(path, 2, ps, chunk);
    ASSERT_EQ(got.size(), want.size());
    EXPECT_EQ(got, want) << "chunk " << chunk;
  }
}

INSTANTIATE_TEST_SUITE_P(Tiny, PipelineParallelTest,
                         ::testing::Values("qwen2", "qwen2/model-q8_0.gguf", "qwen3", "qwen3/model-f16.gguf",
                                           "llama_tied", "llama_untied", "qwen2_bf16", "qwen2_moe",
                                           "qwen2_moe/model-q8_0.gguf", "qwen3_moe"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (auto& ch : n)
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return n;
                         });

// Tensor and pipeline parallelism together: two stages of two tensor ranks each give the logits
// of two tensor ranks alone, bit for bit (each stage sums its partial results in the same order;
// the stages only cut the rows).
class GridParallelTest : public ::testing::TestWithParam<std::string> {};

TEST_P(GridParallelTest, TwoStagesOfTwoRanksEqualTwoRanksBitForBit) {
  const std::string path = test::fixture_path("tiny/" + GetParam());
  for (int64_t chunk : {0, 16}) {
    const auto ps = prompts(static_cast<uint64_t>(chunk) + 7);
    const std::vector<float> want = grid_logits(path, 2, 1, ps, chunk);
    ASSERT_FALSE(want.empty());
    const std::vector<float> got = grid_logits(path, 2, 2, ps, chunk);
    ASSERT_EQ(got.size(), want.size());
    EXPECT_EQ(got, want) << "chunk " << chunk;
  }
}

INSTANTIATE_TEST_SUITE_P(Tiny, GridParallelTest,
                         ::testing::Values("qwen2", "qwen3/model-f16.gguf", "llama_tied", "qwen2_bf16",
                                           "qwen3_moe"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (auto& ch : n)
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return n;
                         });

TEST(PipelinePlanTest, StagesCoverTheLayersOnceBalancedByBytes) {
  auto w = load_model(test::fixture_path("tiny/qwen2"));
  ASSERT_TRUE(w.has_value());
  const int64_t layers = (*w)->config.num_layers;
  auto a = plan_pipeline_stage(**w, 0, 2), b = plan_pipeline_stage(**w, 1, 2);
  ASSERT_TRUE(a.has_value() && b.has_value());
  EXPECT_EQ(a->layer_begin, 0);
  EXPECT_EQ(a->layer_end, b->layer_begin);
  EXPECT_EQ(b->layer_end, layers);
  EXPECT_TRUE(a->first() && !a->last() && b->last());
  EXPECT_FALSE(plan_pipeline_stage(**w, 0, static_cast<int>(layers) + 1).has_value())
      << "a stage with no layer";
  ASSERT_TRUE(pipeline_weights(**w, *b).is_ok());
  EXPECT_EQ((*w)->config.num_layers, layers - b->layer_begin);
  EXPECT_FALSE(pipeline_weights(**w, *b).is_ok()) << "split twice";
  auto moe = load_model(test::fixture_path("tiny/qwen2_moe"));  // its experts weigh with their layers
  ASSERT_TRUE(moe.has_value());
  auto m0 = plan_pipeline_stage(**moe, 0, 2);
  ASSERT_TRUE(m0.has_value()) << m0.status().message();
  EXPECT_EQ(m0->layer_end, 1);
}

// A 24-layer model whose vocabulary projection weighs as much as 8 layers: the last stage gets
// fewer layers so that both read about as many bytes.
TEST(PipelinePlanTest, TheLastStageCarriesTheVocabularyProjection) {
  ModelWeights w;
  w.config.num_layers = 24;
  w.layers.resize(24);
  for (auto& l : w.layers) l.wq.num_bytes = 100;
  w.lm_head.num_bytes = 800;
  auto a = plan_pipeline_stage(w, 0, 2);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->layer_end, 16);  // 1,600 bytes each side
}

TEST(PipelinePlanTest, MicroBatchesSplitEvenlyWithAFloor) {
  std::mt19937_64 rng(3);
  for (int i = 0; i < 200; ++i) {
    const auto n = static_cast<int64_t>(1 + rng() % 2000);
    const auto floor = static_cast<int64_t>(1 + rng() % 100), cap = static_cast<int64_t>(1 + rng() % 70);
    const MicroBatchPlan p = plan_micro_batches(n, floor, cap);
    ASSERT_GE(p.count, 1);
    ASSERT_LE(p.count, std::min<int64_t>(cap, 64));
    EXPECT_EQ(p.bounds[0], 0);
    EXPECT_EQ(p.bounds[p.count], n);
    for (int64_t m = 0; m < p.count; ++m) {
      const int64_t size = p.bounds[m + 1] - p.bounds[m];
      EXPECT_GE(size, 1);
      if (p.count > 1) {
        EXPECT_GE(size, floor - 1) << n << " " << floor << " " << cap;
      }
    }
  }
}

}  // namespace
}  // namespace inferd
