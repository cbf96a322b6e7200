// Every op of every backend on every ISA path this CPU has (like llama.cpp's test-backend-ops):
// linear layers of every weight format (one part, Q/K/V parts with biases, SwiGLU, with and
// without the fused RMSNorm; grouped_linear against linear), paged attention, RMSNorm, RoPE, SiLU-mul and the
// embedding, each against a scalar double reference on random shapes, odd sizes included. The packed
// backend's integer kernels are also bit-identical to its scalar path on every ISA path.
#include "kernels/backend.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "common/half.h"
#include "kernels/onednn_matmul.h"
#include "kv/kv_cache.h"
#include "tensor/dequantize.h"
#include "test_support.h"

namespace inferd {
namespace {

// Every path this CPU has, and the AMX path on emulated tiles where the CPU has VNNI but no AMX
// (each loop over the paths turns the emulation on for it: emulate()).
std::vector<Isa> isas() {
  std::vector<Isa> out;
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512, Isa::kVnni, Isa::kAmx}) {
    if (static_cast<int>(isa) <= static_cast<int>(detected_isa())) out.push_back(isa);
  }
  if (test::amx_only_emulated()) out.push_back(Isa::kAmx);
  return out;
}

// Whether `isa` runs here on emulated tiles.
bool emulate(Isa isa) {
  return isa == Isa::kAmx && test::amx_only_emulated();
}

// Every backend this build and machine run: the CPU ones, and CUDA where a build with it finds a
// device (scripts/gpu-check runs these tests on a GPU machine; tests/cuda requires the device).
std::vector<BackendKind> kinds() {
  std::vector<BackendKind> out{BackendKind::kPacked, BackendKind::kF32};
  if (OneDnnWeight::available()) out.push_back(BackendKind::kOneDnn);
  if (cuda_backend_available().is_ok()) out.push_back(BackendKind::kCuda);
  return out;
}

// The ISA paths of a backend: every one this CPU has for the CPU backends; CUDA's kernels do not
// depend on it (its CPU fallbacks take the active one).
std::vector<Isa> isas(BackendKind kind) {
  return kind == BackendKind::kCuda ? std::vector<Isa>{active_isa()} : isas();
}

std::unique_ptr<Backend> make(BackendKind kind, Isa isa, ThreadPool& pool) {
  auto b = make_backend(kind, isa, pool);
  EXPECT_TRUE(b.has_value()) << b.status().message();
  return b ? std::move(b).value() : nullptr;
}

std::string label(BackendKind kind, Isa isa) {
  return std::string(backend_name(kind)) + "/" + std::string(isa_name(isa)) +
         (emulate(isa) ? " (emulated)" : "");
}

std::vector<double> rms_norm_reference(const std::vector<float>& x, const std::vector<float>& w, int64_t rows,
                                       int64_t n, double eps) {
  std::vector<double> y(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[r * n + i]) * x[r * n + i];
    const double inv = 1.0 / std::sqrt(ss / static_cast<double>(n) + eps);
    for (int64_t i = 0; i < n; ++i) y[r * n + i] = x[r * n + i] * inv * w[i];
  }
  return y;
}

double silu(double x) {
  return x / (1.0 + std::exp(-x));
}

// max |got - want| / max |want|.
double relative_error(const float* got, const std::vector<double>& want) {
  double err = 0, scale = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    err = std::max(err, std::abs(static_cast<double>(got[i]) - want[i]));
    scale = std::max(scale, std::abs(want[i]));
  }
  return err / std::max(scale, 1e-30);
}

// Weights the integer kernels take (int8 activations); the rest (F32, F16, BF16, FP8) are float.
bool block_quantized(DType d) {
  return !PackedWeight::is_float_dtype(d);
}

