#include "kernels/packed_matmul.h"
#include "common/half.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "common/half.h"
#include "kernels/ops.h"
#include "tensor/dequantize.h"
#include "test_support.h"

namespace inferd {
namespace {

constexpr DType kTypes[] = {DType::kQ8_0,    DType::kQ5_0,   DType::kQ5_1,   DType::kQ4_0,   DType::kQ4_1,
                            DType::kQ4_K,    DType::kQ5_K,   DType::kQ6_K,   DType::kI8,     DType::kQ4_G128,
                            DType::kQ4_G64,  DType::kIQ4_NL, DType::kIQ4_XS, DType::kQ2_K,   DType::kQ3_K,
                            DType::kIQ3_XXS, DType::kIQ3_S,  DType::kIQ2_S,  DType::kIQ2_XS, DType::kIQ2_XXS,
                            DType::kIQ1_S,   DType::kIQ1_M,  DType::kTQ1_0,  DType::kTQ2_0};

// k rounded up to the dtype's block (256 values for K-quants).
int64_t k_for(DType dtype, int64_t k) {
  const int64_t block = dtype_info(dtype).block_values;
  return (k + block - 1) / block * block;
}

// Every path this CPU can run, scalar first.
std::vector<Isa> paths() {
  std::vector<Isa> out;
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512, Isa::kVnni, Isa::kAmx}) {
    if (static_cast<int>(isa) <= static_cast<int>(detected_isa())) out.push_back(isa);
  }
  return out;
}

std::vector<float> dequantized(const QuantizedActivations& xq) {
  std::vector<float> out(static_cast<size_t>(xq.tokens() * xq.k()));
  for (int64_t t = 0; t < xq.tokens(); ++t)
    for (int64_t i = 0; i < xq.k(); ++i)
      out[static_cast<size_t>(t * xq.k() + i)] = xq.q(t)[i] * xq.scale(t)[i / kQuantBlockValues];
  return out;
}

// y[t, n] in double from the dequantized weights and the (dequantized) int8 activations.
std::vector<double> reference(const TensorView& w, const std::vector<float>& x, int64_t tokens,
                              const float* bias) {
  return test::double_product(w, x, tokens, bias);
}

// got within f32 rounding of the double-precision product: 1e-5 of the largest |output| (or 1e-5).
void expect_near_product(const std::vector<float>& got, const std::vector<double>& want) {
  double err = 0, mag = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    err = std::max(err, std::fabs(got[i] - want[i]));
    mag = std::max(mag, std::fabs(want[i]));
  }
  EXPECT_LE(err, 1e-5 * std::max(mag, 1.0));
}

TEST(QuantizeActivationsTest, EveryPathMatchesTheReferenceBitForBit) {
  std::mt19937 rng(7);
  for (int64_t k : {32, 96, 576}) {
    auto x = test::random_floats(static_cast<size_t>(5 * k), rng);
    for (int64_t i = 0; i < 32; ++i) x[static_cast<size_t>(i)] = 0.0f;  // an all-zero block
    x[40] = 1e-30f;                                                     // a tiny value
    for (Isa isa : paths()) {
      SCOPED_TRACE(std::string(isa_name(isa)));
      QuantizedActivations xq;
      xq.quantize(x.data(), 5, k, isa);
      std::vector<int8_t> q(static_cast<size_t>(k));
      std::vector<float> scale(static_cast<size_t>(k / 32)), scaled(scale.size());
      std::vector<int32_t> sum(scale.size()), half(2 * scale.size());
      for (int64_t t = 0; t < 5; ++t) {
        quantize_activations_reference(x.data() + t * k, k, q.data(), scale.data(), sum.data(), scaled.data(),
                                       half.data());
        ASSERT_EQ(0, std::memcmp(q.data(), xq.q(t), q.size()));
        for (size_t b = 0; b < scale.size(); ++b) {
          ASSERT_EQ(scale[b], xq.scale(t)[b]);
          ASSERT_EQ(sum[b], xq.sum(t)[b]);
          ASSERT_EQ(half[2 * b], xq.half_sum(t)[2 * b]);
          ASSERT_EQ(half[2 * b] + half[2 * b + 1], sum[b]);
          ASSERT_EQ(scaled[b], xq.scaled_sum(t)[b]);
          // Round to nearest: each value within half a step of its original.
          for (int j = 0; j < 32; ++j) {
            const size_t i = b * 32 + static_cast<size_t>(j);
            EXPECT_LE(std::fabs(q[i] * scale[b] - x[static_cast<size_t>(t * k) + i]),
                      0.5001f * scale[b] + 1e-37f);
          }
        }
      }
      EXPECT_EQ(xq.scale(0)[0], 0.0f);
      EXPECT_EQ(xq.sum(0)[0], 0);
    }
  }
}

