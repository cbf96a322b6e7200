// The CUDA backend on a GPU (built with -DINFERD_CUDA=ON; scripts/gpu-check runs it on the lent
// GPU machine, never the default suite). A missing device fails the run with the runtime's reason.
// The op-level checks against scalar references are backend_ops_test, which takes the CUDA
// backend in where a device answers; this file adds what only the GPU has: a device present,
// batch invariance of our own kernels (Q8_0 W8A8, paged attention), and whole models' logits
// against the CPU's on the tiny fixtures, with prefill, chunked prefill and batching.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <random>

#include "kernels/backend.h"
#include "kv/kv_cache.h"
#include "model/model_loader.h"
#include "model/model_test_util.h"
#include "model/transformer.h"
#include "test_support.h"

namespace inferd {
namespace {

// Every test needs the device: without one it fails here with the runtime's reason (before a
// Transformer would stop the process on it).
#define REQUIRE_DEVICE()                             \
  do {                                               \
    const Status device = cuda_backend_available();  \
    ASSERT_TRUE(device.is_ok()) << device.message(); \
  } while (0)

std::unique_ptr<Backend> cuda_backend(ThreadPool& pool) {
  auto b = make_backend(BackendKind::kCuda, active_isa(), pool);
  EXPECT_TRUE(b.has_value()) << b.status().message();
  return b ? std::move(b).value() : nullptr;
}

TEST(CudaBackendTest, ADeviceAnswers) {
  REQUIRE_DEVICE();
}

// Each token's row of a Q8_0 linear is the same bits whether it runs alone or among 17.
TEST(CudaBackendTest, Q8LinearIsBatchInvariant) {
  REQUIRE_DEVICE();
  std::mt19937 rng(21);
  ThreadPool pool(2);
  auto b = cuda_backend(pool);
  ASSERT_NE(b, nullptr);
  const int64_t rows = 67, cols = 160, tokens = 17;
  std::vector<std::byte> storage;
  const TensorView w = test::random_tensor(DType::kQ8_0, rows, cols, rng, &storage);
  const TensorView* parts[] = {&w};
  auto prepared = b->prepare_linear(parts, false);
  const std::vector<float> x = test::random_floats(static_cast<size_t>(tokens * cols), rng);
  std::vector<float> all(static_cast<size_t>(tokens * rows));
  const LinearOutput out{all.data(), rows, nullptr};
  b->linear(x.data(), tokens, cols, nullptr, 0.0f, *prepared, {&out, 1});
  for (int64_t t = 0; t < tokens; ++t) {
    std::vector<float> one(static_cast<size_t>(rows));
    const LinearOutput o{one.data(), rows, nullptr};
    b->linear(x.data() + t * cols, 1, cols, nullptr, 0.0f, *prepared, {&o, 1});
    EXPECT_TRUE(std::equal(one.begin(), one.end(), all.begin() + t * rows)) << "token " << t;
  }
}

// A decode token's attention is the same bits alone and beside a prefill of another sequence.
TEST(CudaBackendTest, AttentionIsBatchInvariant) {
  REQUIRE_DEVICE();
  std::mt19937 rng(4);
  ThreadPool pool(2);
  auto b = cuda_backend(pool);
  ASSERT_NE(b, nullptr);
  const AttentionShape shape{8, 2, 64, 0.125f};
  const int64_t kv_dim = shape.num_kv_heads * shape.head_dim, q_dim = shape.num_heads * shape.head_dim;
  const int64_t block = 16;
  // K in rows, as the engine makes this backend's caches (with K in groups it takes the CPU kernel).
  KvCache cache(1, 64, block, kv_dim, KvDType::kF16, shape.head_dim, b->reads_key_groups());
  ASSERT_FALSE(cache.key_groups());
  for (int64_t slot = 0; slot < 64 * block; ++slot) {
    const std::vector<float> k = test::random_floats(static_cast<size_t>(kv_dim), rng);
    const std::vector<float> v = test::random_floats(static_cast<size_t>(kv_dim), rng);
    cache.write(0, slot, k.data(), v.data());
  }
  const std::vector<int32_t> table_a = {5, 9, 2, 40, 41, 7, 33};  // 100 positions
  const std::vector<int32_t> table_b = {12, 13, 60};              // a 37-token prompt
  const std::vector<float> q = test::random_floats(static_cast<size_t>(38 * q_dim), rng);
  const std::vector<AttentionSequence> both = {{0, 1, 100, table_a}, {1, 37, 37, table_b}};
  std::vector<int32_t> token_seq(38, 1);
  token_seq[0] = 0;
  std::vector<float> together(static_cast<size_t>(38 * q_dim));
  b->attention(q.data(), both, token_seq, cache.layer_view(0), shape, together.data());
  const std::vector<AttentionSequence> alone = {{0, 1, 100, table_a}};
  const std::vector<int32_t> one_seq = {0};
  std::vector<float> single(static_cast<size_t>(q_dim));
  b->attention(q.data(), alone, one_seq, cache.layer_view(0), shape, single.data());
  EXPECT_TRUE(std::equal(single.begin(), single.end(), together.begin()));
  // And it agrees with the CPU kernel.
  std::vector<float> cpu(single.size());
  paged_attention(q.data(), alone, one_seq, cache.layer_view(0), shape, cpu.data(), pool);
  EXPECT_LT(test::relative_max_error(single.data(), cpu.data(), cpu.size()), 1e-4);
}

struct ModelCase {
  const char* path;  // under tests/fixtures/tiny
  double bound;      // max |cuda - cpu f32 path| / max |cpu|
};

// Whole models on the GPU against the CPU's f32 path on the same file: every position of several
// prompts, whole, chunked and batched, with an f16 KV cache.
TEST(CudaBackendTest, ModelLogitsMatchTheCpu) {
  REQUIRE_DEVICE();
  ThreadPool pool(2);
  const std::vector<std::vector<int32_t>> prompts = {
      {1, 5, 9, 14, 2, 7, 33, 8, 21, 3, 17, 4, 40, 11, 6, 29, 19, 12, 10},
      {2, 8, 31, 7},
      {9, 9, 9, 13, 1, 22, 15, 37, 5, 30, 27, 18, 16, 24, 26, 35, 34, 20, 28, 23, 25, 36, 32, 39, 38}};
  // F32 exact but for summation order; F16 / BF16: activations rounded to the weights' type for
  // cuBLAS; Q8_0: int8 activations (the CPU default path's own bound against f32 is 5e-2).
  const ModelCase cases[] = {{"llama_tied", 1e-4},
                             {"qwen2", 1e-4},
                             {"qwen3", 1e-4},
                             {"qwen2_bf16", 2e-2},
                             {"qwen2/model-f16.gguf", 1e-2},
                             {"qwen2/model-q8_0.gguf", 5e-2},
                             {"qwen3_moe", 1e-4}};
  for (const ModelCase& c : cases) {
    auto weights = load_model(test::fixture_path(std::string("tiny/") + c.path));
    ASSERT_TRUE(weights.has_value()) << weights.status().message();
    Transformer cpu(**weights, pool, {.backend = BackendKind::kF32});
    Transformer gpu(**weights, pool, {.backend = BackendKind::kCuda});
    const auto want = test::all_logits(cpu, prompts, 0, false, 16, KvDType::kF16);
    for (auto [chunk, together] : {std::pair<int64_t, bool>{0, false}, {5, true}, {0, true}}) {
      const auto got = test::all_logits(gpu, prompts, chunk, together, 16, KvDType::kF16);
      ASSERT_EQ(got.size(), want.size()) << c.path;
      const double e = test::relative_max_error(got.data(), want.data(), want.size());
      std::printf("[ figures  ] %s chunk %lld%s: max |cuda - cpu| / max |cpu| = %.3g (bound %.0e)\n", c.path,
                  static_cast<long long>(chunk), together ? " batched" : "", e, c.bound);
      EXPECT_LT(e, c.bound) << c.path << " chunk " << chunk << (together ? " batched" : "");
    }
  }
}

}  // namespace
}  // namespace inferd