// What each backend's linear layer may differ from the double product by: int8 activations on
// the packed backend's block-quantized weights, bf16 activations through oneDNN's BF16 GEMM,
// f32 sums elsewhere.
double tolerance(BackendKind kind, DType dtype, Isa isa) {
  if (kind == BackendKind::kCuda) {
    // CUDA: activations rounded to the weights' 16-bit type for cuBLAS, quantized to int8 per block
    // for Q8_0 (W8A8); every other format expanded to f32 (cuBLAS SGEMM).
    if (dtype == DType::kF16) return 2e-3;
    if (dtype == DType::kBF16) return 1e-2;
    if (dtype == DType::kQ8_0) return 3e-2;
    return 2e-5;
  }
  if (kind != BackendKind::kF32 && block_quantized(dtype)) return 3e-2;  // oneDNN packs these too
  if (kind == BackendKind::kOneDnn && dtype == DType::kBF16) return 2e-2;
  // The packed BF16 kernel (AVX-512 and up) rounds activations to bf16, as its dot products take
  // them: 2^-9 of each input (packed_matmul_test checks it exactly against that rounding).
  if (kind == BackendKind::kPacked && dtype == DType::kBF16 &&
      static_cast<int>(isa) >= static_cast<int>(Isa::kAvx512))
    return 5e-3;
  return 2e-5;
}

struct LinearCase {
  DType dtype;
  int64_t rows, cols, tokens;
};

TEST(BackendOpsTest, LinearMatchesTheDoubleProductOnEveryBackendAndPath) {
  std::mt19937 rng(11);
  ThreadPool pool(2);
  const std::vector<LinearCase> cases = {
      {DType::kF32, 37, 96, 3},     {DType::kF16, 5, 160, 17},     {DType::kBF16, 19, 64, 1},
      {DType::kQ8_0, 37, 96, 21},   {DType::kQ4_0, 21, 224, 2},    {DType::kQ4_1, 16, 32, 17},
      {DType::kQ5_0, 3, 64, 4},     {DType::kQ4_K, 17, 256, 16},   {DType::kQ6_K, 33, 512, 18},
      {DType::kQ5_K, 8, 256, 1},    {DType::kI8, 13, 96, 33},      {DType::kQ4_G128, 9, 256, 3},
      {DType::kF8_E4M3, 11, 64, 2}, {DType::kQ5_1, 6, 64, 16},     {DType::kQ4_G64, 18, 128, 20},
      {DType::kIQ4_NL, 23, 96, 17}, {DType::kIQ4_XS, 9, 512, 5},   {DType::kQ2_K, 19, 512, 17},
      {DType::kQ3_K, 14, 256, 3},   {DType::kIQ3_XXS, 7, 512, 19}, {DType::kIQ3_S, 22, 256, 2},
      {DType::kIQ2_S, 13, 768, 18}, {DType::kIQ2_XS, 11, 512, 17}, {DType::kIQ2_XXS, 29, 256, 6},
      {DType::kIQ1_S, 5, 512, 17},  {DType::kIQ1_M, 18, 256, 3},   {DType::kTQ1_0, 9, 256, 17},
      {DType::kTQ2_0, 21, 512, 2},
  };
  for (const LinearCase& c : cases) {
    std::vector<std::byte> storage;
    const TensorView w = test::random_tensor(c.dtype, c.rows, c.cols, rng, &storage);
    const std::vector<float> x = test::random_floats(static_cast<size_t>(c.tokens * c.cols), rng);
    const std::vector<float> norm = test::random_floats(static_cast<size_t>(c.cols), rng, 0.5f, 1.5f);
    const std::vector<float> bias = test::random_floats(static_cast<size_t>(c.rows), rng);
    const float eps = 1e-5f;
    const std::vector<double> normed = rms_norm_reference(x, norm, c.tokens, c.cols, eps);
    const std::vector<float> normed_f(normed.begin(), normed.end());
    const std::vector<double> plain_want = test::double_product(w, x, c.tokens, bias.data());
    const std::vector<double> normed_want = test::double_product(w, normed_f, c.tokens, bias.data());
    for (BackendKind kind : kinds()) {
      std::vector<float> scalar_plain;
      for (Isa isa : isas(kind)) {
        const test::ScopedAmxEmulation emulation(emulate(isa));
        auto b = make(kind, isa, pool);
        ASSERT_NE(b, nullptr);
        const TensorView* parts[] = {&w};
        auto prepared = b->prepare_linear(parts, false);
        std::vector<float> y(static_cast<size_t>(c.tokens * c.rows));
        const LinearOutput out{y.data(), c.rows, bias.data()};
        b->linear(x.data(), c.tokens, c.cols, nullptr, eps, *prepared, {&out, 1});
        const double tol = tolerance(kind, c.dtype, isa);
        EXPECT_LE(relative_error(y.data(), plain_want), tol)
            << label(kind, isa) << " " << dtype_info(c.dtype).name;
        // The integer kernels give the scalar path's bits on every path (float weights take the
        // packed float kernel only where AVX-512 runs it, the f32 path below that).
        if (kind == BackendKind::kPacked && block_quantized(c.dtype)) {
          if (isa == Isa::kScalar) scalar_plain = y;
          EXPECT_EQ(y, scalar_plain) << label(kind, isa) << " " << dtype_info(c.dtype).name;
        }
        b->linear(x.data(), c.tokens, c.cols, norm.data(), eps, *prepared, {&out, 1});
        EXPECT_LE(relative_error(y.data(), normed_want), tol + 1e-5)
            << label(kind, isa) << " " << dtype_info(c.dtype).name << " with the norm";
      }
    }
  }
}

