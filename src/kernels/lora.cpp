#include "kernels/lora.h"

#include <algorithm>
#include <array>
#include <cmath>

#include "kernels/f32_kernels.h"
#include "kernels/simd.h"
#include "tensor/dequantize.h"

namespace inferd {

namespace {

// Columns of y one expansion work item covers: a multiple of 16 (AVX-512 lanes), so where a
// column falls (vector body or tail) depends on n alone.
constexpr int64_t kExpandChunk = 64;
// A rows of one shrink work item on the AVX-512 path (the other paths take one).
constexpr int64_t kShrinkRanks = 4;

// y[c] += sum_r s[r] * bt[r * ld + c] for c in [0, w), rank by rank from r = 0.
void expand_generic(const float* s, const float* bt, int64_t rank, int64_t ld, int64_t w, float* y) {
  for (int64_t c = 0; c < w; ++c) {
    float acc = 0.0f;
    for (int64_t r = 0; r < rank; ++r) acc += s[r] * bt[r * ld + c];
    y[c] += acc;
  }
}

#if defined(__x86_64__)
// The 16 values from p[i] (masked) of a weight of type D, as f32 (exact).
template <DType D>
INFERD_AVX512 inline __m512 load16(const void* p, int64_t i, __mmask16 m) {
  if constexpr (D == DType::kF32) {
    return _mm512_maskz_loadu_ps(m, static_cast<const float*>(p) + i);
  } else {
    const __m256i h = _mm256_maskz_loadu_epi16(m, static_cast<const uint16_t*>(p) + i);
    if constexpr (D == DType::kF16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
}

// The sum of v's 16 lanes, halves added pairwise: l[i] + l[i + 8], then + 4, + 2, + 1
// (_mm512_reduce_add_ps's order; GCC 12's unmasked shuffles and casts trip -Wuninitialized here).
INFERD_AVX512 inline float lane_sum(__m512 v) {
  const __m512 s8 = _mm512_add_ps(v, _mm512_maskz_shuffle_f32x4(0xffff, v, v, _MM_SHUFFLE(1, 0, 3, 2)));
  const __m512 s4 = _mm512_add_ps(s8, _mm512_maskz_shuffle_f32x4(0xffff, s8, s8, _MM_SHUFFLE(2, 3, 0, 1)));
  const __m512 s2 = _mm512_add_ps(s4, _mm512_maskz_permute_ps(0xffff, s4, _MM_SHUFFLE(1, 0, 3, 2)));
  return _mm512_cvtss_f32(_mm512_add_ps(s2, _mm512_maskz_permute_ps(0xffff, s2, _MM_SHUFFLE(2, 3, 0, 1))));
}

// out[j][q] = x[j] . a[q] (k values; a's rows k apart) for j < R rows and q < Q ranks (1..4
// each): sixteen independent chains of fmas over 16 lanes, then a lane sum. The value of (j, q)
// is the same chain whatever R and Q are, so a row's result does not depend on the batch.
template <DType D, int R, int Q>
INFERD_AVX512 void shrink_tile_avx512(const float* const* x, const void* a, int64_t k, float (*out)[4]) {
  __m512 acc[R][Q];
  _Pragma("GCC unroll 4") for (int j = 0; j < R; ++j) _Pragma("GCC unroll 4") for (int q = 0; q < Q; ++q)
      acc[j][q] = _mm512_setzero_ps();
  for (int64_t i = 0; i < k; i += 16) {
    const int64_t left = std::min<int64_t>(16, k - i);
    const auto mask = static_cast<__mmask16>(left == 16 ? 0xffff : (1u << left) - 1);
    __m512 w[Q];
    _Pragma("GCC unroll 4") for (int q = 0; q < Q; ++q) w[q] = load16<D>(a, q * k + i, mask);
    _Pragma("GCC unroll 4") for (int j = 0; j < R; ++j) {
      const __m512 xv = _mm512_maskz_loadu_ps(mask, x[j] + i);
      _Pragma("GCC unroll 4") for (int q = 0; q < Q; ++q) acc[j][q] = _mm512_fmadd_ps(xv, w[q], acc[j][q]);
    }
  }
  _Pragma("GCC unroll 4") for (int j = 0; j < R; ++j) _Pragma("GCC unroll 4") for (int q = 0; q < Q; ++q)
      out[j][q] = lane_sum(acc[j][q]);
}

using ShrinkTile = void (*)(const float* const*, const void*, int64_t, float (*)[4]);

template <DType D, int R>
constexpr std::array<ShrinkTile, 4> shrink_tiles_of_rows() {
  return {shrink_tile_avx512<D, R, 1>, shrink_tile_avx512<D, R, 2>, shrink_tile_avx512<D, R, 3>,
          shrink_tile_avx512<D, R, 4>};
}

// [rows - 1][ranks - 1]
template <DType D>
constexpr std::array<std::array<ShrinkTile, 4>, 4> kShrinkTiles = {
    shrink_tiles_of_rows<D, 1>(), shrink_tiles_of_rows<D, 2>(), shrink_tiles_of_rows<D, 3>(),
    shrink_tiles_of_rows<D, 4>()};

// y[j][c] += sum_r s[j][r] * bt[r * ld + c] for c in [0, w) (w <= 64) and j < R rows (1..4): each
// (row, column) one chain over the ranks from r = 0, a B value read once for all R rows.
template <DType D, int R>
INFERD_AVX512 void expand_tile_avx512(const float* const* s, const void* bt, int64_t rank, int64_t ld,
                                      int64_t w, float* const* y) {
  __mmask16 mask[4];
  _Pragma("GCC unroll 4") for (int q = 0; q < 4; ++q) {
    const int64_t left = std::clamp<int64_t>(w - 16 * q, 0, 16);
    mask[q] = static_cast<__mmask16>(left == 16 ? 0xffff : (1u << left) - 1);
  }
  __m512 acc[R][4];
  _Pragma("GCC unroll 4") for (int j = 0; j < R; ++j) _Pragma("GCC unroll 4") for (int q = 0; q < 4; ++q)
      acc[j][q] = _mm512_setzero_ps();
  for (int64_t r = 0; r < rank; ++r) {
    __m512 b[4];
    _Pragma("GCC unroll 4") for (int q = 0; q < 4; ++q) b[q] = load16<D>(bt, r * ld + 16 * q, mask[q]);
    _Pragma("GCC unroll 4") for (int j = 0; j < R; ++j) {
      const __m512 sv = _mm512_set1_ps(s[j][r]);
      _Pragma("GCC unroll 4") for (int q = 0; q < 4; ++q) acc[j][q] = _mm512_fmadd_ps(sv, b[q], acc[j][q]);
    }
  }
  _Pragma("GCC unroll 4") for (int j = 0; j < R; ++j) _Pragma("GCC unroll 4") for (int q = 0; q < 4; ++q) {
    float* p = y[j] + 16 * q;
    _mm512_mask_storeu_ps(p, mask[q], _mm512_add_ps(_mm512_maskz_loadu_ps(mask[q], p), acc[j][q]));
  }
}

using ExpandTile = void (*)(const float* const*, const void*, int64_t, int64_t, int64_t, float* const*);

// [rows - 1]
template <DType D>
constexpr std::array<ExpandTile, 4> kExpandTiles = {expand_tile_avx512<D, 1>, expand_tile_avx512<D, 2>,
                                                    expand_tile_avx512<D, 3>, expand_tile_avx512<D, 4>};

// silu(g) * u, n values, with the vector exp (exp_avx512).
INFERD_AVX512 void silu_mul_avx512(const float* g, const float* u, float* out, int64_t n) {
  const __m512 one = _mm512_set1_ps(1.0f);
  for (int64_t i = 0; i < n; i += 16) {
    const int64_t left = std::min<int64_t>(16, n - i);
    const auto mask = static_cast<__mmask16>(left == 16 ? 0xffff : (1u << left) - 1);
    const __m512 x = _mm512_maskz_loadu_ps(mask, g + i);
    const __m512 e = exp_avx512(_mm512_sub_ps(_mm512_setzero_ps(), x));
    const __m512 silu = _mm512_div_ps(x, _mm512_add_ps(one, e));
    _mm512_mask_storeu_ps(out + i, mask, _mm512_mul_ps(silu, _mm512_maskz_loadu_ps(mask, u + i)));
  }
}
#endif

size_t value_bytes(DType dtype) {
  return dtype == DType::kF32 ? 4 : 2;
}

// The group whose items [offsets[g], offsets[g + 1]) hold `item`.
size_t group_of(const std::vector<int64_t>& offsets, int64_t item) {
  const auto it = std::upper_bound(offsets.begin(), offsets.end(), item);
  return static_cast<size_t>(it - offsets.begin()) - 1;
}

}  // namespace

void lora_update_reference(const float* x, int64_t ldx, int64_t k, std::span<const LoraGroup> groups,
                           float* y, int64_t ldy, int64_t n) {
  std::vector<float> s, a, bt;
  for (const LoraGroup& g : groups) {
    s.assign(static_cast<size_t>(g.rank), 0.0f);
    a.resize(static_cast<size_t>(g.rank * k));
    bt.resize(static_cast<size_t>(g.rank * n));
    dequantize_row(g.dtype, static_cast<const std::byte*>(g.a), a.data(), g.rank * k);
    dequantize_row(g.dtype, static_cast<const std::byte*>(g.bt), bt.data(), g.rank * n);
    for (const int32_t t : g.rows) {
      const float* xt = x + t * ldx;
      for (int64_t r = 0; r < g.rank; ++r) {
        float acc = 0.0f;
        for (int64_t i = 0; i < k; ++i) acc += a[static_cast<size_t>(r * k + i)] * xt[i];
        s[static_cast<size_t>(r)] = acc * g.scale;
      }
      float* yt = y + t * ldy;
      for (int64_t c = 0; c < n; ++c) {
        float acc = 0.0f;
        for (int64_t r = 0; r < g.rank; ++r)
          acc += s[static_cast<size_t>(r)] * bt[static_cast<size_t>(r * n + c)];
        yt[c] += acc;
      }
    }
  }
}

#if defined(__x86_64__)
namespace {

// The AVX-512 path: weights of any of the three types read in place (16-bit ones expanded in
// registers), the same arithmetic for all three. scratch's work, items and offsets are set.
void run_avx512(const float* x, int64_t ldx, int64_t k, LoraScratch& scratch, ThreadPool& pool) {
  float* shrunk = scratch.shrunk.data();
  auto tiles_of = [](DType d) -> const auto& {
    return d == DType::kF16    ? kShrinkTiles<DType::kF16>
           : d == DType::kBF16 ? kShrinkTiles<DType::kBF16>
                               : kShrinkTiles<DType::kF32>;
  };
  pool.parallel_for(scratch.shrink_items.back(), [&](int64_t begin, int64_t end) {
    float out[4][4];
    const float* xs[4];
    for (int64_t item = begin; item < end; ++item) {
      const size_t g = group_of(scratch.shrink_items, item);
      const LoraGroup& grp = *scratch.work[g].group;
      const int64_t r0 = (item - scratch.shrink_items[g]) * kShrinkRanks;
      const int nranks = static_cast<int>(std::min<int64_t>(kShrinkRanks, grp.rank - r0));
      const void* a =
          static_cast<const std::byte*>(grp.a) + static_cast<size_t>(r0 * k) * value_bytes(grp.dtype);
      float* s = shrunk + scratch.shrunk_offset[g];
      const auto& tiles = tiles_of(grp.dtype);
      const auto rows = static_cast<int64_t>(grp.rows.size());
      for (int64_t i = 0; i < rows; i += 4) {
        const int nrows = static_cast<int>(std::min<int64_t>(4, rows - i));
        for (int j = 0; j < nrows; ++j) xs[j] = x + grp.rows[static_cast<size_t>(i + j)] * ldx;
        tiles[static_cast<size_t>(nrows - 1)][static_cast<size_t>(nranks - 1)](xs, a, k, out);
        for (int j = 0; j < nrows; ++j)
          for (int q = 0; q < nranks; ++q) s[(i + j) * grp.rank + r0 + q] = out[j][q] * grp.scale;
      }
    }
  });
  pool.parallel_for(scratch.expand_items.back(), [&](int64_t begin, int64_t end) {
    const float* ss[4];
    float* ys[4];
    for (int64_t item = begin; item < end; ++item) {
      const size_t g = group_of(scratch.expand_items, item);
      const LoraScratch::Work& wk = scratch.work[g];
      const LoraGroup& grp = *wk.group;
      const int64_t c0 = (item - scratch.expand_items[g]) * kExpandChunk;
      const int64_t w = std::min(wk.n, c0 + kExpandChunk) - c0;
      const void* bt =
          static_cast<const std::byte*>(grp.bt) + static_cast<size_t>(c0) * value_bytes(grp.dtype);
      const float* s = shrunk + scratch.shrunk_offset[g];
      const auto& tiles = grp.dtype == DType::kF16    ? kExpandTiles<DType::kF16>
                          : grp.dtype == DType::kBF16 ? kExpandTiles<DType::kBF16>
                                                      : kExpandTiles<DType::kF32>;
      const auto rows = static_cast<int64_t>(grp.rows.size());
      for (int64_t i = 0; i < rows; i += 4) {
        const int nrows = static_cast<int>(std::min<int64_t>(4, rows - i));
        for (int j = 0; j < nrows; ++j) {
          ss[j] = s + (i + j) * grp.rank;
          ys[j] = wk.y + grp.rows[static_cast<size_t>(i + j)] * wk.ldy + c0;
        }
        tiles[static_cast<size_t>(nrows - 1)](ss, bt, grp.rank, wk.n, w, ys);
      }
    }
  });
}

}  // namespace
#endif

void lora_silu_mul(const float* gate, const float* up, float* out, int64_t n, Isa isa) {
#if defined(__x86_64__)
  if (static_cast<int>(isa) >= static_cast<int>(Isa::kAvx512)) return silu_mul_avx512(gate, up, out, n);
#endif
  for (int64_t i = 0; i < n; ++i) out[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

void lora_update(const float* x, int64_t ldx, int64_t k, std::span<const LoraOutput> outputs,
                 LoraScratch& scratch, ThreadPool& pool, Isa isa) {
  // Every output's groups in one list. Work items: a group's shrink is one item per rank (an A
  // row against all its rows), its expansion one per column chunk of its output (all its rows).
  scratch.work.clear();
  for (const LoraOutput& o : outputs)
    for (const LoraGroup& g : o.groups)
      if (!g.rows.empty() && g.rank > 0) scratch.work.push_back({&g, o.y, o.ldy, o.n});
  if (scratch.work.empty()) return;
  const size_t groups = scratch.work.size();
  const bool avx512 = static_cast<int>(isa) >= static_cast<int>(Isa::kAvx512);
  const int64_t ranks_per_item = avx512 ? kShrinkRanks : 1;
  scratch.shrunk_offset.assign(groups + 1, 0);
  scratch.shrink_items.assign(groups + 1, 0);
  scratch.expand_items.assign(groups + 1, 0);
  for (size_t g = 0; g < groups; ++g) {
    const LoraScratch::Work& wk = scratch.work[g];
    const auto rows = static_cast<int64_t>(wk.group->rows.size());
    scratch.shrunk_offset[g + 1] = scratch.shrunk_offset[g] + rows * wk.group->rank;
    scratch.shrink_items[g + 1] =
        scratch.shrink_items[g] + (wk.group->rank + ranks_per_item - 1) / ranks_per_item;
    scratch.expand_items[g + 1] = scratch.expand_items[g] + (wk.n + kExpandChunk - 1) / kExpandChunk;
  }
  const auto shrunk_size = static_cast<size_t>(scratch.shrunk_offset.back());
  if (scratch.shrunk.size() < shrunk_size) scratch.shrunk.resize(shrunk_size);
  const F32Kernels& f32 = f32_kernels(isa);
  float* shrunk = scratch.shrunk.data();

#if defined(__x86_64__)
  if (avx512) return run_avx512(x, ldx, k, scratch, pool);
#endif
  // Shrink: shrunk[row i of group g][r] = scale * (A_g[r] . x[rows_g[i]]), four rows per A read.
  // 16-bit weights are expanded (exactly) into a buffer of each thread's: the same sums as f32
  // ones. The buffer holds an A row (k) or a chunk of every rank row of B (rank x kExpandChunk).
  int64_t buffer_floats = 0;
  for (const LoraScratch::Work& wk : scratch.work)
    if (wk.group->dtype != DType::kF32)
      buffer_floats = std::max({buffer_floats, k, wk.group->rank * std::min(kExpandChunk, wk.n)});
  scratch.expanded.prepare(pool, [&](std::vector<float>& b) {
    if (static_cast<int64_t>(b.size()) < buffer_floats) b.resize(static_cast<size_t>(buffer_floats));
  });
  pool.parallel_for(scratch.shrink_items.back(), [&](int64_t begin, int64_t end) {
    float out[4];
    std::vector<float>& buffer = scratch.expanded.mine();
    for (int64_t item = begin; item < end; ++item) {
      const size_t g = group_of(scratch.shrink_items, item);
      const LoraGroup& grp = *scratch.work[g].group;
      const int64_t r = item - scratch.shrink_items[g];
      const auto* a_row =
          static_cast<const std::byte*>(grp.a) + static_cast<size_t>(r * k) * value_bytes(grp.dtype);
      const float* a = reinterpret_cast<const float*>(a_row);
      if (grp.dtype != DType::kF32) {
        f32.dequantize_row(grp.dtype, a_row, buffer.data(), k);
        a = buffer.data();
      }
      float* s = shrunk + scratch.shrunk_offset[g];
      const auto rows = static_cast<int64_t>(grp.rows.size());
      int64_t i = 0;
      for (; i + 4 <= rows; i += 4) {
        const int32_t* t = &grp.rows[static_cast<size_t>(i)];
        const bool strided = t[1] == t[0] + 1 && t[2] == t[0] + 2 && t[3] == t[0] + 3;
        if (strided) {
          f32.dot4(x + t[0] * ldx, ldx, a, k, out);
        } else {
          for (int j = 0; j < 4; ++j) out[j] = f32.dot(x + t[j] * ldx, a, k);
        }
        for (int j = 0; j < 4; ++j) s[(i + j) * grp.rank + r] = out[j] * grp.scale;
      }
      for (; i < rows; ++i)
        s[i * grp.rank + r] = f32.dot(x + grp.rows[static_cast<size_t>(i)] * ldx, a, k) * grp.scale;
    }
  });

  // Expand: y[rows_g[i]] += shrunk[i] B_g^T, one column chunk of one group per item.
  pool.parallel_for(scratch.expand_items.back(), [&](int64_t begin, int64_t end) {
    std::vector<float>& buffer = scratch.expanded.mine();
    for (int64_t item = begin; item < end; ++item) {
      const size_t g = group_of(scratch.expand_items, item);
      const LoraScratch::Work& wk = scratch.work[g];
      const LoraGroup& grp = *wk.group;
      const int64_t c0 = (item - scratch.expand_items[g]) * kExpandChunk;
      const int64_t w = std::min(wk.n, c0 + kExpandChunk) - c0;
      const float* bt = static_cast<const float*>(grp.bt) + c0;
      int64_t ld = wk.n;
      if (grp.dtype != DType::kF32) {  // this chunk's columns of every rank row, as f32
        for (int64_t r = 0; r < grp.rank; ++r)
          f32.dequantize_row(grp.dtype,
                             static_cast<const std::byte*>(grp.bt) + static_cast<size_t>(r * wk.n + c0) * 2,
                             buffer.data() + r * w, w);
        bt = buffer.data();
        ld = w;
      }
      const float* s = shrunk + scratch.shrunk_offset[g];
      for (size_t i = 0; i < grp.rows.size(); ++i)
        expand_generic(s + static_cast<int64_t>(i) * grp.rank, bt, grp.rank, ld, w,
                       wk.y + grp.rows[i] * wk.ldy + c0);
    }
  });
}

}  // namespace inferd
