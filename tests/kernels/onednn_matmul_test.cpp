// The oneDNN path (`--matmul onednn`): against the double-precision product, for the shapes the
// model uses (Q/K/V parts with biases, SwiGLU), odd sizes and any number of slices; and a whole
// BF16 model on it near the f32 path. Skipped in builds without oneDNN.
#include "kernels/onednn_matmul.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "common/half.h"
#include "model/model_loader.h"
#include "model/model_test_util.h"
#include "model/transformer.h"
#include "tensor/dequantize.h"
#include "test_support.h"

namespace inferd {
namespace {

// oneDNN is optional at build time, but scripts/setup installs it: where prerequisites are
// required (CI, scripts/test) a build without it fails these tests.
#define SKIP_WITHOUT_ONEDNN() INFERD_REQUIRE_OR_SKIP(OneDnnWeight::available(), "built without oneDNN")

// y[t, r] in double from the stored weights and x (rounded to bf16 first for BF16 weights that run
// as BF16).
std::vector<double> product(const TensorView& w, const std::vector<float>& x, int64_t tokens,
                            const float* bias) {
  return test::double_product(w, x, tokens, bias, w.dtype == DType::kBF16 && OneDnnWeight::bf16_native());
}

void expect_near(const float* got, const std::vector<double>& want, int64_t tokens, int64_t rows, int64_t ld,
                 int64_t first_row, int64_t total_rows) {
  double mag = 1.0;
  for (double v : want) mag = std::max(mag, std::fabs(v));
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t r = 0; r < rows; ++r)
      ASSERT_NEAR(got[t * ld + r], want[static_cast<size_t>(t * total_rows + first_row + r)], 1e-5 * mag)
          << "t=" << t << " r=" << r;
}

TEST(OneDnnMatmulTest, PartsWithBiasesMatchTheProduct) {
  SKIP_WITHOUT_ONEDNN();
  ThreadPool pool(3);
  std::mt19937 rng(5);
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (int slices : {1, 2, 3}) {
      for (int64_t tokens : {1, 7, 40}) {
        const int64_t k = 37;
        SCOPED_TRACE(std::string(dtype_info(dtype).name) + " slices=" + std::to_string(slices) +
                     " T=" + std::to_string(tokens));
        std::vector<std::byte> sq, sk, sv;
        TensorView q = test::random_tensor(dtype, 33, k, rng, &sq);
        TensorView kk = test::random_tensor(dtype, 5, k, rng, &sk);
        TensorView v = test::random_tensor(dtype, 17, k, rng, &sv);
        const TensorView* parts[] = {&q, &kk, &v};
        auto w = OneDnnWeight::create(parts, false, slices);
        ASSERT_TRUE(w.has_value()) << w.status().message();
        auto x = test::random_floats(static_cast<size_t>(tokens * k), rng);
        auto bq = test::random_floats(33, rng), bv = test::random_floats(17, rng);
        std::vector<float> yq(static_cast<size_t>(tokens * 33)), yk(static_cast<size_t>(tokens * 5)),
            yv(static_cast<size_t>(tokens * 17));
        const QuantMatmulOutput out[3] = {
            {yq.data(), 33, bq.data()}, {yk.data(), 5, nullptr}, {yv.data(), 17, bv.data()}};
        w->run(x.data(), tokens, out, pool);
        expect_near(yq.data(), product(q, x, tokens, bq.data()), tokens, 33, 33, 0, 33);
        expect_near(yk.data(), product(kk, x, tokens, nullptr), tokens, 5, 5, 0, 5);
        expect_near(yv.data(), product(v, x, tokens, bv.data()), tokens, 17, 17, 0, 17);
      }
    }
  }
}

TEST(OneDnnMatmulTest, SwigluIsSiluOfGateTimesUp) {
  SKIP_WITHOUT_ONEDNN();
  ThreadPool pool(2);
  std::mt19937 rng(8);
  const int64_t rows = 45, k = 64, tokens = 9;
  std::vector<std::byte> sg, su;
  TensorView gate = test::random_tensor(DType::kBF16, rows, k, rng, &sg);
  TensorView up = test::random_tensor(DType::kBF16, rows, k, rng, &su);
  const TensorView* parts[] = {&gate, &up};
  auto w = OneDnnWeight::create(parts, true, 2);
  ASSERT_TRUE(w.has_value()) << w.status().message();
  auto x = test::random_floats(static_cast<size_t>(tokens * k), rng);
  std::vector<float> y(static_cast<size_t>(tokens * rows));
  const QuantMatmulOutput out{y.data(), rows, nullptr};
  w->run(x.data(), tokens, {&out, 1}, pool);
  const auto g = product(gate, x, tokens, nullptr), u = product(up, x, tokens, nullptr);
  for (size_t i = 0; i < y.size(); ++i) {
    const double want = g[i] / (1 + std::exp(-g[i])) * u[i];
    ASSERT_NEAR(y[i], want, 1e-4 * std::max(1.0, std::fabs(want))) << i;
  }
  // Mixed dtypes or mismatched SwiGLU shapes are refused.
  std::vector<std::byte> sf;
  TensorView f = test::random_tensor(DType::kF32, rows, k, rng, &sf);
  const TensorView* mixed[] = {&gate, &f};
  EXPECT_FALSE(OneDnnWeight::create(mixed, false, 1).has_value());
  const TensorView* one[] = {&gate};
  EXPECT_FALSE(OneDnnWeight::create(one, true, 1).has_value());
}

// A BF16 checkpoint with --matmul onednn: the logits stay near the f32 path's (activations are
// rounded to bf16 at each matmul, so not equal).
TEST(OneDnnMatmulTest, Bf16ModelRunsNearTheF32Path) {
  SKIP_WITHOUT_ONEDNN();
  auto m = load_model(test::fixture_path("tiny/qwen2_bf16"));
  ASSERT_TRUE(m.has_value()) << m.status().message();
  ThreadPool pool(2);
  Transformer onednn(**m, pool, {.backend = BackendKind::kOneDnn});
  Transformer f32(**m, pool, {.backend = BackendKind::kF32});
  const std::vector<std::vector<int32_t>> prompts = {{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, {100, 7, 42}};
  const auto a = test::all_logits(onednn, prompts, 0, false);
  const auto b = test::all_logits(f32, prompts, 0, false);
  ASSERT_FALSE(a.empty());
  EXPECT_LT(test::relative_max_error(a.data(), b.data(), b.size()), 0.05);
  // Where BF16 runs as BF16, the bf16 activations do change the result (elsewhere it runs as f32).
  if (OneDnnWeight::bf16_native()) {
    EXPECT_NE(a, b);
  }
}

}  // namespace
}  // namespace inferd