TEST(BackendOpsTest, QkvPartsAndSwigluMatchTheirReferences) {
  std::mt19937 rng(5);
  ThreadPool pool(2);
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kQ8_0, DType::kQ4_K}) {
    const int64_t cols = dtype == DType::kQ4_K ? 256 : 64, tokens = 7;
    std::vector<std::byte> sq, sk, sv, sg, su;
    const TensorView q = test::random_tensor(dtype, 24, cols, rng, &sq);
    const TensorView k = test::random_tensor(dtype, 8, cols, rng, &sk);
    const TensorView v = test::random_tensor(dtype, 8, cols, rng, &sv);
    const TensorView gate = test::random_tensor(dtype, 45, cols, rng, &sg);
    const TensorView up = test::random_tensor(dtype, 45, cols, rng, &su);
    const std::vector<float> x = test::random_floats(static_cast<size_t>(tokens * cols), rng);
    const std::vector<float> bq = test::random_floats(24, rng), bk = test::random_floats(8, rng);
    const std::vector<double> want_q = test::double_product(q, x, tokens, bq.data());
    const std::vector<double> want_k = test::double_product(k, x, tokens, bk.data());
    const std::vector<double> want_v = test::double_product(v, x, tokens, nullptr);
    const std::vector<double> g = test::double_product(gate, x, tokens, nullptr);
    const std::vector<double> u = test::double_product(up, x, tokens, nullptr);
    std::vector<double> want_swiglu(g.size());
    for (size_t i = 0; i < g.size(); ++i) want_swiglu[i] = silu(g[i]) * u[i];
    for (BackendKind kind : kinds()) {
      for (Isa isa : isas(kind)) {
        const test::ScopedAmxEmulation emulation(emulate(isa));
        auto b = make(kind, isa, pool);
        ASSERT_NE(b, nullptr);
        const double tol = tolerance(kind, dtype, isa);
        const TensorView* qkv_parts[] = {&q, &k, &v};
        auto qkv = b->prepare_linear(qkv_parts, false);
        std::vector<float> yq(24 * tokens), yk(8 * tokens), yv(8 * tokens);
        const LinearOutput outs[3] = {
            {yq.data(), 24, bq.data()}, {yk.data(), 8, bk.data()}, {yv.data(), 8, nullptr}};
        b->linear(x.data(), tokens, cols, nullptr, 0, *qkv, outs);
        EXPECT_LE(relative_error(yq.data(), want_q), tol)
            << label(kind, isa) << " " << dtype_info(dtype).name;
        EXPECT_LE(relative_error(yk.data(), want_k), tol) << label(kind, isa);
        EXPECT_LE(relative_error(yv.data(), want_v), tol) << label(kind, isa);
        const TensorView* gu[] = {&gate, &up};
        auto swiglu = b->prepare_linear(gu, true);
        std::vector<float> y(45 * tokens);
        const LinearOutput out{y.data(), 45, nullptr};
        b->linear(x.data(), tokens, cols, nullptr, 0, *swiglu, {&out, 1});
        EXPECT_LE(relative_error(y.data(), want_swiglu), 2 * tol) << label(kind, isa) << " swiglu";
      }
    }
  }
}