// RMSNorm fused with the quantization gives the bits of the two steps one after the other.
TEST(QuantizeActivationsTest, FusedRmsNormEqualsNormThenQuantize) {
  std::mt19937 rng(12);
  const int64_t k = 896;
  auto x = test::random_floats(static_cast<size_t>(3 * k), rng);
  auto weight = test::random_floats(static_cast<size_t>(k), rng);
  std::vector<float> normed(x.size());
  for (int64_t t = 0; t < 3; ++t) rms_norm(x.data() + t * k, weight.data(), normed.data() + t * k, k, 1e-6f);
  QuantizedActivations fused, separate;
  fused.quantize_rms_norm(x.data(), weight.data(), 1e-6f, 3, k);
  separate.quantize(normed.data(), 3, k);
  for (int64_t t = 0; t < 3; ++t) {
    ASSERT_EQ(0, std::memcmp(fused.q(t), separate.q(t), static_cast<size_t>(k)));
    ASSERT_EQ(0, std::memcmp(fused.scale(t), separate.scale(t), static_cast<size_t>(k / 32) * sizeof(float)));
  }
}

// A batch split over a pool's threads (kPoolRows tokens or more) gives every row the bits of
// the caller's own pass, for the plain and the fused-norm quantization, with a thread count that
// does not divide the rows.
TEST(QuantizeActivationsTest, PoolSplitEqualsOneThread) {
  std::mt19937 rng(13);
  ThreadPool pool(3);
  for (const int64_t tokens : {kPoolRows, int64_t{37}}) {
    const int64_t k = 896;
    auto x = test::random_floats(static_cast<size_t>(tokens * k), rng);
    auto weight = test::random_floats(static_cast<size_t>(k), rng);
    for (const bool norm : {false, true}) {
      QuantizedActivations split, alone;
      if (norm) {
        split.quantize_rms_norm(x.data(), weight.data(), 1e-6f, tokens, k, active_isa(), &pool);
        alone.quantize_rms_norm(x.data(), weight.data(), 1e-6f, tokens, k, active_isa());
      } else {
        split.quantize(x.data(), tokens, k, active_isa(), &pool);
        alone.quantize(x.data(), tokens, k, active_isa());
      }
      const auto nb = static_cast<size_t>(k / kQuantBlockValues);
      for (int64_t t = 0; t < tokens; ++t) {
        SCOPED_TRACE(testing::Message() << "tokens " << tokens << " norm " << norm << " row " << t);
        ASSERT_EQ(0, std::memcmp(split.q(t), alone.q(t), static_cast<size_t>(k)));
        ASSERT_EQ(0, std::memcmp(split.scale(t), alone.scale(t), nb * sizeof(float)));
        ASSERT_EQ(0, std::memcmp(split.sum(t), alone.sum(t), nb * sizeof(int32_t)));
        ASSERT_EQ(0, std::memcmp(split.scaled_sum(t), alone.scaled_sum(t), nb * sizeof(float)));
        ASSERT_EQ(0, std::memcmp(split.half_sum(t), alone.half_sum(t), 2 * nb * sizeof(int32_t)));
      }
    }
  }
}

struct Shape {
  int64_t tokens, rows, k;
};

// Random shapes, odd ones included: every path bit-identical to the scalar path, and all within
// f32 rounding of the double-precision product of the dequantized operands.
TEST(QuantMatmulTest, EveryPathMatchesScalarAndTheDequantizedProduct) {
  ThreadPool pool(3);
  std::mt19937 rng(11);
  for (DType dtype : kTypes) {
    // 16 tokens and more also run the AMX path's 16-token groups where the CPU has AMX.
    for (Shape s :
         {Shape{1, 1, 32}, Shape{1, 16, 64}, Shape{3, 17, 96}, Shape{8, 33, 32}, Shape{9, 5, 576},
          Shape{19, 100, 160}, Shape{1, 47, 896}, Shape{16, 16, 32}, Shape{35, 33, 96}, Shape{50, 7, 608}}) {
      s.k = k_for(dtype, s.k);
      SCOPED_TRACE(std::string(dtype_info(dtype).name) + " T=" + std::to_string(s.tokens) +
                   " N=" + std::to_string(s.rows) + " K=" + std::to_string(s.k));
      std::vector<std::byte> storage;
      TensorView w = test::random_tensor(dtype, s.rows, s.k, rng, &storage);
      auto x = test::random_floats(static_cast<size_t>(s.tokens * s.k), rng);
      auto bias = test::random_floats(static_cast<size_t>(s.rows), rng);
      QuantizedActivations xq;
      xq.quantize(x.data(), s.tokens, s.k);
      const TensorView* parts[] = {&w};
      auto packed = PackedWeight::pack(parts);
      ASSERT_TRUE(packed.has_value()) << packed.status().message();
      const auto want = reference(w, dequantized(xq), s.tokens, bias.data());
      std::vector<float> scalar(static_cast<size_t>(s.tokens * s.rows));
      for (Isa isa : paths()) {
        SCOPED_TRACE(std::string(isa_name(isa)));
        std::vector<float> got(scalar.size(), -1.0f);
        const QuantMatmulOutput out{got.data(), s.rows, bias.data()};
        quant_matmul(xq, *packed, {&out, 1}, pool, isa);
        if (isa == Isa::kScalar) scalar = got;
        ASSERT_EQ(0, std::memcmp(scalar.data(), got.data(), got.size() * sizeof(float)));
        expect_near_product(got, want);
      }
    }
  }
}

