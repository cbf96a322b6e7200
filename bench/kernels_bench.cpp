// Kernel microbenchmarks against this machine's measured roofline (Google Benchmark):
//
//   build/kernels_bench [--benchmark_filter=...]
//
// Roofline: BM_ReadBandwidth streams a 512 MiB buffer (memory bandwidth, GB/s, all threads);
// BM_VnniPeak runs independent vpdpbusd chains (int8 multiply-adds per second per thread).
// Kernels report GB/s of weight bytes (decode: one token, bandwidth-bound) or GOP/s (int8 or f32
// multiply-adds x 2; prefill, compute-bound) at the shapes of Qwen2.5-0.5B's MLP (4864 x 896)
// and its attention (14 heads, 2 KV heads, head size 64).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include <cblas.h>
#include "common/half.h"
#include "common/thread_pool.h"
#include "kernels/attention.h"
#include "kernels/cpu_isa.h"
#include "kernels/lora.h"
#include "kernels/matmul.h"

#include "kernels/onednn_matmul.h"
#include "kernels/packed_matmul.h"
#include "kernels/simd.h"
#include "tensor/dtype.h"

namespace inferd {
namespace {

constexpr int kThreads = 2;

// Random block-quantized weights with sane scales (the scale fields written as small f16s).
struct RandomWeight {
  std::vector<std::byte> bytes;
  std::vector<float> row_scales;  // I8 / F8_E4M3
  TensorView view;
};

RandomWeight random_weight(DType dtype, int64_t rows, int64_t cols) {
  RandomWeight w;
  const DTypeInfo& info = dtype_info(dtype);
  w.bytes.resize(static_cast<size_t>(dtype_bytes(dtype, cols) * rows));
  std::mt19937 rng(1);
  for (auto& b : w.bytes) b = static_cast<std::byte>(rng() & 0xff);
  const uint16_t small = f32_to_f16(0.01f);
  const int64_t blocks = rows * cols / info.block_values;
  for (int64_t i = 0; i < blocks; ++i) {
    std::byte* blk = w.bytes.data() + i * info.block_bytes;
    switch (dtype) {
      case DType::kF32:
      case DType::kF16:
      case DType::kBF16:
      case DType::kI8:
      case DType::kF8_E4M3: break;
      case DType::kQ6_K: std::memcpy(blk + 208, &small, 2); break;
      case DType::kQ4_1:
      case DType::kQ5_1:
      case DType::kQ4_K:
      case DType::kQ5_K:
      case DType::kQ4_G128:
      case DType::kQ4_G64: std::memcpy(blk + 2, &small, 2); [[fallthrough]];
      default: std::memcpy(blk, &small, 2); break;
    }
  }
  if (dtype == DType::kF16) {
    for (int64_t i = 0; i < rows * cols; ++i) std::memcpy(w.bytes.data() + 2 * i, &small, 2);
  }
  // Finite, normal values where random bytes could be NaN or subnormal.
  if (dtype == DType::kF32) {
    for (int64_t i = 0; i < rows * cols; ++i) {
      const float v = 0.01f * static_cast<float>(i % 7 + 1);
      std::memcpy(w.bytes.data() + 4 * i, &v, 4);
    }
  }
  if (dtype == DType::kBF16) {
    for (int64_t i = 0; i < rows * cols; ++i) {
      const uint16_t v = f32_to_bf16(0.01f * static_cast<float>(i % 7 + 1));
      std::memcpy(w.bytes.data() + 2 * i, &v, 2);
    }
  }
  if (dtype == DType::kF8_E4M3) {
    for (auto& b : w.bytes) b = static_cast<std::byte>(static_cast<uint8_t>(b) & 0x77u);  // no NaN
  }
  if (dtype_has_row_scale(dtype)) {
    w.row_scales.assign(static_cast<size_t>(rows), 0.01f);
    w.view.row_scale = w.row_scales.data();
  }
  w.view.name = "bench";
  w.view.dtype = dtype;
  w.view.num_dims = 2;
  w.view.shape = {rows, cols, 1, 1};
  w.view.data = w.bytes.data();
  w.view.num_bytes = w.bytes.size();
  return w;
}

std::vector<float> random_floats(size_t n) {
  std::mt19937 rng(2);
  std::uniform_real_distribution<float> d(-1, 1);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// Labels a matmul run and reports GB/s of weight bytes and GOP/s (two per multiply-add).
void report_matmul(benchmark::State& state, DType dtype, int64_t tokens, int64_t n, int64_t k,
                   size_t weight_bytes) {
  state.SetLabel(std::string(dtype_info(dtype).name) + " T=" + std::to_string(tokens));
  const double iters = static_cast<double>(state.iterations());
  state.counters["GB/s"] =
      benchmark::Counter(static_cast<double>(weight_bytes) * iters / 1e9, benchmark::Counter::kIsRate);
  state.counters["GOP/s"] = benchmark::Counter(2.0 * static_cast<double>(tokens * n * k) * iters / 1e9,
                                               benchmark::Counter::kIsRate);
}

void BM_ReadBandwidth(benchmark::State& state) {
  const size_t n = size_t{512} << 20;
  std::vector<uint64_t> buf(n / 8, 1);
  ThreadPool pool(kThreads);
  for (auto _ : state) {
    uint64_t sums[kThreads] = {};
    pool.parallel_for(kThreads, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        const size_t lo = buf.size() * static_cast<size_t>(t) / kThreads;
        const size_t hi = buf.size() * static_cast<size_t>(t + 1) / kThreads;
        uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
        for (size_t i = lo; i + 4 <= hi; i += 4) {
          s0 += buf[i];
          s1 += buf[i + 1];
          s2 += buf[i + 2];
          s3 += buf[i + 3];
        }
        sums[t] = s0 + s1 + s2 + s3;
      }
    });
    benchmark::DoNotOptimize(sums);
  }
  state.counters["GB/s"] = benchmark::Counter(
      static_cast<double>(n) * static_cast<double>(state.iterations()) / 1e9, benchmark::Counter::kIsRate);
}
BENCHMARK(BM_ReadBandwidth)->Unit(benchmark::kMillisecond)->UseRealTime();

#if defined(__x86_64__)
INFERD_VNNI void vnni_chains(int64_t iters, int32_t* out) {
  __m512i acc[8];
  for (auto& a : acc) a = _mm512_setzero_si512();
  const __m512i x = _mm512_set1_epi8(3), y = _mm512_set1_epi8(5);
  for (int64_t i = 0; i < iters; ++i)
    for (auto& a : acc) a = _mm512_dpbusd_epi32(a, x, y);
  __m512i s = acc[0];
  for (int j = 1; j < 8; ++j) s = _mm512_add_epi32(s, acc[j]);
  alignas(64) int32_t lanes[16];
  _mm512_store_si512(lanes, s);
  *out = lanes[0];
}

// One thread's peak: int8 ops (2 per multiply-add) per second.
void BM_VnniPeak(benchmark::State& state) {
  if (static_cast<int>(detected_isa()) < static_cast<int>(Isa::kVnni)) {
    state.SkipWithError("no AVX512-VNNI");
    return;
  }
  const int64_t iters = 1 << 20;
  int32_t out = 0;
  for (auto _ : state) {
    vnni_chains(iters, &out);
    benchmark::DoNotOptimize(out);
  }
  state.counters["GOP/s"] = benchmark::Counter(
      2.0 * 64 * 8 * static_cast<double>(iters) * static_cast<double>(state.iterations()) / 1e9,
      benchmark::Counter::kIsRate);
}
BENCHMARK(BM_VnniPeak)->UseRealTime();
#endif

// Integer matmul of T tokens by an N x K quantized weight (activation quantization included).
void BM_QuantMatmul(benchmark::State& state) {
  const auto dtype = static_cast<DType>(state.range(0));
  const int64_t tokens = state.range(1), n = 4864, k = 896 * (dtype_info(dtype).block_values == 256 ? 2 : 1);
  RandomWeight w = random_weight(dtype, n, k);
  const TensorView* parts[] = {&w.view};
  auto packed = PackedWeight::pack(parts);
  if (!packed) {
    state.SkipWithError(packed.status().message().c_str());
    return;
  }
  auto x = random_floats(static_cast<size_t>(tokens * k));
  std::vector<float> y(static_cast<size_t>(tokens * n));
  QuantizedActivations xq;
  ThreadPool pool(kThreads);
  const QuantMatmulOutput out{y.data(), n, nullptr};
  for (auto _ : state) {
    xq.quantize(x.data(), tokens, k);
    quant_matmul(xq, *packed, {&out, 1}, pool);
    benchmark::DoNotOptimize(y.data());
  }
  report_matmul(state, dtype, tokens, n, k, packed->num_bytes());
}
BENCHMARK(BM_QuantMatmul)
    ->ArgsProduct({{static_cast<int64_t>(DType::kQ8_0), static_cast<int64_t>(DType::kQ4_0),
                    static_cast<int64_t>(DType::kQ4_1), static_cast<int64_t>(DType::kQ4_K),
                    static_cast<int64_t>(DType::kQ6_K), static_cast<int64_t>(DType::kI8),
                    static_cast<int64_t>(DType::kQ4_G128), static_cast<int64_t>(DType::kQ5_K),
                    static_cast<int64_t>(DType::kQ3_K), static_cast<int64_t>(DType::kQ2_K),
                    static_cast<int64_t>(DType::kIQ4_XS), static_cast<int64_t>(DType::kIQ3_S),
                    static_cast<int64_t>(DType::kIQ2_XXS), static_cast<int64_t>(DType::kIQ2_S),
                    static_cast<int64_t>(DType::kIQ1_S), static_cast<int64_t>(DType::kIQ1_M),
                    static_cast<int64_t>(DType::kTQ2_0)},
                   {1, 16, 512}})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

// Packing one N x K weight at load (part of every start), on kThreads threads: GB/s of the
// file's bytes.
void BM_Pack(benchmark::State& state) {
  const auto dtype = static_cast<DType>(state.range(0));
  const int64_t n = 4864, k = 1792;
  RandomWeight w = random_weight(dtype, n, k);
  const TensorView* parts[] = {&w.view};
  ThreadPool pool(kThreads);
  for (auto _ : state) {
    auto packed = PackedWeight::pack(parts, &pool);
    if (!packed) {
      state.SkipWithError(packed.status().message().c_str());
      return;
    }
    benchmark::DoNotOptimize(packed->tile(0));
  }
  state.SetLabel(std::string(dtype_info(dtype).name));
  state.counters["GB/s"] =
      benchmark::Counter(static_cast<double>(w.bytes.size()) * static_cast<double>(state.iterations()) / 1e9,
                         benchmark::Counter::kIsRate);
}
BENCHMARK(BM_Pack)
    ->ArgsProduct({{static_cast<int64_t>(DType::kF16), static_cast<int64_t>(DType::kBF16),
                    static_cast<int64_t>(DType::kQ8_0), static_cast<int64_t>(DType::kQ4_0),
                    static_cast<int64_t>(DType::kQ4_K), static_cast<int64_t>(DType::kQ6_K),
                    static_cast<int64_t>(DType::kQ3_K), static_cast<int64_t>(DType::kIQ4_XS),
                    static_cast<int64_t>(DType::kIQ3_S), static_cast<int64_t>(DType::kIQ2_XS),
                    static_cast<int64_t>(DType::kIQ2_S), static_cast<int64_t>(DType::kIQ1_M),
                    static_cast<int64_t>(DType::kTQ1_0)}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// The f32 path (weights expanded to f32 row by row), for comparison and for F16 weights.
void BM_F32Matmul(benchmark::State& state) {
  const auto dtype = static_cast<DType>(state.range(0));
  const int64_t tokens = state.range(1), n = 4864, k = 896;
  RandomWeight w = random_weight(dtype, n, k);
  auto x = random_floats(static_cast<size_t>(tokens * k));
  std::vector<float> y(static_cast<size_t>(tokens * n));
  ThreadPool pool(kThreads);
  for (auto _ : state) {
    matmul(x.data(), tokens, w.view, nullptr, y.data(), pool);
    benchmark::DoNotOptimize(y.data());
  }
  report_matmul(state, dtype, tokens, n, k, w.bytes.size());
}
BENCHMARK(BM_F32Matmul)
    ->ArgsProduct({{static_cast<int64_t>(DType::kF16), static_cast<int64_t>(DType::kQ8_0)}, {1, 16, 512}})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

// The packed float kernel (F32 / F16 / FP8 weights on f32 fmas, BF16 on BF16 dot products with
// activations rounded to bf16), what float models run by default.
// Qwen2.5-0.5B's gate/up shape (4864 x 896); BM_FloatMatmulDown: its down projection (896 x
// 4864), where a tile's K is 5.4x longer.
void float_matmul_bench(benchmark::State& state, int64_t n, int64_t k, int64_t tokens) {
  const auto dtype = static_cast<DType>(state.range(0));
  RandomWeight w = random_weight(dtype, n, k);
  const TensorView* parts[] = {&w.view};
  auto packed = PackedWeight::pack(parts);
  if (!packed) {
    state.SkipWithError(packed.status().message().c_str());
    return;
  }
  auto x = random_floats(static_cast<size_t>(tokens * k));
  std::vector<float> y(static_cast<size_t>(tokens * n));
  ThreadPool pool(kThreads);
  const QuantMatmulOutput out{y.data(), n, nullptr};
  for (auto _ : state) {
    float_matmul(x.data(), tokens, *packed, {&out, 1}, pool);
    benchmark::DoNotOptimize(y.data());
  }
  report_matmul(state, dtype, tokens, n, k, packed->num_bytes());
}
void BM_FloatMatmul(benchmark::State& state) {
  float_matmul_bench(state, 4864, 896, state.range(1));
}
BENCHMARK(BM_FloatMatmul)
    ->ArgsProduct({{static_cast<int64_t>(DType::kF32), static_cast<int64_t>(DType::kF16),
                    static_cast<int64_t>(DType::kBF16), static_cast<int64_t>(DType::kF8_E4M3)},
                   {1, 4, 16, 512}})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();
void BM_FloatMatmulDown(benchmark::State& state) {
  float_matmul_bench(state, 896, 4864, state.range(1));
}
BENCHMARK(BM_FloatMatmulDown)
    ->ArgsProduct({{static_cast<int64_t>(DType::kF16), static_cast<int64_t>(DType::kBF16)}, {512, 4096}})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

// The two register blockings of the F32 / F16 fma kernels (FloatBlocking: 0 pairs of tiles, 1
// one wide tile) at 512 tokens on the gate/up shape, whichever this CPU defaults to.
void BM_FloatBlocking(benchmark::State& state) {
  const FloatBlocking saved = float_blocking();
  set_float_blocking(static_cast<FloatBlocking>(state.range(1)));
  float_matmul_bench(state, 4864, 896, 512);
  set_float_blocking(saved);
  state.SetLabel(std::string(dtype_info(static_cast<DType>(state.range(0))).name) + " T=512 " +
                 (state.range(1) == 0 ? "pairs" : "wide"));
}
BENCHMARK(BM_FloatBlocking)
    ->ArgsProduct({{static_cast<int64_t>(DType::kF32), static_cast<int64_t>(DType::kF16)}, {0, 1}})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

// oneDNN's GEMM (`--matmul onednn`), the library next to our float kernel: F32 (what it does on
// f32 weights) and BF16 (activations rounded to bf16), one slice per pool thread.
void BM_OneDnnMatmul(benchmark::State& state) {
  if (!OneDnnWeight::available()) {
    state.SkipWithError("built without oneDNN");
    return;
  }
  const auto dtype = static_cast<DType>(state.range(0));
  const int64_t tokens = state.range(1), n = 4864, k = 896;
  RandomWeight w = random_weight(dtype, n, k);
  const TensorView* parts[] = {&w.view};
  ThreadPool pool(kThreads);
  auto weight = OneDnnWeight::create(parts, false, kThreads);
  if (!weight) {
    state.SkipWithError(weight.status().message().c_str());
    return;
  }
  auto x = random_floats(static_cast<size_t>(tokens * k));
  std::vector<float> y(static_cast<size_t>(tokens * n));
  const QuantMatmulOutput out{y.data(), n, nullptr};
  for (auto _ : state) {
    weight->run(x.data(), tokens, {&out, 1}, pool);
    benchmark::DoNotOptimize(y.data());
  }
  report_matmul(state, dtype, tokens, n, k, w.bytes.size());
}
BENCHMARK(BM_OneDnnMatmul)
    ->ArgsProduct({{static_cast<int64_t>(DType::kF32), static_cast<int64_t>(DType::kBF16)}, {1, 16, 512}})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

// OpenBLAS's sgemm on the same shape (f32 weights), the other Debian library the issue names.
void BM_OpenBlasSgemm(benchmark::State& state) {
  const int64_t tokens = state.range(0), n = 4864, k = 896;
  RandomWeight w = random_weight(DType::kF32, n, k);
  const auto* wf = reinterpret_cast<const float*>(w.bytes.data());
  auto x = random_floats(static_cast<size_t>(tokens * k));
  std::vector<float> y(static_cast<size_t>(tokens * n));
  openblas_set_num_threads(kThreads);
  for (auto _ : state) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(tokens), static_cast<int>(n),
                static_cast<int>(k), 1.0f, x.data(), static_cast<int>(k), wf, static_cast<int>(k), 0.0f,
                y.data(), static_cast<int>(n));
    benchmark::DoNotOptimize(y.data());
  }
  report_matmul(state, DType::kF32, tokens, n, k, w.bytes.size());
}
BENCHMARK(BM_OpenBlasSgemm)->Arg(1)->Arg(16)->Arg(512)->Unit(benchmark::kMicrosecond)->UseRealTime();

// Paged attention, f16 KV: `tokens` queries of one sequence ending at context `ctx`; K in groups
// of 16 slots (third arg 1, as the engine's caches) or in rows (0).
void BM_Attention(benchmark::State& state) {
  const int64_t tokens = state.range(0), ctx = state.range(1);
  const AttentionShape shape{14, 2, 64, 0.125f};
  const int64_t kv_dim = 128, q_dim = 14 * 64, block = 16;
  const int64_t blocks = (ctx + block - 1) / block;
  std::vector<uint16_t> key(static_cast<size_t>(blocks * block * kv_dim), f32_to_f16(0.1f));
  std::vector<uint16_t> value(key.size(), f32_to_f16(0.2f));
  std::vector<int32_t> table(static_cast<size_t>(blocks));
  for (int64_t i = 0; i < blocks; ++i) table[static_cast<size_t>(i)] = static_cast<int32_t>(i);
  auto q = random_floats(static_cast<size_t>(tokens * q_dim));
  std::vector<float> out(q.size());
  std::vector<int32_t> token_seq(static_cast<size_t>(tokens), 0);
  const AttentionSequence seq{0, tokens, ctx, table};
  ThreadPool pool(kThreads);
  KvLayerView kv{key.data(), value.data(), block, KvDType::kF16};
  kv.key_groups = state.range(2) != 0;  // the keys are all one value: either layout holds them
  for (auto _ : state) {
    paged_attention(q.data(), {&seq, 1}, token_seq, kv, shape, out.data(), pool);
    benchmark::DoNotOptimize(out.data());
  }
  // Multiply-adds: QK^T and PV over each query's causal context.
  double macs = 0;
  for (int64_t t = 0; t < tokens; ++t) macs += 2.0 * static_cast<double>(ctx - tokens + t + 1) * 64 * 14;
  state.counters["GOP/s"] = benchmark::Counter(2.0 * macs * static_cast<double>(state.iterations()) / 1e9,
                                               benchmark::Counter::kIsRate);
}
BENCHMARK(BM_Attention)
    ->ArgsProduct({{1}, {512, 4096}, {1, 0}})
    ->Args({512, 512, 1})
    ->Args({512, 512, 0})
    ->Args({4096, 4096, 1})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

// Decode attention against memory: one query token over `ctx` positions in each of 24 layers
// with their own K and V (the Qwen2.5-0.5B shapes: 14 query heads, 2 KV heads of 64; 16-slot
// blocks in a shuffled order, as a cache that served other sequences hands them out), so that the
// K and V come from memory as in a decode step at that context. Args: ctx, KV dtype (f16, or int8
// with per-slot, per-head scales), K layout (1: groups of 16 slots, as the engine's caches; 0:
// rows). GB/s: the K and V bytes read (scales included).
void BM_AttentionDecode(benchmark::State& state) {
  const int64_t ctx = state.range(0), layers = 24, block = 16, kv_dim = 128, q_dim = 14 * 64;
  const auto dtype = static_cast<KvDType>(state.range(1));
  const size_t elem = dtype == KvDType::kInt8 ? 1 : 2;
  const AttentionShape shape{14, 2, 64, 0.125f};
  const int64_t blocks = (ctx + block - 1) / block;
  const auto slots = static_cast<size_t>(blocks * block);
  std::vector<std::vector<std::byte>> keys, values;
  std::vector<std::vector<float>> scales;
  for (int64_t l = 0; l < layers; ++l) {
    keys.emplace_back(slots * static_cast<size_t>(kv_dim) * elem, std::byte{0x21});
    values.emplace_back(keys.back().size(), std::byte{0x25});
    scales.emplace_back(slots * 2, 0.01f);
  }
  std::vector<int32_t> table(static_cast<size_t>(blocks));
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), std::mt19937(7));
  auto q = random_floats(static_cast<size_t>(q_dim));
  std::vector<float> out(q.size());
  const std::vector<int32_t> token_seq(1, 0);
  const AttentionSequence seq{0, 1, ctx, table};
  ThreadPool pool(kThreads);
  for (auto _ : state) {
    for (int64_t l = 0; l < layers; ++l) {
      const auto i = static_cast<size_t>(l);
      const float* scale = dtype == KvDType::kInt8 ? scales[i].data() : nullptr;
      const KvLayerView kv{keys[i].data(), values[i].data(), block, dtype, scale, scale, state.range(2) != 0};
      paged_attention(q.data(), {&seq, 1}, token_seq, kv, shape, out.data(), pool);
    }
    benchmark::DoNotOptimize(out.data());
  }
  const double bytes = 2.0 * static_cast<double>(layers * ctx) *
                       (static_cast<double>(kv_dim * elem) + (dtype == KvDType::kInt8 ? 8.0 : 0.0));
  state.counters["GB/s"] =
      benchmark::Counter(bytes * static_cast<double>(state.iterations()) / 1e9, benchmark::Counter::kIsRate);
  state.SetLabel(std::string(dtype == KvDType::kInt8 ? "int8" : "f16") +
                 (state.range(2) != 0 ? " groups" : " rows"));
}
BENCHMARK(BM_AttentionDecode)
    ->ArgsProduct({{1024, 4096, 16384},
                   {static_cast<int64_t>(KvDType::kF16), static_cast<int64_t>(KvDType::kInt8)},
                   {1, 0}})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