// A linear whose matrices differ in dtype (a K-quant mix: Q and K in Q4_K, V in Q6_K; a SwiGLU
// pair in two types) gives each part exactly what that part prepared alone gives, with and
// without the fused RMSNorm, on every backend and path; the SwiGLU pair gives silu(gate) * up.
TEST(BackendOpsTest, LinearOfMixedDtypesEqualsEachPartAlone) {
  std::mt19937 rng(29);
  ThreadPool pool(2);
  const int64_t cols = 256, tokens = 19;
  std::vector<std::byte> sq, sk, sv, sg, su;
  const TensorView wq = test::random_tensor(DType::kQ4_K, 40, cols, rng, &sq);
  const TensorView wk = test::random_tensor(DType::kQ4_K, 17, cols, rng, &sk);
  const TensorView wv = test::random_tensor(DType::kQ6_K, 17, cols, rng, &sv);
  const TensorView gate = test::random_tensor(DType::kQ4_K, 33, cols, rng, &sg);
  const TensorView up = test::random_tensor(DType::kQ8_0, 33, cols, rng, &su);
  const auto x = test::random_floats(static_cast<size_t>(tokens * cols), rng);
  const auto norm = test::random_floats(static_cast<size_t>(cols), rng);
  const auto bq = test::random_floats(40, rng), bk = test::random_floats(17, rng),
             bv = test::random_floats(17, rng);
  for (BackendKind kind : kinds()) {
    for (Isa isa : isas(kind)) {
      const test::ScopedAmxEmulation emulation(emulate(isa));
      auto b = make(kind, isa, pool);
      ASSERT_NE(b, nullptr);
      for (const float* nw : {static_cast<const float*>(nullptr), norm.data()}) {
        SCOPED_TRACE(label(kind, isa) + (nw != nullptr ? " +norm" : ""));
        const TensorView* qkv[] = {&wq, &wk, &wv};
        auto mixed = b->prepare_linear(qkv, false);
        std::vector<float> q(tokens * 40), k(tokens * 17), v(tokens * 17);
        const LinearOutput outs[] = {
            {q.data(), 40, bq.data()}, {k.data(), 17, bk.data()}, {v.data(), 17, bv.data()}};
        b->linear(x.data(), tokens, cols, nw, 1e-6f, *mixed, outs);
        const std::vector<float>* got[] = {&q, &k, &v};
        for (size_t i = 0; i < 3; ++i) {
          auto alone = b->prepare_linear({&qkv[i], 1}, false);
          std::vector<float> want(got[i]->size());
          const LinearOutput out{want.data(), outs[i].ld, outs[i].bias};
          b->linear(x.data(), tokens, cols, nw, 1e-6f, *alone, {&out, 1});
          EXPECT_EQ(*got[i], want) << "part " << i;
        }
        const TensorView* pair[] = {&gate, &up};
        auto swiglu = b->prepare_linear(pair, true);
        std::vector<float> y(tokens * 33), g(tokens * 33), u(tokens * 33);
        const LinearOutput out{y.data(), 33, nullptr};
        b->linear(x.data(), tokens, cols, nw, 1e-6f, *swiglu, {&out, 1});
        auto g_alone = b->prepare_linear({&pair[0], 1}, false),
             u_alone = b->prepare_linear({&pair[1], 1}, false);
        const LinearOutput og{g.data(), 33, nullptr}, ou{u.data(), 33, nullptr};
        b->linear(x.data(), tokens, cols, nw, 1e-6f, *g_alone, {&og, 1});
        b->linear(x.data(), tokens, cols, nw, 1e-6f, *u_alone, {&ou, 1});
        double err = 0, mag = 0;
        for (size_t i = 0; i < y.size(); ++i) {
          const double want = g[i] / (1.0 + std::exp(-static_cast<double>(g[i]))) * u[i];
          err = std::max(err, std::fabs(y[i] - want));
          mag = std::max(mag, std::fabs(want));
        }
        EXPECT_LE(err, 1e-5 * std::max(mag, 1.0));
        // Gate and up apart (the LoRA path asks for them so).
        std::vector<float> g2(g.size()), u2(u.size());
        const LinearOutput two[] = {{g2.data(), 33, nullptr}, {u2.data(), 33, nullptr}};
        b->linear(x.data(), tokens, cols, nw, 1e-6f, *swiglu, two);
        EXPECT_EQ(g2, g);
        EXPECT_EQ(u2, u);
      }
    }
  }
}