// Against the f32 activations, the int8 rounding costs at most half a step per value.
TEST(QuantMatmulTest, ErrorAgainstF32ActivationsIsBoundedByTheRounding) {
  ThreadPool pool(2);
  std::mt19937 rng(3);
  for (DType dtype : kTypes) {
    std::vector<std::byte> storage;
    TensorView w = test::random_tensor(dtype, 24, 256, rng, &storage);
    auto x = test::random_floats(4 * 256, rng);
    QuantizedActivations xq;
    xq.quantize(x.data(), 4, 256);
    const TensorView* parts[] = {&w};
    auto packed = PackedWeight::pack(parts);
    ASSERT_TRUE(packed.has_value());
    std::vector<float> got(4 * 24);
    const QuantMatmulOutput out{got.data(), 24, nullptr};
    quant_matmul(xq, *packed, {&out, 1}, pool);
    const auto exact = reference(w, x, 4, nullptr);
    std::vector<float> row(256);
    for (int64_t r = 0; r < 24; ++r) {
      dequantize_tensor_row(w, r, row.data());
      for (int64_t t = 0; t < 4; ++t) {
        double bound = 1e-5;
        for (int64_t i = 0; i < 256; ++i)
          bound += std::fabs(row[static_cast<size_t>(i)]) * 0.5001 * xq.scale(t)[i / 32];
        EXPECT_LE(std::fabs(got[static_cast<size_t>(t * 24 + r)] - exact[static_cast<size_t>(t * 24 + r)]),
                  bound);
      }
    }
  }
}

// Batch invariance: a token's outputs do not depend on the other tokens or the thread count.
TEST(QuantMatmulTest, TokenResultsIndependentOfBatchAndThreads) {
  std::mt19937 rng(99);
  for (DType dtype : kTypes) {
    const int64_t k = k_for(dtype, 96);
    std::vector<std::byte> storage;
    TensorView w = test::random_tensor(dtype, 45, k, rng, &storage);
    const TensorView* parts[] = {&w};
    auto packed = PackedWeight::pack(parts);
    ASSERT_TRUE(packed.has_value());
    auto x = test::random_floats(21 * k, rng);
    QuantizedActivations all;
    all.quantize(x.data(), 21, k);
    std::vector<float> batched(21 * 45);
    ThreadPool pool4(4);
    const QuantMatmulOutput out{batched.data(), 45, nullptr};
    quant_matmul(all, *packed, {&out, 1}, pool4);
    ThreadPool pool1(1);
    for (int64_t t = 0; t < 21; ++t) {
      QuantizedActivations one;
      one.quantize(x.data() + t * k, 1, k);
      std::vector<float> alone(45);
      const QuantMatmulOutput o{alone.data(), 45, nullptr};
      quant_matmul(one, *packed, {&o, 1}, pool1);
      for (int64_t n = 0; n < 45; ++n)
        ASSERT_EQ(alone[static_cast<size_t>(n)], batched[static_cast<size_t>(t * 45 + n)]);
    }
  }
}

// Q, K and V packed as one matmul give each part exactly what it gives alone, bias included.
TEST(QuantMatmulTest, FusedPartsEqualSeparateMatmuls) {
  ThreadPool pool(2);
  std::mt19937 rng(5);
  for (DType dtype : kTypes) {
    const int64_t cols = k_for(dtype, 64);
    std::vector<std::byte> sq, sk, sv;
    TensorView q = test::random_tensor(dtype, 40, cols, rng, &sq);
    TensorView k = test::random_tensor(dtype, 7, cols, rng, &sk);
    TensorView v = test::random_tensor(dtype, 21, cols, rng, &sv);
    auto x = test::random_floats(19 * cols, rng);
    auto bias = test::random_floats(40 + 7 + 21, rng);
    QuantizedActivations xq;
    xq.quantize(x.data(), 19, cols);
    const TensorView* all[] = {&q, &k, &v};
    auto fused = PackedWeight::pack(all);
    ASSERT_TRUE(fused.has_value());
    EXPECT_EQ(fused->num_parts(), 3u);
    EXPECT_EQ(fused->tiles(), 3 + 1 + 2);
    std::vector<float> yq(19 * 40), yk(19 * 7), yv(19 * 21);
    const QuantMatmulOutput outs[3] = {
        {yq.data(), 40, bias.data()}, {yk.data(), 7, bias.data() + 40}, {yv.data(), 21, bias.data() + 47}};
    quant_matmul(xq, *fused, outs, pool);
    const TensorView* views[] = {&q, &k, &v};
    std::vector<float>* ys[] = {&yq, &yk, &yv};
    const float* biases[] = {bias.data(), bias.data() + 40, bias.data() + 47};
    for (int p = 0; p < 3; ++p) {
      const TensorView* one[] = {views[p]};
      auto alone = PackedWeight::pack(one);
      ASSERT_TRUE(alone.has_value());
      const int64_t rows = views[p]->num_rows();
      std::vector<float> y(static_cast<size_t>(19 * rows));
      const QuantMatmulOutput o{y.data(), rows, biases[p]};
      quant_matmul(xq, *alone, {&o, 1}, pool);
      EXPECT_EQ(y, *ys[p]) << "part " << p;
    }
  }
}