// One LoRA update of a SmolLM2-sized layer matrix (576 -> 1536, up_proj) for 16 decode rows
// spread over `adapters` adapters of rank `rank` (args: adapters, rank).
void BM_LoraUpdate(benchmark::State& state) {
  const int64_t adapters = state.range(0), rank = state.range(1), k = 576, n = 1536, rows = 16;
  std::vector<std::vector<float>> a, bt;
  std::vector<std::vector<int32_t>> members(static_cast<size_t>(adapters));
  for (int64_t i = 0; i < adapters; ++i) {
    a.push_back(random_floats(static_cast<size_t>(rank * k)));
    bt.push_back(random_floats(static_cast<size_t>(rank * n)));
  }
  for (int32_t t = 0; t < rows; ++t) members[static_cast<size_t>(t % adapters)].push_back(t);
  std::vector<LoraGroup> groups;
  for (int64_t i = 0; i < adapters; ++i)
    groups.push_back({a[static_cast<size_t>(i)].data(), bt[static_cast<size_t>(i)].data(), DType::kF32, rank,
                      0.5f, members[static_cast<size_t>(i)]});
  const auto x = random_floats(static_cast<size_t>(rows * k));
  std::vector<float> y(static_cast<size_t>(rows * n));
  ThreadPool pool(2);
  LoraScratch scratch;
  for (auto _ : state) {
    lora_update(x.data(), k, k, groups, y.data(), n, n, scratch, pool, active_isa());
    benchmark::DoNotOptimize(y.data());
  }
  const double flops = 2.0 * rows * rank * (k + n);
  state.counters["GFLOP/s"] =
      benchmark::Counter(flops * static_cast<double>(state.iterations()) / 1e9, benchmark::Counter::kIsRate);
}
BENCHMARK(BM_LoraUpdate)
    ->Args({1, 16})
    ->Args({4, 16})
    ->Args({16, 16})
    ->Args({4, 64})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