// grouped_linear (a MoE step's experts as one op) gives exactly what linear() gives each group
// alone: SwiGLU pairs and single parts, mixed row counts (0, 1, past the 8-token tile pass and the AMX path's
// 16), on every backend, path and a float and block-quantized format each.
TEST(BackendOpsTest, GroupedLinearEqualsEachLinearAlone) {
  std::mt19937 rng(23);
  ThreadPool pool(2);
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kQ8_0, DType::kQ4_0, DType::kQ4_K}) {
    const int64_t cols = dtype == DType::kQ4_K ? 256 : 96, rows = 40;
    const std::vector<int64_t> tokens = {17, 0, 1, 11, 2, 35};
    std::vector<std::vector<std::byte>> storage(2 * tokens.size());
    std::vector<TensorView> gates, ups;
    for (size_t g = 0; g < tokens.size(); ++g) {
      gates.push_back(test::random_tensor(dtype, rows, cols, rng, &storage[2 * g]));
      ups.push_back(test::random_tensor(dtype, rows, cols, rng, &storage[2 * g + 1]));
    }
    std::vector<std::vector<float>> xs;
    for (int64_t t : tokens)
      xs.push_back(test::random_floats(static_cast<size_t>(std::max<int64_t>(t, 1) * cols), rng));
    for (BackendKind kind : kinds()) {
      for (Isa isa : isas(kind)) {
        const test::ScopedAmxEmulation emulation(emulate(isa));
        auto b = make(kind, isa, pool);
        ASSERT_NE(b, nullptr);
        // Even groups SwiGLU (gate, up), odd groups one part (gate only).
        std::vector<std::unique_ptr<LinearWeights>> prepared;
        for (size_t g = 0; g < tokens.size(); ++g) {
          const TensorView* pair[] = {&gates[g], &ups[g]};
          prepared.push_back(g % 2 == 0 ? b->prepare_linear(pair, true)
                                        : b->prepare_linear({pair, 1}, false));
        }
        std::vector<std::vector<float>> alone(tokens.size()), grouped(tokens.size());
        std::vector<LinearGroup> groups;
        for (size_t g = 0; g < tokens.size(); ++g) {
          alone[g].assign(static_cast<size_t>(tokens[g] * rows), -1.0f);
          grouped[g].assign(static_cast<size_t>(tokens[g] * rows), -2.0f);
          const LinearOutput out{alone[g].data(), rows, nullptr};
          if (tokens[g] > 0) b->linear(xs[g].data(), tokens[g], cols, nullptr, 0, *prepared[g], {&out, 1});
          groups.push_back(
              {prepared[g].get(), xs[g].data(), tokens[g], cols, {grouped[g].data(), rows, nullptr}});
        }
        b->grouped_linear(groups);
        for (size_t g = 0; g < tokens.size(); ++g)
          EXPECT_EQ(grouped[g], alone[g])
              << label(kind, isa) << " " << dtype_info(dtype).name << " group " << g;
      }
    }
  }
}