// Gate and up packed for SwiGLU give silu(gate) * up of the two separate matmuls.
TEST(QuantMatmulTest, SwigluEqualsSiluOfGateTimesUp) {
  ThreadPool pool(2);
  std::mt19937 rng(8);
  for (DType dtype : kTypes) {
    const int64_t k = k_for(dtype, 96);
    std::vector<std::byte> sg, su;
    TensorView gate = test::random_tensor(dtype, 37, k, rng, &sg);
    TensorView up = test::random_tensor(dtype, 37, k, rng, &su);
    auto x = test::random_floats(26 * k, rng);
    QuantizedActivations xq;
    xq.quantize(x.data(), 26, k);
    auto fused = PackedWeight::pack_swiglu(gate, up);
    ASSERT_TRUE(fused.has_value());
    std::vector<float> y(26 * 37);
    const QuantMatmulOutput out{y.data(), 37, nullptr};
    quant_matmul(xq, *fused, {&out, 1}, pool);
    for (Isa isa : paths()) {  // every path gives the same bits
      std::vector<float> other(y.size());
      const QuantMatmulOutput o{other.data(), 37, nullptr};
      quant_matmul(xq, *fused, {&o, 1}, pool, isa);
      ASSERT_EQ(other, y) << isa_name(isa);
    }
    std::vector<float> g(y.size()), u(y.size());
    for (auto [view, dst] : {std::pair{&gate, &g}, std::pair{&up, &u}}) {
      const TensorView* one[] = {view};
      auto packed = PackedWeight::pack(one);
      ASSERT_TRUE(packed.has_value());
      const QuantMatmulOutput o{dst->data(), 37, nullptr};
      quant_matmul(xq, *packed, {&o, 1}, pool);
    }
    // The epilogue's exp is a polynomial within a few ulp of libm's.
    for (size_t i = 0; i < y.size(); ++i) {
      const float want = g[i] / (1.0f + std::exp(-g[i])) * u[i];
      ASSERT_NEAR(y[i], want, 4e-7f * std::max(1.0f, std::fabs(want)));
    }
    // Two outputs: gate and up as they are (what LoRA updates before the silu), bit for bit the
    // separate matmuls, on every path.
    for (Isa isa : paths()) {
      std::vector<float> rg(y.size()), ru(y.size());
      const QuantMatmulOutput raw[2] = {{rg.data(), 37, nullptr}, {ru.data(), 37, nullptr}};
      quant_matmul(xq, *fused, raw, pool, isa);
      ASSERT_EQ(rg, g) << isa_name(isa);
      ASSERT_EQ(ru, u) << isa_name(isa);
    }
  }
}

// The bytes of a packed weight, all of them.
std::vector<std::byte> packed_bytes(const PackedWeight& w) {
  return {w.tile(0), w.tile(0) + w.num_bytes()};
}

// Packing is split over a pool's threads by tiles: the bytes are those of packing on one thread,
// for every dtype, parts that end inside a tile, SwiGLU pairs, and weights of 4 MiB and more (whose
// memory the packer does not memset: each tile is zeroed where it is packed).
TEST(QuantMatmulTest, PackingOverAPoolGivesTheSameBytes) {
  ThreadPool pool(3);
  std::mt19937 rng(12);
  std::vector<DType> types(std::begin(kTypes), std::end(kTypes));
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16, DType::kF8_E4M3}) types.push_back(dtype);
  for (DType dtype : types) {
    SCOPED_TRACE(dtype_info(dtype).name);
    const int64_t k = PackedWeight::is_float_dtype(dtype) ? 83 : k_for(dtype, 96);
    std::vector<std::byte> sa, sb, sc;
    TensorView a = test::random_tensor(dtype, 37, k, rng, &sa);
    TensorView b = test::random_tensor(dtype, 21, k, rng, &sb);
    TensorView c = test::random_tensor(dtype, 37, k, rng, &sc);
    const TensorView* parts[] = {&a, &b};
    auto serial = PackedWeight::pack(parts);
    auto pooled = PackedWeight::pack(parts, &pool);
    ASSERT_TRUE(serial.has_value() && pooled.has_value());
    ASSERT_EQ(packed_bytes(*serial), packed_bytes(*pooled));
    auto serial_swiglu = PackedWeight::pack_swiglu(a, c);
    auto pooled_swiglu = PackedWeight::pack_swiglu(a, c, &pool);
    ASSERT_TRUE(serial_swiglu.has_value() && pooled_swiglu.has_value());
    ASSERT_EQ(packed_bytes(*serial_swiglu), packed_bytes(*pooled_swiglu));
  }
  for (DType dtype : {DType::kQ8_0, DType::kBF16, DType::kQ6_K}) {
    SCOPED_TRACE("large " + std::string(dtype_info(dtype).name));
    std::vector<std::byte> storage;
    TensorView w = test::random_tensor(dtype, 2053, dtype == DType::kBF16 ? 1033 : 2560, rng, &storage);
    const TensorView* parts[] = {&w};
    auto serial = PackedWeight::pack(parts);
    auto pooled = PackedWeight::pack(parts, &pool);
    ASSERT_TRUE(serial.has_value() && pooled.has_value());
    ASSERT_GE(serial->num_bytes(), size_t{4} << 20);
    ASSERT_EQ(packed_bytes(*serial), packed_bytes(*pooled));
  }
}

