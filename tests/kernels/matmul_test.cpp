#include "kernels/matmul.h"

#include <gtest/gtest.h>

#include <random>

#include "test_support.h"

namespace inferd {
namespace {

struct Shape {
  int64_t tokens, n, k;
};

// Random shapes, including odd ones; k must be a multiple of the dtype's block.
TEST(MatmulTest, MatchesScalarReferenceForEveryDtype) {
  ThreadPool pool(3);
  std::mt19937 rng(1234);
  for (DType dtype :
       {DType::kF32,    DType::kF16,     DType::kBF16,  DType::kQ4_0,    DType::kQ4_1,  DType::kQ5_0,
        DType::kQ5_1,   DType::kQ8_0,    DType::kQ4_K,  DType::kQ5_K,    DType::kQ6_K,  DType::kIQ4_NL,
        DType::kIQ4_XS, DType::kQ2_K,    DType::kQ3_K,  DType::kIQ3_XXS, DType::kIQ3_S, DType::kIQ2_S,
        DType::kIQ2_XS, DType::kIQ2_XXS, DType::kIQ1_S, DType::kIQ1_M,   DType::kTQ1_0, DType::kTQ2_0}) {
    const int64_t block = dtype_info(dtype).block_values;
    for (Shape s : {Shape{1, 1, 1}, Shape{1, 7, 3}, Shape{3, 17, 5}, Shape{5, 33, 2}, Shape{13, 9, 1}}) {
      const int64_t k = s.k * (block == 1 ? 37 : block);
      SCOPED_TRACE(std::string(dtype_info(dtype).name) + " T=" + std::to_string(s.tokens) +
                   " N=" + std::to_string(s.n) + " K=" + std::to_string(k));
      std::vector<std::byte> storage;
      TensorView w = test::random_tensor(dtype, s.n, k, rng, &storage);
      auto x = test::random_floats(static_cast<size_t>(s.tokens * k), rng);
      auto bias = test::random_floats(static_cast<size_t>(s.n), rng);
      std::vector<float> got(static_cast<size_t>(s.tokens * s.n)), want(got.size());
      matmul(x.data(), s.tokens, w, bias.data(), got.data(), pool);
      matmul_reference(x.data(), s.tokens, w, bias.data(), want.data());
      EXPECT_LT(test::relative_max_error(got.data(), want.data(), got.size()), 2e-6);
    }
  }
}

// Batch invariance: a row's result does not depend on the other rows or the thread count.
TEST(MatmulTest, RowResultsIndependentOfBatchAndThreads) {
  std::mt19937 rng(99);
  std::vector<std::byte> storage;
  TensorView w = test::random_tensor(DType::kQ4_1, 45, 96, rng, &storage);
  auto x = test::random_floats(9 * 96, rng);
  std::vector<float> batched(9 * 45);
  ThreadPool pool4(4);
  matmul(x.data(), 9, w, nullptr, batched.data(), pool4);
  ThreadPool pool1(1);
  for (int64_t t = 0; t < 9; ++t) {
    std::vector<float> alone(45);
    matmul(x.data() + t * 96, 1, w, nullptr, alone.data(), pool1);
    for (int64_t n = 0; n < 45; ++n)
      ASSERT_EQ(alone[static_cast<size_t>(n)], batched[static_cast<size_t>(t * 45 + n)]);
  }
}

TEST(MatmulTest, DotHandlesTails) {
  std::mt19937 rng(5);
  for (int64_t n : {0, 1, 15, 16, 17, 31, 100}) {
    auto a = test::random_floats(static_cast<size_t>(n), rng);
    auto b = test::random_floats(static_cast<size_t>(n), rng);
    double ref = 0;
    for (int64_t i = 0; i < n; ++i)
      ref += static_cast<double>(a[static_cast<size_t>(i)]) * b[static_cast<size_t>(i)];
    EXPECT_NEAR(dot_f32(a.data(), b.data(), n), ref, 1e-5) << n;
  }
}

}  // namespace
}  // namespace inferd