// Causal attention of each query over its sequence's cached positions, in double.
void attention_reference(const std::vector<float>& q, const std::vector<std::vector<float>>& keys,
                         const std::vector<std::vector<float>>& values, int64_t ctx_end,
                         const AttentionShape& s, int64_t seq, std::vector<double>& out, int64_t row) {
  const int64_t kv_dim = s.num_kv_heads * s.head_dim;
  const int64_t q_dim = s.num_heads * s.head_dim;
  for (int64_t h = 0; h < s.num_heads; ++h) {
    const int64_t kvh = h / (s.num_heads / s.num_kv_heads);
    std::vector<double> w(static_cast<size_t>(ctx_end));
    double mx = -1e300;
    for (int64_t p = 0; p < ctx_end; ++p) {
      double d = 0;
      for (int64_t i = 0; i < s.head_dim; ++i)
        d += static_cast<double>(q[row * q_dim + h * s.head_dim + i]) *
             keys[seq][p * kv_dim + kvh * s.head_dim + i];
      w[p] = d * s.scale;
      mx = std::max(mx, w[p]);
    }
    double sum = 0;
    for (auto& x : w) sum += (x = std::exp(x - mx));
    for (int64_t i = 0; i < s.head_dim; ++i) {
      double acc = 0;
      for (int64_t p = 0; p < ctx_end; ++p)
        acc += w[p] / sum * values[seq][p * kv_dim + kvh * s.head_dim + i];
      out[row * q_dim + h * s.head_dim + i] = acc;
    }
  }
}

TEST(BackendOpsTest, PagedAttentionMatchesTheDoubleReference) {
  std::mt19937 rng(3);
  ThreadPool pool(2);
  const AttentionShape shape{6, 2, 20, 1.0f / std::sqrt(20.0f)};  // GQA 3:1, an odd head size
  const int64_t kv_dim = shape.num_kv_heads * shape.head_dim, q_dim = shape.num_heads * shape.head_dim;
  const int64_t block = 4, num_blocks = 40;
  struct Seq {
    int64_t cached, queries;
  };
  const std::vector<Seq> seqs = {{0, 5}, {16, 1}, {9, 3}, {37, 1}};
  for (KvDType dtype : {KvDType::kF32, KvDType::kF16, KvDType::kBF16, KvDType::kInt8, KvDType::kFp8}) {
    KvCache cache(1, num_blocks, block, kv_dim, dtype, shape.head_dim);
    std::vector<int32_t> free_blocks(num_blocks);
    std::iota(free_blocks.begin(), free_blocks.end(), 0);
    std::shuffle(free_blocks.begin(), free_blocks.end(), rng);
    std::vector<std::vector<int32_t>> tables;
    std::vector<std::vector<float>> keys, values;
    std::vector<AttentionSequence> sequences;
    std::vector<int32_t> token_sequence;
    int64_t row = 0;
    for (size_t s = 0; s < seqs.size(); ++s) {
      const int64_t ctx = seqs[s].cached + seqs[s].queries;
      std::vector<int32_t> table;
      for (int64_t b = 0; b < (ctx + block - 1) / block; ++b) {
        table.push_back(free_blocks.back());
        free_blocks.pop_back();
      }
      keys.push_back(test::random_floats(static_cast<size_t>(ctx * kv_dim), rng));
      values.push_back(test::random_floats(static_cast<size_t>(ctx * kv_dim), rng));
      // The reference computes with what the cache holds (rounded, or 8-bit codes times scales).
      for (int64_t p = 0; p < ctx; ++p) {
        const int64_t slot = table[p / block] * block + p % block;
        cache.write(0, slot, &keys[s][p * kv_dim], &values[s][p * kv_dim]);
        cache.read(0, slot, &keys[s][p * kv_dim], &values[s][p * kv_dim]);
      }
      tables.push_back(std::move(table));
      for (int64_t i = 0; i < seqs[s].queries; ++i) token_sequence.push_back(static_cast<int32_t>(s));
      row += seqs[s].queries;
    }
    for (size_t s = 0, start = 0; s < seqs.size(); start += static_cast<size_t>(seqs[s].queries), ++s)
      sequences.push_back(
          {static_cast<int64_t>(start), seqs[s].queries, seqs[s].cached + seqs[s].queries, tables[s]});
    const std::vector<float> q = test::random_floats(static_cast<size_t>(row * q_dim), rng);
    std::vector<double> want(static_cast<size_t>(row * q_dim));
    for (size_t s = 0; s < seqs.size(); ++s) {
      for (int64_t i = 0; i < seqs[s].queries; ++i)
        attention_reference(q, keys, values, seqs[s].cached + i + 1, shape, static_cast<int64_t>(s), want,
                            sequences[s].query_start + i);
    }
    for (BackendKind kind : kinds()) {
      for (Isa isa : isas(kind)) {
        const test::ScopedAmxEmulation emulation(emulate(isa));
        auto b = make(kind, isa, pool);
        ASSERT_NE(b, nullptr);
        std::vector<float> out(want.size());
        b->attention(q.data(), sequences, token_sequence, cache.layer_view(0), shape, out.data());
        // The GPU's expf is within 2 ulp, not correctly rounded: a looser bound there.
        EXPECT_LE(relative_error(out.data(), want), kind == BackendKind::kCuda ? 1e-4 : 1e-5)
            << label(kind, isa) << " kv " << kv_dtype_name(dtype);
      }
    }
  }
}