TEST(FloatMatmulTest, SwigluWithTwoOutputsGivesGateAndUpAsTheSeparateMatmuls) {
  ThreadPool pool(2);
  std::mt19937 rng(18);
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    const int64_t k = 70;
    std::vector<std::byte> sg, su;
    TensorView gate = test::random_tensor(dtype, 37, k, rng, &sg);
    TensorView up = test::random_tensor(dtype, 37, k, rng, &su);
    auto x = test::random_floats(9 * k, rng);
    auto fused = PackedWeight::pack_swiglu(gate, up);
    ASSERT_TRUE(fused.has_value());
    std::vector<float> g(9 * 37), u(9 * 37);
    for (auto [view, dst] : {std::pair{&gate, &g}, std::pair{&up, &u}}) {
      const TensorView* one[] = {view};
      auto packed = PackedWeight::pack(one);
      ASSERT_TRUE(packed.has_value());
      const QuantMatmulOutput o{dst->data(), 37, nullptr};
      float_matmul(x.data(), 9, *packed, {&o, 1}, pool);
    }
    std::vector<float> rg(g.size()), ru(u.size());
    const QuantMatmulOutput raw[2] = {{rg.data(), 37, nullptr}, {ru.data(), 37, nullptr}};
    float_matmul(x.data(), 9, *fused, raw, pool);
    EXPECT_EQ(rg, g) << dtype_info(dtype).name;
    EXPECT_EQ(ru, u) << dtype_info(dtype).name;
  }
}

// A kernel setting (get / set) held at one value for the guard's lifetime; the one before after.
template <typename T, T (*Get)(), void (*Set)(T)>
class ScopedSetting final {
 public:
  explicit ScopedSetting(T value) : saved_(Get()) { Set(value); }
  ~ScopedSetting() { Set(saved_); }
  ScopedSetting(const ScopedSetting&) = delete;
  ScopedSetting& operator=(const ScopedSetting&) = delete;

 private:
  T saved_;
};
using ScopedFloatBlocking = ScopedSetting<FloatBlocking, float_blocking, set_float_blocking>;
using ScopedAmxInt8Kernel = ScopedSetting<AmxInt8Kernel, amx_int8_kernel, set_amx_int8_kernel>;

const char* blocking_name(FloatBlocking b) {
  return b == FloatBlocking::kPairs ? "pairs" : "wide";
}

// Float weights run two tiles per kernel call from kPairMinTokens tokens on (FloatBlocking::kPairs;
// BF16 always), or one tile for up to 12 tokens (kWide, F32 and F16): a fused Q, K, V weight whose
// pairs of tiles straddle its parts (tiles 0-1 Q, 2-3 Q's last and K, 4-5 V) gives each part, bias
// included, the bits of the part alone (whose tiles pair differently), and of each token alone
// (one tile per call), on every path and with either blocking.
TEST(FloatMatmulTest, FusedPartsEqualSeparateMatmulsAndTokensAlone) {
  ThreadPool pool(2);
  std::mt19937 rng(31);
  for (auto [dtype, blocking] :
       {std::pair{DType::kF32, FloatBlocking::kPairs}, std::pair{DType::kF32, FloatBlocking::kWide},
        std::pair{DType::kF16, FloatBlocking::kPairs}, std::pair{DType::kF16, FloatBlocking::kWide},
        std::pair{DType::kBF16, FloatBlocking::kWide}, std::pair{DType::kF8_E4M3, FloatBlocking::kWide}}) {
    SCOPED_TRACE(std::string(dtype_info(dtype).name) + " " + blocking_name(blocking));
    const ScopedFloatBlocking scoped(blocking);
    const int64_t cols = 75;
    std::vector<std::byte> sq, sk, sv;
    TensorView q = test::random_tensor(dtype, 40, cols, rng, &sq);
    TensorView k = test::random_tensor(dtype, 7, cols, rng, &sk);
    TensorView v = test::random_tensor(dtype, 21, cols, rng, &sv);
    auto bias = test::random_floats(40 + 7 + 21, rng);
    const TensorView* all[] = {&q, &k, &v};
    auto fused = PackedWeight::pack(all);
    ASSERT_TRUE(fused.has_value());
    ASSERT_EQ(fused->tiles(), 3 + 1 + 2);
    const TensorView* views[] = {&q, &k, &v};
    const float* biases[] = {bias.data(), bias.data() + 40, bias.data() + 47};
    for (Isa isa : paths()) {
      for (int64_t tokens : {27, 19, 5, 4}) {
        SCOPED_TRACE(std::string(isa_name(isa)) + " T=" + std::to_string(tokens));
        auto x = test::random_floats(static_cast<size_t>(tokens * cols), rng);
        std::vector<float> yq(static_cast<size_t>(tokens * 40)), yk(static_cast<size_t>(tokens * 7)),
            yv(static_cast<size_t>(tokens * 21));
        std::vector<float>* ys[] = {&yq, &yk, &yv};
        const QuantMatmulOutput outs[3] = {
            {yq.data(), 40, biases[0]}, {yk.data(), 7, biases[1]}, {yv.data(), 21, biases[2]}};
        float_matmul(x.data(), tokens, *fused, outs, pool, isa);
        for (int p = 0; p < 3; ++p) {
          const TensorView* one[] = {views[p]};
          auto alone = PackedWeight::pack(one);
          ASSERT_TRUE(alone.has_value());
          const int64_t rows = views[p]->num_rows();
          std::vector<float> y(static_cast<size_t>(tokens * rows));
          const QuantMatmulOutput o{y.data(), rows, biases[p]};
          float_matmul(x.data(), tokens, *alone, {&o, 1}, pool, isa);
          ASSERT_EQ(y, *ys[p]) << "part " << p;
          for (int64_t t = 0; t < tokens; ++t) {
            std::vector<float> one_token(static_cast<size_t>(rows));
            const QuantMatmulOutput ot{one_token.data(), rows, biases[p]};
            float_matmul(x.data() + t * cols, 1, *alone, {&ot, 1}, pool, isa);
            ASSERT_TRUE(std::equal(one_token.begin(), one_token.end(), y.begin() + t * rows))
                << "part " << p << " token " << t;
          }
        }
      }
    }
  }
}