// One decode step's LoRA updates on SmolLM2-135M's shapes (30 layers; Q, K, V in one call, O,
// gate and up in one, down), 16 rows over `adapters` F16 adapters of `rank` (every target): the
// adapters' 9.8 MiB each at rank 16 stream from memory as in serving. GB/s of adapter bytes.
void BM_LoraDecodeStep(benchmark::State& state) {
  const int64_t adapters = state.range(0), rank = state.range(1), layers = 30, rows = 16;
  const int64_t h = 576, kv = 192, inter = 1536;
  struct Target {
    int64_t k, n;
  };
  const Target targets[7] = {{h, h}, {h, kv}, {h, kv}, {h, h}, {h, inter}, {h, inter}, {inter, h}};
  std::vector<std::vector<uint16_t>> weights;  // [adapter][layer][target]: a, then bt
  size_t bytes = 0;
  for (int64_t i = 0; i < adapters * layers; ++i)
    for (const Target& t : targets)
      for (const int64_t size : {rank * t.k, rank * t.n}) {
        std::vector<uint16_t> w(static_cast<size_t>(size));
        const auto v = random_floats(w.size());
        for (size_t j = 0; j < w.size(); ++j) w[j] = f32_to_f16(v[j] * 0.1f);
        bytes += w.size() * 2;
        weights.push_back(std::move(w));
      }
  std::vector<std::vector<int32_t>> members(static_cast<size_t>(adapters));
  for (int32_t t = 0; t < rows; ++t) members[static_cast<size_t>(t % adapters)].push_back(t);
  const auto x = random_floats(static_cast<size_t>(rows * inter));
  std::vector<float> y[7];
  for (int t = 0; t < 7; ++t) y[t].assign(static_cast<size_t>(rows * targets[t].n), 0.0f);
  ThreadPool pool(2);
  LoraScratch scratch;
  std::vector<LoraGroup> groups[7];
  const int calls[4][2] = {{0, 3}, {3, 4}, {4, 6}, {6, 7}};  // targets [first, last) per call
  for (auto _ : state) {
    for (int64_t l = 0; l < layers; ++l) {
      for (const auto& call : calls) {
        LoraOutput outputs[3];
        size_t count = 0;
        for (int t = call[0]; t < call[1]; ++t) {
          groups[t].clear();
          for (int64_t i = 0; i < adapters; ++i) {
            const size_t w = static_cast<size_t>(((i * layers + l) * 7 + t) * 2);
            groups[t].push_back({weights[w].data(), weights[w + 1].data(), DType::kF16, rank, 0.5f,
                                 members[static_cast<size_t>(i)]});
          }
          outputs[count++] = {groups[t], y[t].data(), targets[t].n, targets[t].n};
        }
        lora_update(x.data(), targets[call[0]].k, targets[call[0]].k, {outputs, count}, scratch, pool,
                    active_isa());
      }
    }
    benchmark::DoNotOptimize(y[0].data());
  }
  state.counters["GB/s"] =
      benchmark::Counter(static_cast<double>(bytes) * static_cast<double>(state.iterations()) / 1e9,
                         benchmark::Counter::kIsRate);
}
BENCHMARK(BM_LoraDecodeStep)
    ->Args({1, 16})
    ->Args({4, 16})
    ->Args({16, 16})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace inferd

BENCHMARK_MAIN();