TEST(BackendOpsTest, NormRopeActivationAndEmbeddingMatchTheirReferences) {
  std::mt19937 rng(8);
  ThreadPool pool(2);
  const int64_t rows = 3, n = 37, heads = 3, kv_heads = 1, hd = 18;
  const std::vector<float> x = test::random_floats(static_cast<size_t>(rows * n), rng);
  const std::vector<float> w = test::random_floats(static_cast<size_t>(n), rng, 0.5f, 1.5f);
  const std::vector<double> norm_want = rms_norm_reference(x, w, rows, n, 1e-6);
  const std::vector<float> gate = test::random_floats(101, rng, -4, 4), up = test::random_floats(101, rng);
  std::vector<double> silu_want(101);
  for (size_t i = 0; i < 101; ++i) silu_want[i] = silu(gate[i]) * up[i];
  const std::vector<float> inv_freq = rope_inverse_frequencies(hd, 10000.0);
  const std::vector<float> q0 = test::random_floats(static_cast<size_t>(heads * hd), rng);
  const std::vector<float> k0 = test::random_floats(static_cast<size_t>(kv_heads * hd), rng);
  std::vector<std::byte> storage;
  const TensorView table = test::random_tensor(DType::kQ8_0, 50, 64, rng, &storage);
  const std::vector<int32_t> ids = {7, 0, 49, 7};
  for (BackendKind kind : kinds()) {
    for (Isa isa : isas(kind)) {
      const test::ScopedAmxEmulation emulation(emulate(isa));
      auto b = make(kind, isa, pool);
      ASSERT_NE(b, nullptr);
      std::vector<float> y(x.size());
      b->rms_norm(x.data(), w.data(), y.data(), rows, n, 1e-6f);
      EXPECT_LE(relative_error(y.data(), norm_want), 1e-6) << label(kind, isa);
      std::vector<float> s(101);
      b->silu_mul(gate.data(), up.data(), s.data(), 101);
      EXPECT_LE(relative_error(s.data(), silu_want), 1e-5) << label(kind, isa);
      for (RopePairing pairing : {RopePairing::kNeox, RopePairing::kInterleaved}) {
        std::vector<float> q = q0, k = k0;
        const int64_t pos = 1234;
        const float scale = pairing == RopePairing::kNeox ? 1.0f : 1.125f;  // YaRN's attention factor
        b->rope_qk(q.data(), heads, k.data(), kv_heads, hd, pos, inv_freq.data(), pairing, scale, nullptr);
        // With the angles' table the caller computed: the same bits.
        std::vector<float> cos_sin(static_cast<size_t>(hd)), qt = q0, kt = k0;
        rope_cos_sin(pos, inv_freq.data(), hd, scale, cos_sin.data());
        b->rope_qk(qt.data(), heads, kt.data(), kv_heads, hd, pos, inv_freq.data(), pairing, scale,
                   cos_sin.data());
        EXPECT_EQ(qt, q) << label(kind, isa);
        EXPECT_EQ(kt, k) << label(kind, isa);
        for (auto [got, orig, nh] : {std::tuple{&q, &q0, heads}, std::tuple{&k, &k0, kv_heads}}) {
          std::vector<double> want(orig->size());
          for (int64_t h = 0; h < nh; ++h) {
            for (int64_t i = 0; i < hd / 2; ++i) {
              const int64_t i0 = pairing == RopePairing::kNeox ? i : 2 * i;
              const int64_t i1 = pairing == RopePairing::kNeox ? i + hd / 2 : 2 * i + 1;
              const double a = (*orig)[h * hd + i0], c = (*orig)[h * hd + i1];
              const double angle = static_cast<double>(static_cast<float>(pos) * inv_freq[i]);
              want[h * hd + i0] = (a * std::cos(angle) - c * std::sin(angle)) * scale;
              want[h * hd + i1] = (a * std::sin(angle) + c * std::cos(angle)) * scale;
            }
          }
          EXPECT_LE(relative_error(got->data(), want), 1e-5) << label(kind, isa);
        }
      }
      std::vector<float> e(ids.size() * 64);
      b->embed(table, ids, e.data());
      std::vector<float> row(64);
      for (size_t t = 0; t < ids.size(); ++t) {
        dequantize_tensor_row(table, ids[t], row.data());
        EXPECT_TRUE(std::equal(row.begin(), row.end(), e.begin() + static_cast<std::ptrdiff_t>(t * 64)))
            << label(kind, isa);
      }
    }
  }
}