// The AMX path (groups of 16 tokens on AMX-INT8 tiles, the rest on the VNNI kernel) gives the
// VNNI path's bits for every type, including a weight packed at the address of one freed just
// before (each thread keeps a tile's prepared weights for the rest of one call only).
TEST(QuantMatmulTest, AmxTilesGiveTheVnniBits) {
  const std::vector<test::AmxUnit> units = test::amx_units(false);
  if (units.empty())
    GTEST_SKIP() << "this CPU has neither AMX-INT8 tiles nor the VNNI path the emulated ones need";
  ThreadPool pool(2);
  for (const test::AmxUnit& unit : units)
    for (AmxInt8Kernel kernel : {AmxInt8Kernel::kPipelined, AmxInt8Kernel::kPingPong})
      for (DType dtype : kTypes) {
        const test::ScopedAmxEmulation emulation(unit.emulated);
        const ScopedAmxInt8Kernel chosen(kernel);
        std::mt19937 rng(31);
        SCOPED_TRACE(std::string(dtype_info(dtype).name) + " on " + unit.name +
                     (kernel == AmxInt8Kernel::kPingPong ? ", ping-pong kernel" : ", pipelined kernel"));
        const int64_t k = k_for(dtype, 320), rows = 70, tokens = 53;  // 3 groups of 16, then 5
        auto x = test::random_floats(static_cast<size_t>(tokens * k), rng);
        QuantizedActivations xq;
        xq.quantize(x.data(), tokens, k);
        for (int round = 0; round < 2; ++round) {
          std::vector<std::byte> storage;
          TensorView w = test::random_tensor(dtype, rows, k, rng, &storage);
          const TensorView* parts[] = {&w};
          auto packed = PackedWeight::pack(parts);
          ASSERT_TRUE(packed.has_value());
          std::vector<float> vnni(static_cast<size_t>(tokens * rows)), amx(vnni.size());
          const QuantMatmulOutput ov{vnni.data(), rows, nullptr}, oa{amx.data(), rows, nullptr};
          quant_matmul(xq, *packed, {&ov, 1}, pool, Isa::kVnni);
          quant_matmul(xq, *packed, {&oa, 1}, pool, Isa::kAmx);
          ASSERT_EQ(0, std::memcmp(vnni.data(), amx.data(), amx.size() * sizeof(float))) << "round " << round;
        }
      }
}

// AMX-BF16 (every token count of BF16 weights on CPUs with it): within f32 rounding of the
// double product of the bf16-rounded operands, and a token's result the same alone, in a group of
// 16, in a padded last group, in a SwiGLU unit, and through a weight packed where a freed one was.
TEST(FloatMatmulTest, AmxBf16IsWithinTheBoundAndBatchInvariant) {
  const std::vector<test::AmxUnit> units = test::amx_units(true);
  if (units.empty())
    GTEST_SKIP() << "this CPU has neither AMX-BF16 tiles nor the VNNI path the emulated ones need";
  ThreadPool pool(2);
  for (const test::AmxUnit& unit : units)
    for (int64_t k : {1, 15, 16, 37, 101, 896}) {
      const test::ScopedAmxEmulation emulation(unit.emulated);
      std::mt19937 rng(41 + static_cast<unsigned>(k));
      for (int round = 0; round < 2; ++round) {
        const int64_t rows = 35, tokens = 37;  // two groups of 16 and a padded one of 5
        SCOPED_TRACE("K=" + std::to_string(k) + " round " + std::to_string(round) + " on " + unit.name);
        std::vector<std::byte> sg, su;
        TensorView gate = test::random_tensor(DType::kBF16, rows, k, rng, &sg);
        TensorView up = test::random_tensor(DType::kBF16, rows, k, rng, &su);
        auto x = test::random_floats(static_cast<size_t>(tokens * k), rng);
        std::vector<float> xr = x;
        for (float& f : xr) f = bf16_to_f32(f32_to_bf16(f));
        const TensorView* one[] = {&gate};
        auto packed = PackedWeight::pack(one);
        auto fused = PackedWeight::pack_swiglu(gate, up);
        ASSERT_TRUE(packed.has_value() && fused.has_value());
        std::vector<float> batch(static_cast<size_t>(tokens * rows));
        const QuantMatmulOutput out{batch.data(), rows, nullptr};
        float_matmul(x.data(), tokens, *packed, {&out, 1}, pool, Isa::kAmx);
        expect_near_product(batch, reference(gate, xr, tokens, nullptr));
        std::vector<float> g(batch.size()), u(batch.size());
        const QuantMatmulOutput raw[2] = {{g.data(), rows, nullptr}, {u.data(), rows, nullptr}};
        float_matmul(x.data(), tokens, *fused, raw, pool, Isa::kAmx);
        ASSERT_EQ(g, batch);
        for (int64_t t = 0; t < tokens; t += 6) {
          std::vector<float> alone(static_cast<size_t>(rows));
          const QuantMatmulOutput o{alone.data(), rows, nullptr};
          float_matmul(x.data() + t * k, 1, *packed, {&o, 1}, pool, Isa::kAmx);
          ASSERT_TRUE(std::equal(alone.begin(), alone.end(), batch.begin() + t * rows)) << "token " << t;
        }
      }
    }
}

TEST(QuantMatmulTest, PackingRejectsWhatTheKernelsCannotTake) {
  std::mt19937 rng(1);
  std::vector<std::byte> s1, s2, s3;
  TensorView cube = test::random_tensor(DType::kQ8_0, 4, 64, rng, &s1);
  TensorView q8 = test::random_tensor(DType::kQ8_0, 4, 64, rng, &s2);
  TensorView q4 = test::random_tensor(DType::kQ4_0, 5, 64, rng, &s3);
  cube.name = "blk.0.attn_q.weight";
  cube.num_dims = 3;
  cube.shape = {2, 2, 64, 1};
  const TensorView* a[] = {&cube};
  auto r = PackedWeight::pack(a);
  ASSERT_FALSE(r.has_value());
  EXPECT_NE(r.status().message().find("blk.0.attn_q.weight"), std::string::npos);
  const TensorView* mixed[] = {&q8, &q4};
  EXPECT_FALSE(PackedWeight::pack(mixed).has_value());
  EXPECT_TRUE(PackedWeight::pack_swiglu(q4, q4).has_value());
  TensorView q4b = q4;
  q4b.shape = {4, 64, 1, 1};
  EXPECT_FALSE(PackedWeight::pack_swiglu(q4, q4b).has_value());
  // INT4 groups keep their scale and min once per group: 16 rows x 128 values in 32 + 32 + 4 x 256
  // bytes (G64: 32 + 32 + 2 x 256 per 64 values), not repeated per block of 32 as in Q4_1.
  for (DType dtype : {DType::kQ4_G128, DType::kQ4_G64}) {
    std::vector<std::byte> sg;
    TensorView g = test::random_tensor(dtype, 20, 256, rng, &sg);
    const TensorView* group[] = {&g};
    auto packed = PackedWeight::pack(group);
    ASSERT_TRUE(packed.has_value());
    const size_t per_group = dtype == DType::kQ4_G128 ? 1088 : 576;
    EXPECT_EQ(packed->num_bytes(), 2 * (256 / static_cast<size_t>(q4_group_size(dtype))) * per_group);
  }
  // A row-scaled matrix without its scales.
  std::vector<std::byte> s4;
  TensorView i8 = test::random_tensor(DType::kI8, 4, 64, rng, &s4);
  i8.row_scale = nullptr;
  const TensorView* unscaled[] = {&i8};
  EXPECT_FALSE(PackedWeight::pack(unscaled).has_value());
}