TEST(BackendOpsTest, AMissingCudaAndAnIsaBeyondTheCpuAreRefused) {
  ThreadPool pool(1);
  auto cuda = make_backend(BackendKind::kCuda, Isa::kScalar, pool);
#if defined(INFERD_HAVE_CUDA)
  // Built with CUDA: a backend where a device answers (tests/cuda checks its ops), else the
  // runtime's reason, as cuda_backend_available() gives it.
  if (cuda_backend_available().is_ok()) {
    EXPECT_TRUE(cuda.has_value()) << cuda.status().message();
  } else {
    ASSERT_FALSE(cuda.has_value());
    EXPECT_NE(cuda.status().message().find("no CUDA device"), std::string::npos) << cuda.status().message();
  }
#else
  ASSERT_FALSE(cuda.has_value());
  EXPECT_NE(cuda.status().message().find("not compiled with CUDA"), std::string::npos);
  EXPECT_EQ(cuda_backend_available().message(), cuda.status().message());
#endif
  if (detected_isa() != Isa::kAmx) {
    if (test::amx_only_emulated()) {  // offered while emulated, and only then
      const test::ScopedAmxEmulation emulation(true);
      EXPECT_TRUE(make_backend(BackendKind::kPacked, Isa::kAmx, pool).has_value());
    }
    auto beyond = make_backend(BackendKind::kPacked, Isa::kAmx, pool);
    ASSERT_FALSE(beyond.has_value());
    EXPECT_NE(beyond.status().message().find("beyond this CPU"), std::string::npos);
  }
  if (!OneDnnWeight::available()) {
    auto onednn = make_backend(BackendKind::kOneDnn, Isa::kScalar, pool);
    ASSERT_FALSE(onednn.has_value());
    EXPECT_NE(onednn.status().message().find("no oneDNN"), std::string::npos);
  }
}

}  // namespace
}  // namespace inferd