// Decode streams every packed byte once per token, so a packed block format holds no more than
// the file does (per 16 rows, K-quants add one copy of d / dmin per superblock: under 3 %; Q3_K's
// 6-bit sub-scales kept as bytes: 3.6 %): the bits above a nibble or 2-bit quant (Q5_0, Q5_1,
// Q5_K, Q6_K, Q3_K) go in planes of 1 or 2 bits, and K-quants keep their integer sub-scales
// beside one f16 d per row and superblock. The exception is the grid types, whose grid points
// are expanded at load to a code per value (sign and level): IQ3_XXS and IQ3_S a nibble, packed
// as IQ4_XS, no larger than a Q4_K file of the shape; IQ2_S, IQ2_XS, IQ2_XXS, IQ1_S and IQ1_M 3
// bits (a crumb and a plane bit), packed as Q3_K, no larger than a Q3_K file. The ternary types
// (TQ1_0, TQ2_0) pack as 2-bit quants with an f16 d per block of 32: no larger than a Q2_K file.
TEST(QuantMatmulTest, PackedBlockFormatsAreNoLargerThanTheFile) {
  std::mt19937 rng(5);
  for (DType dtype : kTypes) {
    if (dtype == DType::kI8) continue;  // its row scales are a separate tensor in the file
    std::vector<std::byte> storage;
    const TensorView w = test::random_tensor(dtype, 32, 512, rng, &storage);
    const TensorView* parts[] = {&w};
    auto packed = PackedWeight::pack(parts);
    ASSERT_TRUE(packed.has_value());
    const double file = static_cast<double>(w.num_bytes);
    const bool grid3 = dtype == DType::kIQ3_XXS || dtype == DType::kIQ3_S;
    const bool grid2 = dtype == DType::kIQ2_S || dtype == DType::kIQ2_XS || dtype == DType::kIQ2_XXS ||
                       dtype == DType::kIQ1_S || dtype == DType::kIQ1_M;
    const bool ternary = dtype == DType::kTQ1_0 || dtype == DType::kTQ2_0;
    const double bound = grid3     ? static_cast<double>(dtype_bytes(DType::kQ4_K, 32 * 512))
                         : grid2   ? static_cast<double>(dtype_bytes(DType::kQ3_K, 32 * 512))
                         : ternary ? static_cast<double>(dtype_bytes(DType::kQ2_K, 32 * 512))
                                   : file;
    EXPECT_LE(static_cast<double>(packed->num_bytes()),
              (dtype == DType::kQ3_K || grid2 ? 1.04 : 1.03) * bound)
        << dtype_info(dtype).name;
    EXPECT_GE(static_cast<double>(packed->num_bytes()), file) << dtype_info(dtype).name;
  }
}

// Float weights: every path bit-identical (for BF16 the vdpbf16ps path, where the CPU has it,
// and the fma paths; F32 and F16 with either register blocking), within f32 rounding of the double
// product, odd sizes included; a token's outputs do not depend on the batch.
TEST(FloatMatmulTest, EveryPathMatchesScalarAndTheDoubleProduct) {
  ThreadPool pool(3);
  std::mt19937 rng(21);
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16, DType::kF8_E4M3}) {
    for (Shape s : {Shape{1, 1, 1}, Shape{3, 17, 37}, Shape{9, 16, 64}, Shape{12, 33, 100}, Shape{1, 40, 896},
                    Shape{20, 17, 101}, Shape{29, 35, 67}}) {
      SCOPED_TRACE(std::string(dtype_info(dtype).name) + " T=" + std::to_string(s.tokens) +
                   " N=" + std::to_string(s.rows) + " K=" + std::to_string(s.k));
      std::vector<std::byte> storage;
      TensorView w = test::random_tensor(dtype, s.rows, s.k, rng, &storage);
      auto x = test::random_floats(static_cast<size_t>(s.tokens * s.k), rng);
      auto bias = test::random_floats(static_cast<size_t>(s.rows), rng);
      const TensorView* parts[] = {&w};
      auto packed = PackedWeight::pack(parts);
      ASSERT_TRUE(packed.has_value()) << packed.status().message();
      ASSERT_TRUE(packed->is_float());
      // BF16 weights compute on bf16-rounded activations (the BF16 dot products): the double
      // product of those is what every path must be within f32 rounding of.
      std::vector<float> xr = x;
      if (dtype == DType::kBF16)
        for (float& f : xr) f = bf16_to_f32(f32_to_bf16(f));
      const auto want = reference(w, xr, s.tokens, bias.data());
      std::vector<float> scalar(static_cast<size_t>(s.tokens * s.rows)), active;
      for (Isa isa : paths()) {
        for (FloatBlocking blocking : {FloatBlocking::kPairs, FloatBlocking::kWide}) {
          const ScopedFloatBlocking scoped(blocking);
          std::vector<float> got(scalar.size());
          const QuantMatmulOutput out{got.data(), s.rows, bias.data()};
          float_matmul(x.data(), s.tokens, *packed, {&out, 1}, pool, isa);
          if (isa == Isa::kScalar) scalar = got;
          if (isa == active_isa()) active = got;
          // AMX-BF16 tiles round their pair sums their own way: within the bound, not the same bits.
          if (!(dtype == DType::kBF16 && isa == Isa::kAmx && cpu_has_amx_bf16())) {
            ASSERT_EQ(scalar, got) << isa_name(isa) << " " << blocking_name(blocking);
          }
          expect_near_product(got, want);
        }
      }
      // Token by token gives the batch's bits (on the path the engine runs).
      for (int64_t t = 0; t < s.tokens; ++t) {
        std::vector<float> alone(static_cast<size_t>(s.rows));
        const QuantMatmulOutput o{alone.data(), s.rows, bias.data()};
        float_matmul(x.data() + t * s.k, 1, *packed, {&o, 1}, pool);
        ASSERT_TRUE(std::equal(alone.begin(), alone.end(), active.begin() + t * s.rows));
      }
    }
  }
}

}  // namespace
}  // namespace inferd
