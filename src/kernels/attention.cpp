#include "kernels/attention.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <type_traits>
#include <vector>

#include "common/check.h"
#include "common/half.h"
#include "kernels/f32_kernels.h"
#include "kernels/simd.h"

namespace inferd {

namespace {

// Flash-style attention: each work item is (sequence, KV head, up to kTileTokens of the
// sequence's query tokens); it walks the context in chunks of kChunk positions, converting each
// chunk's K (transposed, [head_dim][kChunk]) and V ([kChunk][head_dim]) to f32 once for all of
// the item's query rows (its tokens x the query heads sharing the KV head), and keeps per row a
// running max, sum and output (online softmax). Chunks start at absolute multiples of kChunk,
// so a (token, head)'s arithmetic depends only on its query, its position and the K/V: never on
// which other tokens share its item, the batch, or the thread split.
//
// Long contexts are split into segments of kSegment positions, also at absolute multiples, so
// that one decoding token's heads spread over the threads (flash-decoding): each segment keeps
// its own running max, sum and output, and a second pass merges a row's segments in order. A
// context within one segment is computed as before, in one pass.
constexpr int64_t kChunk = 16;
constexpr int64_t kTileTokens = 16;
constexpr int64_t kSegment = 512;
static_assert(kSegment % kChunk == 0);
static_assert(kChunk == kKeyGroup, "a chunk's keys are one group of a grouped K");

struct Item {
  int32_t sequence;
  int32_t kv_head;
  int64_t first_token;  // batch row
  int64_t num_tokens;
  int32_t segment;       // positions [segment * kSegment, (segment + 1) * kSegment) ...
  int32_t num_segments;  // ... of this many; 1: the whole context, written out directly
  int64_t partial;       // num_segments > 1: where its rows' (max, sum, out[hd]) go in the partials
};

size_t kv_elem_bytes(KvDType dtype) {
  if (dtype == KvDType::kInt8 || dtype == KvDType::kFp8) return 1;
  return dtype == KvDType::kF32 ? 4 : 2;
}

// Where one position's head starts in the cache, and the scale of that head (8-bit dtypes).
struct RowRef {
  const std::byte* row;
  float scale;
};

// The cache slot of position p (p >= 0) through the block table. Block sizes are powers of two in
// practice: a shift and a mask then, not a 64-bit division for each row of each chunk (which took
// more of a decode chunk's time than its prefetches and loads).
inline int64_t slot_of(const KvLayerView& kv, std::span<const int32_t> block_table, int64_t p) {
  const int64_t bs = kv.block_size;
  if ((bs & (bs - 1)) == 0) {
    const int shift = std::countr_zero(static_cast<uint64_t>(bs));
    return static_cast<int64_t>(block_table[static_cast<size_t>(p >> shift)]) * bs + (p & (bs - 1));
  }
  return static_cast<int64_t>(block_table[static_cast<size_t>(p / bs)]) * bs + p % bs;
}

// The scale of the head at `offset` in `slot` (8-bit dtypes: scales != null), as the kernels
// multiply by it: FP8 codes are expanded as f16 (value * 2^-8), so the 2^8 goes into the scale
// (exact).
inline float slot_scale(const KvLayerView& kv, const float* scales, int64_t slot, int64_t kv_dim,
                        int64_t offset, int64_t hd) {
  return scales[slot * (kv_dim / hd) + offset / hd] * (kv.dtype == KvDType::kFp8 ? 256.0f : 1.0f);
}

// The head at `offset` of a slot's row (V, or K in rows).
inline RowRef row_at(const KvLayerView& kv, const std::byte* base, const float* scales, int64_t slot,
                     int64_t kv_dim, int64_t offset, int64_t hd) {
  return {base + static_cast<size_t>(slot * kv_dim + offset) * kv_elem_bytes(kv.dtype),
          scales == nullptr ? 1.0f : slot_scale(kv, scales, slot, kv_dim, offset, hd)};
}

inline RowRef row_ref(const KvLayerView& kv, const std::byte* base, const float* scales,
                      std::span<const int32_t> block_table, int64_t p, int64_t kv_dim, int64_t offset,
                      int64_t hd) {
  return row_at(kv, base, scales, slot_of(kv, block_table, p), kv_dim, offset, hd);
}

// Element d of a row as f32, the same bits as the vector loads give.
inline float load_one(KvDType dtype, const RowRef& r, int64_t d) {
  switch (dtype) {
    case KvDType::kF32: {
      float v;
      std::memcpy(&v, r.row + 4 * d, 4);
      return v;
    }
    case KvDType::kF16: return load_f16(r.row + 2 * d);
    case KvDType::kBF16: return bf16_to_f32(load_u16(r.row + 2 * d));
    case KvDType::kInt8: return static_cast<float>(static_cast<int8_t>(r.row[d])) * r.scale;
    case KvDType::kFp8: return f16_to_f32(fp8_e4m3_as_f16_bits(static_cast<uint8_t>(r.row[d]))) * r.scale;
  }
  return 0.0f;
}

// Converts n slots' head of K or V (kv_dim-strided rows in the cache) to f32.
void load_rows(const KvLayerView& kv, const std::byte* base, const float* scales,
               std::span<const int32_t> block_table, int64_t first, int64_t n, int64_t kv_dim, int64_t offset,
               int64_t hd, float* out /* [n][hd] */) {
  const F32Kernels& kernels = f32_kernels();
  for (int64_t c = 0; c < n; ++c) {
    const RowRef r = row_ref(kv, base, scales, block_table, first + c, kv_dim, offset, hd);
    float* dst = out + c * hd;
    switch (kv.dtype) {
      case KvDType::kF32: std::memcpy(dst, r.row, static_cast<size_t>(hd) * 4); break;
      case KvDType::kF16: kernels.f16_to_f32(reinterpret_cast<const uint16_t*>(r.row), dst, hd); break;
      default:
        for (int64_t d = 0; d < hd; ++d) dst[d] = load_one(kv.dtype, r, d);
        break;
    }
  }
}

// The keys of the chunk of n positions whose first sits in `slot` (a multiple of kChunk), for the
// head at `offset`, in a grouped K: where its [hd][16] elements start, and each lane's scale
// (slot_scale; 0 past n, and for the dtypes without scales).
struct KeyGroupRef {
  const std::byte* at;
  float scale[kChunk];
};

inline KeyGroupRef key_group_ref(const KvLayerView& kv, const std::byte* base, const float* scales,
                                 int64_t slot, int64_t n, int64_t kv_dim, int64_t offset, int64_t hd) {
  KeyGroupRef g{base + static_cast<size_t>(key_group_index(slot, offset, kv_dim)) * kv_elem_bytes(kv.dtype),
                {}};
  if (scales == nullptr) return g;
  for (int64_t c = 0; c < n; ++c) g.scale[c] = slot_scale(kv, scales, slot + c, kv_dim, offset, hd);
  return g;
}

// A chunk's keys from a grouped K, out[d][c] (zeros for c >= n): load_rows + transpose's values.
void load_key_group(KvDType dtype, const KeyGroupRef& g, int64_t n, int64_t hd,
                    float* out /* [hd][kChunk] */) {
  const size_t elem = kv_elem_bytes(dtype);
  for (int64_t d = 0; d < hd; ++d)
    for (int64_t c = 0; c < kChunk; ++c)
      out[d * kChunk + c] =
          c < n ? load_one(dtype, RowRef{g.at + static_cast<size_t>(d * kChunk + c) * elem, g.scale[c]}, 0)
                : 0.0f;
}

// Per query row state of the online softmax.
struct RowState {
  float max;
  float sum;
};

// ---------------------------------------------------------------------------------------------
// Portable path.

// Written for the compiler to vectorise: the AVX2 path is this code compiled for AVX2 + FMA
// (chunk_rows_avx2), the scalar path this code for the baseline ISA.
__attribute__((always_inline)) inline void chunk_rows_generic(const float* const* q, const int64_t* limit,
                                                              int64_t rows, const float* k /*[hd][kChunk]*/,
                                                              const float* v /*[kChunk][hd]*/, int64_t hd,
                                                              float scale, RowState* state, float* o) {
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t valid = limit[r];
    if (valid <= 0) continue;
    float s[kChunk];
    for (int64_t c = 0; c < valid; ++c) s[c] = 0.0f;
    for (int64_t d = 0; d < hd; ++d) {
      const float qd = q[r][d];
      for (int64_t c = 0; c < valid; ++c) s[c] += qd * k[d * kChunk + c];
    }
    float m = state[r].max;
    for (int64_t c = 0; c < valid; ++c) m = std::max(m, s[c] *= scale);
    const float corr = std::exp(state[r].max - m);
    float sum = 0.0f;
    for (int64_t c = 0; c < valid; ++c) sum += (s[c] = std::exp(s[c] - m));
    state[r].sum = state[r].sum * corr + sum;
    state[r].max = m;
    float* out = o + r * hd;
    for (int64_t d = 0; d < hd; ++d) out[d] *= corr;
    for (int64_t c = 0; c < valid; ++c)
      for (int64_t d = 0; d < hd; ++d) out[d] += s[c] * v[c * hd + d];
  }
}

#if defined(__x86_64__)

// e^x for x <= 0 (scores minus their running max); lanes below -87 (or NaN) give 0. The lanes it
// keeps are in [-87, 0], where exp_avx512's clamp changes nothing, so it is left out.
INFERD_AVX512 inline __m512 exp_nonpositive(__m512 x) {
  const __mmask16 kept = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.0f), _CMP_GE_OQ);
  return _mm512_maskz_mov_ps(kept, exp_avx512_unclamped(x));
}

// Per row, always the same operations: scores as two fma chains over even and odd d, added;
// the V sum as one fma chain per 16-column block over the chunk's positions in order. Rows are
// processed R at a time only so that K and V loads are shared and the chains overlap. KCols gives
// K[d][c .. c + 15] as f32: the chunk's keys converted to f32 [hd][kChunk] (KColsF32), or a
// grouped K's own rows, converted as they are read (KColsGroup, below: the same values).
struct KColsF32 {
  const float* k;
  INFERD_AVX512 __m512 load(int64_t d) const { return _mm512_loadu_ps(k + d * kChunk); }
};

template <int R, typename KCols>
INFERD_AVX512 __attribute__((always_inline)) inline void scores_avx512(const float* const* q, const KCols& k,
                                                                       int64_t hd, __m512* out) {
  __m512 s0[R], s1[R];
  for (int r = 0; r < R; ++r) s0[r] = s1[r] = _mm512_setzero_ps();
  int64_t d = 0;
  for (; d + 2 <= hd; d += 2) {
    const __m512 k0 = k.load(d), k1 = k.load(d + 1);
    for (int r = 0; r < R; ++r) {
      s0[r] = _mm512_fmadd_ps(_mm512_set1_ps(q[r][d]), k0, s0[r]);
      s1[r] = _mm512_fmadd_ps(_mm512_set1_ps(q[r][d + 1]), k1, s1[r]);
    }
  }
  if (d < hd) {
    const __m512 k0 = k.load(d);
    for (int r = 0; r < R; ++r) s0[r] = _mm512_fmadd_ps(_mm512_set1_ps(q[r][d]), k0, s0[r]);
  }
  for (int r = 0; r < R; ++r) out[r] = _mm512_add_ps(s0[r], s1[r]);
}

// 16 consecutive elements at p as f32 (the lanes of `mask`; the others 0), before an 8-bit dtype's
// scale (the code, or FP8's code as an f16).
INFERD_AVX512 __attribute__((always_inline)) inline __m512 load16_unscaled_avx512(KvDType dtype,
                                                                                  const std::byte* p,
                                                                                  __mmask16 mask = 0xffff) {
  switch (dtype) {
    case KvDType::kF32: return _mm512_maskz_loadu_ps(mask, p);
    case KvDType::kF16: return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, p));
    case KvDType::kBF16:
      return _mm512_castsi512_ps(
          _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask, p)), 16));
    case KvDType::kInt8: return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(mask, p)));
    case KvDType::kFp8: {
      // fp8_e4m3_as_f16_bits on 16 bytes: sign-extended, shifted left by 7, the sign's copy in
      // bit 14 cleared.
      const __m256i w = _mm256_cvtepi8_epi16(_mm_maskz_loadu_epi8(mask, p));
      return _mm512_cvtph_ps(
          _mm256_and_si256(_mm256_slli_epi16(w, 7), _mm256_set1_epi16(static_cast<short>(0xbfff))));
    }
  }
  return _mm512_setzero_ps();
}

// Where the kernels read V[c][j .. j + 15] (the lanes of `mask`) as f32: the chunk's rows converted
// to f32 [kChunk][hd] (VRowsF32), or the cache's rows, converted as they are read (VRowsCache; the
// same values as load_rows_avx512 gives, so the same bits).
struct VRowsF32 {
  static constexpr bool kCostlyLoads = false;
  const float* v;
  int64_t hd;
  INFERD_AVX512 __m512 load(int64_t c, int64_t j, __mmask16 mask) const {
    return _mm512_maskz_loadu_ps(mask, v + c * hd + j);
  }
};
template <KvDType DT>
struct VRowsCache {
  // An 8-bit element costs a widening, a conversion and the scale's multiply: worth a single pass
  // over V for up to 8 rows (accumulate_v_avx512), which f16 and f32 loads are not (measured).
  static constexpr bool kCostlyLoads = DT == KvDType::kInt8 || DT == KvDType::kFp8;
  const RowRef* rows;  // [kChunk]: position c's row of this head, and its scale (8-bit dtypes)
  INFERD_AVX512 __m512 load(int64_t c, int64_t j, __mmask16 mask) const {
    const RowRef& r = rows[c];
    const __m512 x = load16_unscaled_avx512(DT, r.row + static_cast<size_t>(j) * kv_elem_bytes(DT), mask);
    if constexpr (kCostlyLoads) return _mm512_mul_ps(x, _mm512_set1_ps(r.scale));
    return x;
  }
};

// The lanes of NB blocks of 16 columns from j0 that fall inside a row of hd.
template <int NB>
INFERD_AVX512 __attribute__((always_inline)) inline void column_masks(int64_t hd, int64_t j0,
                                                                      __mmask16* mask) {
  for (int b = 0; b < NB; ++b) {
    const int64_t left = hd - j0 - 16 * b;
    mask[b] = left >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << left) - 1u);
  }
}

// acc[r][b] += sum_{c < valid[r]} pw[r][c] * V[c][j0 + 16 b ..] for R rows and NB blocks of 16
// columns: one fma chain per row and block over the chunk's positions in order (`common`: the
// positions every row sees; up to `most`, masked for the rows that do not).
template <int R, int NB, typename VRows>
INFERD_AVX512 __attribute__((always_inline)) inline void fma_chunk_avx512(
    const float* pw, const int64_t* valid, int64_t common, int64_t most, const VRows& v, int64_t j0,
    const __mmask16* mask, __m512 (&acc)[R][NB]) {
  int64_t c = 0;
  for (; c < common; ++c) {
    __m512 vc[NB];
    for (int b = 0; b < NB; ++b) vc[b] = v.load(c, j0 + 16 * b, mask[b]);
    for (int r = 0; r < R; ++r) {
      const __m512 p = _mm512_set1_ps(pw[r * 16 + c]);
      for (int b = 0; b < NB; ++b) acc[r][b] = _mm512_fmadd_ps(p, vc[b], acc[r][b]);
    }
  }
  for (; c < most; ++c) {  // positions some of the rows do not see (the causal diagonal)
    __m512 vc[NB];
    for (int b = 0; b < NB; ++b) vc[b] = v.load(c, j0 + 16 * b, mask[b]);
    for (int r = 0; r < R; ++r) {
      const __m512 p = _mm512_set1_ps(pw[r * 16 + c]);
      const auto live = static_cast<__mmask16>(c < valid[r] ? 0xffff : 0);
      for (int b = 0; b < NB; ++b) acc[r][b] = _mm512_mask3_fmadd_ps(p, vc[b], acc[r][b], live);
    }
  }
}

// out[r] = out[r] * corr[r] + sum_{c < valid[r]} pw[r][c] * V[c] for R rows, over NB blocks of 16
// columns starting at column j0: R x NB independent fma chains (one per row and block, each over c
// in order; a position past a row's valid ones leaves its chains as they are), so that the fma
// latency is hidden and the V loads are shared by the rows.
template <int R, int NB, typename VRows>
INFERD_AVX512 __attribute__((always_inline)) inline void accumulate_v_block_avx512(
    const float* pw /*[R][16]*/, const float* corr, const int64_t* valid, int64_t common, int64_t most,
    const VRows& v, int64_t hd, int64_t j0, float* const* out) {
  __mmask16 mask[NB];
  column_masks<NB>(hd, j0, mask);
  __m512 acc[R][NB];
  for (int r = 0; r < R; ++r)
    for (int b = 0; b < NB; ++b)
      acc[r][b] =
          _mm512_mul_ps(_mm512_maskz_loadu_ps(mask[b], out[r] + j0 + 16 * b), _mm512_set1_ps(corr[r]));
  fma_chunk_avx512<R, NB>(pw, valid, common, most, v, j0, mask, acc);
  for (int r = 0; r < R; ++r)
    for (int b = 0; b < NB; ++b) _mm512_mask_storeu_ps(out[r] + j0 + 16 * b, mask[b], acc[r][b]);
}

template <int R, typename VRows>
INFERD_AVX512 __attribute__((always_inline)) inline void accumulate_v_avx512(const float* pw /*[R][16]*/,
                                                                             const float* corr,
                                                                             const int64_t* valid,
                                                                             const VRows& v, int64_t hd,
                                                                             float* const* out) {
  int64_t common = valid[0], most = valid[0];
  for (int r = 1; r < R; ++r) {
    common = std::min(common, valid[r]);
    most = std::max(most, valid[r]);
  }
  // At most 16 chains: up to 4 rows over 4 blocks of 16 columns, 5 to 8 rows over 2 (so a GQA group
  // of 7 loads each V element once, not once per 4 rows: kCostlyLoads only).
  constexpr int kBlocks = R > 4 ? 2 : 4;
  for (int64_t j0 = 0; j0 < hd; j0 += 16 * kBlocks) {
    switch ((std::min<int64_t>(16 * kBlocks, hd - j0) + 15) / 16) {
      case 4:
        if constexpr (kBlocks == 4)
          accumulate_v_block_avx512<R, 4>(pw, corr, valid, common, most, v, hd, j0, out);
        break;
      case 3:
        if constexpr (kBlocks == 4)
          accumulate_v_block_avx512<R, 3>(pw, corr, valid, common, most, v, hd, j0, out);
        break;
      case 2: accumulate_v_block_avx512<R, 2>(pw, corr, valid, common, most, v, hd, j0, out); break;
      default: accumulate_v_block_avx512<R, 1>(pw, corr, valid, common, most, v, hd, j0, out); break;
    }
  }
}

// reduce8_avx512's step: max or add.
template <bool kMax>
INFERD_AVX512 inline __m512 reduce_op(__m512 x, __m512 y) {
  return kMax ? _mm512_max_ps(x, y) : _mm512_add_ps(x, y);
}

// Per vector a[0 .. 7], the max (kMax) or the sum of its 16 lanes, into lanes 0 .. 7 of the result
// (lanes 8 .. 15 copy lane 0). The sums are added in _mm512_reduce_add_ps's order: lanes (j, j+8),
// then (j, j+4), (j, j+2), (0, 1); the eight rows' steps share their shuffles.
template <bool kMax>
INFERD_AVX512 inline __m512 reduce8_avx512(const __m512* a) {
  constexpr auto op = reduce_op<kMax>;
  __m512 b[4], c[2];
  for (int i = 0; i < 4; ++i)  // rows 2i, 2i+1: their 8-lane halves added, one row per 256 bits
    b[i] = op(_mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0xEE),
              _mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0x44));
  for (int i = 0; i < 2; ++i)  // four rows, one per 128 bits
    c[i] = op(_mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0xDD),
              _mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0x88));
  // 128-bit lane k: rows k (of c[0]) and 4 + k (of c[1]), two values each, then one each.
  const __m512 d = op(_mm512_shuffle_ps(c[0], c[1], _MM_SHUFFLE(3, 2, 3, 2)),
                      _mm512_shuffle_ps(c[0], c[1], _MM_SHUFFLE(1, 0, 1, 0)));
  const __m512 e =
      op(_mm512_shuffle_ps(d, d, _MM_SHUFFLE(3, 1, 3, 1)), _mm512_shuffle_ps(d, d, _MM_SHUFFLE(2, 0, 2, 0)));
  return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 0, 0, 0, 0, 0, 0, 0, 0), e);
}

// One chunk's online-softmax step for n <= 8 rows (rows r0 .. r0 + n - 1 of the item; `dots` their
// unscaled scores, `limit` and `state` from row r0 on): per row its weights pw[i][0 .. 15] (0 past its
// valid positions), the factor corr[i] its output is to be multiplied by first, and its number of
// valid positions; the rows' maxima and sums are reduced together.
struct SoftmaxStep {
  alignas(64) float pw[8 * 16];
  alignas(64) float corr[16];
  int64_t valid[8];
};

INFERD_AVX512 __attribute__((always_inline)) inline void softmax_step_avx512(__m512* dots, int n,
                                                                             const int64_t* limit,
                                                                             float scale, RowState* state,
                                                                             SoftmaxStep& out) {
  const __m512 neg_inf = _mm512_set1_ps(-INFINITY);
  alignas(64) float old_max[16], old_sum[16], m[16], total[16];
  __mmask16 live[8];
  for (int i = 0; i < 8; ++i) {
    if (i >= n) {
      dots[i] = neg_inf;
      live[i] = 0;
      continue;
    }
    const int64_t valid = std::max<int64_t>(limit[i], 0);
    out.valid[i] = valid;
    live[i] = valid >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << valid) - 1u);
    dots[i] = _mm512_mask_blend_ps(live[i], neg_inf, _mm512_mul_ps(dots[i], _mm512_set1_ps(scale)));
    old_max[i] = state[i].max;
    old_sum[i] = state[i].sum;
  }
  for (int i = n; i < 16; ++i) old_max[i] = -INFINITY, old_sum[i] = 0.0f;
  const __m512 omax = _mm512_load_ps(old_max), osum = _mm512_load_ps(old_sum);
  const __m512 vm = _mm512_max_ps(omax, reduce8_avx512<true>(dots));
  // A row with nothing seen yet and nothing here stays as it is (probabilities 0, factor 1).
  const __mmask16 seen = _mm512_cmp_ps_mask(vm, neg_inf, _CMP_NEQ_OQ);
  const __mmask16 moved = _mm512_cmp_ps_mask(vm, omax, _CMP_NEQ_OQ);
  const __mmask16 had = _mm512_cmp_ps_mask(omax, neg_inf, _CMP_NEQ_OQ);
  // exp(old max - new max) where the max moved; exactly 1 where it did not.
  const __m512 vcorr =
      _mm512_mask_blend_ps(moved, _mm512_set1_ps(1.0f),
                           exp_nonpositive(_mm512_mask_blend_ps(had, neg_inf, _mm512_sub_ps(omax, vm))));
  _mm512_store_ps(m, vm);
  _mm512_store_ps(out.corr, vcorr);
  for (int i = 0; i < 8; ++i) {
    if (i >= n) {
      dots[i] = _mm512_setzero_ps();
      continue;
    }
    const auto keep = static_cast<__mmask16>(((seen >> i) & 1) != 0 ? live[i] : 0);
    dots[i] = _mm512_maskz_mov_ps(keep, exp_nonpositive(_mm512_sub_ps(dots[i], _mm512_set1_ps(m[i]))));
    _mm512_store_ps(out.pw + 16 * i, dots[i]);
  }
  _mm512_store_ps(total, _mm512_fmadd_ps(osum, vcorr, reduce8_avx512<false>(dots)));
  for (int i = 0; i < n; ++i) {
    if (((seen >> i) & 1) != 0) state[i] = {m[i], total[i]};
  }
}

// The scores of n <= 8 rows against one chunk's keys.
template <typename KCols>
INFERD_AVX512 __attribute__((always_inline)) inline void scores_rows_avx512(const float* const* q, int n,
                                                                            const KCols& k, int64_t hd,
                                                                            __m512* dots) {
  switch (n) {
    case 8: scores_avx512<8>(q, k, hd, dots); break;
    case 7: scores_avx512<7>(q, k, hd, dots); break;
    case 6: scores_avx512<6>(q, k, hd, dots); break;
    case 5: scores_avx512<5>(q, k, hd, dots); break;
    case 4: scores_avx512<4>(q, k, hd, dots); break;
    case 3: scores_avx512<3>(q, k, hd, dots); break;
    case 2: scores_avx512<2>(q, k, hd, dots); break;
    default: scores_avx512<1>(q, k, hd, dots); break;
  }
}

// A chunk's lanes past a row's valid positions never reach its softmax (their scores become -inf
// before the max), so KCols may give anything there.
template <typename KCols, typename VRows>
INFERD_AVX512 __attribute__((always_inline)) inline void chunk_rows_avx512_impl(
    const float* const* q, const int64_t* limit, int64_t rows, const KCols& k, const VRows& v, int64_t hd,
    float scale, RowState* state, float* o) {
  static_assert(kChunk == 16);
  constexpr int kRows = 8;  // 16 score chains in flight
  for (int64_t r0 = 0; r0 < rows; r0 += kRows) {
    const int n = static_cast<int>(std::min<int64_t>(kRows, rows - r0));
    __m512 dots[kRows];
    scores_rows_avx512(q + r0, n, k, hd, dots);
    SoftmaxStep step;
    softmax_step_avx512(dots, n, limit + r0, scale, state + r0, step);
    float* outs[kRows];
    for (int i = 0; i < n; ++i) outs[i] = o + (r0 + i) * hd;
    const float* pw = step.pw;
    const float* corr = step.corr;
    const int64_t* valids = step.valid;
    switch (VRows::kCostlyLoads ? n : 0) {  // 5 to 8 rows in one pass over V
      case 8: accumulate_v_avx512<8>(pw, corr, valids, v, hd, outs); continue;
      case 7: accumulate_v_avx512<7>(pw, corr, valids, v, hd, outs); continue;
      case 6: accumulate_v_avx512<6>(pw, corr, valids, v, hd, outs); continue;
      case 5: accumulate_v_avx512<5>(pw, corr, valids, v, hd, outs); continue;
      default: break;
    }
    for (int i = 0; i < n; i += 4) {
      const float* pwi = pw + 16 * i;
      switch (std::min(4, n - i)) {
        case 4: accumulate_v_avx512<4>(pwi, corr + i, valids + i, v, hd, outs + i); break;
        case 3: accumulate_v_avx512<3>(pwi, corr + i, valids + i, v, hd, outs + i); break;
        case 2: accumulate_v_avx512<2>(pwi, corr + i, valids + i, v, hd, outs + i); break;
        default: accumulate_v_avx512<1>(pwi, corr + i, valids + i, v, hd, outs + i); break;
      }
    }
  }
}

// accumulate_v_block_avx512 over several chunks in turn, the R x NB output blocks kept in registers
// between them: for each chunk, out = out * corr + its fma chains, the same operations in the same
// order as one call per chunk, without storing and loading the output in between.
template <int R, int NB>
INFERD_AVX512 inline void accumulate_v_chunks_block_avx512(const SoftmaxStep* steps, const float* v,
                                                           int64_t chunks, int i0, int64_t hd, int64_t j0,
                                                           float* const* out) {
  __mmask16 mask[NB];
  column_masks<NB>(hd, j0, mask);
  __m512 acc[R][NB];
  for (int r = 0; r < R; ++r)
    for (int b = 0; b < NB; ++b) acc[r][b] = _mm512_maskz_loadu_ps(mask[b], out[r] + j0 + 16 * b);
  for (int64_t j = 0; j < chunks; ++j, v += kChunk * hd) {
    const SoftmaxStep& step = steps[j];
    const float* pw = step.pw + 16 * i0;
    const int64_t* valid = step.valid + i0;
    int64_t common = valid[0], most = valid[0];
    for (int r = 1; r < R; ++r) {
      common = std::min(common, valid[r]);
      most = std::max(most, valid[r]);
    }
    for (int r = 0; r < R; ++r) {
      const __m512 corr = _mm512_set1_ps(step.corr[i0 + r]);
      for (int b = 0; b < NB; ++b) acc[r][b] = _mm512_mul_ps(acc[r][b], corr);
    }
    fma_chunk_avx512<R, NB>(pw, valid, common, most, VRowsF32{v, hd}, j0, mask, acc);
  }
  for (int r = 0; r < R; ++r)
    for (int b = 0; b < NB; ++b) _mm512_mask_storeu_ps(out[r] + j0 + 16 * b, mask[b], acc[r][b]);
}

template <int R>
INFERD_AVX512 inline void accumulate_v_chunks_avx512(const SoftmaxStep* steps, const float* v, int64_t chunks,
                                                     int i0, int64_t hd, float* const* out) {
  for (int64_t j0 = 0; j0 < hd; j0 += 64) {
    switch ((std::min<int64_t>(64, hd - j0) + 15) / 16) {
      case 4: accumulate_v_chunks_block_avx512<R, 4>(steps, v, chunks, i0, hd, j0, out); break;
      case 3: accumulate_v_chunks_block_avx512<R, 3>(steps, v, chunks, i0, hd, j0, out); break;
      case 2: accumulate_v_chunks_block_avx512<R, 2>(steps, v, chunks, i0, hd, j0, out); break;
      default: accumulate_v_chunks_block_avx512<R, 1>(steps, v, chunks, i0, hd, j0, out); break;
    }
  }
}

// Up to kBatchChunks chunks in turn for the same rows (a prompt's tile): the bits of one
// chunk_rows_avx512 call per chunk, in the chunks' order. Each group of 8 rows takes its softmax
// steps over all the chunks first (their scores, maxima, sums and weights), then the V sums with
// its output rows held in registers across the chunks. q[j]: chunk j's query rows (the sink's
// keys take their own queries); limit[j * limit_stride + r]; k: [chunks][hd][kChunk]; v:
// [chunks][kChunk][hd], all as f32.
constexpr int64_t kBatchChunks = 8;

INFERD_AVX512 void chunks_rows_avx512(const float* const* const* q, const int64_t* limit,
                                      int64_t limit_stride, int64_t chunks, int64_t rows, const float* k,
                                      const float* v, int64_t hd, float scale, RowState* state, float* o) {
  constexpr int kRows = 8;
  SoftmaxStep steps[kBatchChunks];
  for (int64_t r0 = 0; r0 < rows; r0 += kRows) {
    const int n = static_cast<int>(std::min<int64_t>(kRows, rows - r0));
    for (int64_t j = 0; j < chunks; ++j) {
      __m512 dots[kRows];
      scores_rows_avx512(q[j] + r0, n, KColsF32{k + j * hd * kChunk}, hd, dots);
      softmax_step_avx512(dots, n, limit + j * limit_stride + r0, scale, state + r0, steps[j]);
    }
    float* outs[kRows];
    for (int i = 0; i < n; ++i) outs[i] = o + (r0 + i) * hd;
    for (int i = 0; i < n; i += 4) {
      switch (std::min(4, n - i)) {
        case 4: accumulate_v_chunks_avx512<4>(steps, v, chunks, i, hd, outs + i); break;
        case 3: accumulate_v_chunks_avx512<3>(steps, v, chunks, i, hd, outs + i); break;
        case 2: accumulate_v_chunks_avx512<2>(steps, v, chunks, i, hd, outs + i); break;
        default: accumulate_v_chunks_avx512<1>(steps, v, chunks, i, hd, outs + i); break;
      }
    }
  }
}

INFERD_AVX512 void chunk_rows_avx512(const float* const* q, const int64_t* limit, int64_t rows,
                                     const float* k, const float* v, int64_t hd, float scale, RowState* state,
                                     float* o) {
  chunk_rows_avx512_impl(q, limit, rows, KColsF32{k}, VRowsF32{v, hd}, hd, scale, state, o);
}

// chunk_rows_avx512 with V read from the cache's rows (v_rows[c]: position c's row of the head).
template <KvDType DT>
INFERD_AVX512 void chunk_rows_cache_v_avx512(const float* const* q, const int64_t* limit, int64_t rows,
                                             const float* k, const RowRef* v_rows, int64_t hd, float scale,
                                             RowState* state, float* o) {
  chunk_rows_avx512_impl(q, limit, rows, KColsF32{k}, VRowsCache<DT>{v_rows}, hd, scale, state, o);
}

using CacheVChunkFn = void (*)(const float* const*, const int64_t*, int64_t, const float*, const RowRef*,
                               int64_t, float, RowState*, float*);

// make(std::integral_constant<KvDType, dtype>): a kernel instance per KV dtype.
template <typename Make>
auto for_kv_dtype(KvDType dtype, Make make) {
  using C = std::integral_constant<KvDType, KvDType::kF32>;
  switch (dtype) {
    case KvDType::kF32: break;
    case KvDType::kF16: return make(std::integral_constant<KvDType, KvDType::kF16>{});
    case KvDType::kBF16: return make(std::integral_constant<KvDType, KvDType::kBF16>{});
    case KvDType::kInt8: return make(std::integral_constant<KvDType, KvDType::kInt8>{});
    case KvDType::kFp8: return make(std::integral_constant<KvDType, KvDType::kFp8>{});
  }
  return make(C{});
}

CacheVChunkFn cache_v_chunk_kernel(KvDType dtype) {
  return for_kv_dtype(
      dtype, [](auto dt) -> CacheVChunkFn { return chunk_rows_cache_v_avx512<decltype(dt)::value>; });
}

// 16 values from element d of one K/V row, as f32.
INFERD_AVX512 inline __m512 load16_avx512(KvDType dtype, const RowRef& r, int64_t d) {
  const __m512 x = load16_unscaled_avx512(dtype, r.row + static_cast<size_t>(d) * kv_elem_bytes(dtype));
  return kv_dtype_is_8bit(dtype) ? _mm512_mul_ps(x, _mm512_set1_ps(r.scale)) : x;
}

// K[d][0 .. 15] of a chunk read from a grouped K as it is (load_key_group_avx512's values in the
// chunk's valid lanes).
template <KvDType DT>
struct KColsGroup {
  const std::byte* at;
  __m512 scale;  // 8-bit dtypes
  INFERD_AVX512 __m512 load(int64_t d) const {
    const __m512 x = load16_unscaled_avx512(DT, at + static_cast<size_t>(d) * kChunk * kv_elem_bytes(DT));
    if constexpr (DT == KvDType::kInt8 || DT == KvDType::kFp8) return _mm512_mul_ps(x, scale);
    return x;
  }
};

// The decode kernel of a grouped K: K and V both read from the cache as they are.
template <KvDType DT>
INFERD_AVX512 void chunk_rows_cache_kv_avx512(const float* const* q, const int64_t* limit, int64_t rows,
                                              const KeyGroupRef& k, const RowRef* v_rows, int64_t hd,
                                              float scale, RowState* state, float* o) {
  chunk_rows_avx512_impl(q, limit, rows, KColsGroup<DT>{k.at, _mm512_loadu_ps(k.scale)},
                         VRowsCache<DT>{v_rows}, hd, scale, state, o);
}

using CacheKvChunkFn = void (*)(const float* const*, const int64_t*, int64_t, const KeyGroupRef&,
                                const RowRef*, int64_t, float, RowState*, float*);

CacheKvChunkFn cache_kv_chunk_kernel(KvDType dtype) {
  return for_kv_dtype(
      dtype, [](auto dt) -> CacheKvChunkFn { return chunk_rows_cache_kv_avx512<decltype(dt)::value>; });
}

// load_key_group with 16-wide loads: no transpose, the group holds the keys as [hd][16].
INFERD_AVX512 void load_key_group_avx512(KvDType dtype, const KeyGroupRef& g, int64_t n, int64_t hd,
                                         float* out /* [hd][kChunk] */) {
  const size_t row_bytes = kChunk * kv_elem_bytes(dtype);
  const auto live = n >= kChunk ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << n) - 1u);
  if (kv_dtype_is_8bit(dtype)) {
    const __m512 scale = _mm512_loadu_ps(g.scale);
    for (int64_t d = 0; d < hd; ++d)
      _mm512_storeu_ps(out + d * kChunk,
                       _mm512_maskz_mul_ps(live, load16_unscaled_avx512(dtype, g.at + d * row_bytes), scale));
    return;
  }
  for (int64_t d = 0; d < hd; ++d)
    _mm512_storeu_ps(out + d * kChunk,
                     _mm512_maskz_mov_ps(live, load16_unscaled_avx512(dtype, g.at + d * row_bytes)));
}

// load_rows with the 16-wide loads.
INFERD_AVX512 void load_rows_avx512(const KvLayerView& kv, const std::byte* base, const float* scales,
                                    std::span<const int32_t> block_table, int64_t first, int64_t n,
                                    int64_t kv_dim, int64_t offset, int64_t hd, float* out /* [n][hd] */) {
  for (int64_t c = 0; c < n; ++c) {
    const RowRef r = row_ref(kv, base, scales, block_table, first + c, kv_dim, offset, hd);
    float* dst = out + c * hd;
    int64_t d = 0;
    for (; d + 16 <= hd; d += 16) _mm512_storeu_ps(dst + d, load16_avx512(kv.dtype, r, d));
    for (; d < hd; ++d) dst[d] = load_one(kv.dtype, r, d);
  }
}

// K of positions first .. first+n-1 (n <= 16) of one head, transposed: out[d][c] (zeros for
// c >= n), 16 x 16 tiles converted and transposed in registers.
INFERD_AVX512 void load_transposed_avx512(const KvLayerView& kv, const std::byte* base, const float* scales,
                                          std::span<const int32_t> block_table, int64_t first, int64_t n,
                                          int64_t kv_dim, int64_t offset, int64_t hd, float* out) {
  RowRef src[16];
  for (int64_t c = 0; c < n; ++c)
    src[c] = row_ref(kv, base, scales, block_table, first + c, kv_dim, offset, hd);
  int64_t d0 = 0;
  for (; d0 + 16 <= hd; d0 += 16) {
    __m512 r[16], t[16];
    for (int c = 0; c < 16; ++c) r[c] = c < n ? load16_avx512(kv.dtype, src[c], d0) : _mm512_setzero_ps();
    for (int i = 0; i < 16; i += 2) {
      t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
      t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
      r[i] = _mm512_shuffle_ps(t[i], t[i + 2], 0x44);
      r[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], 0xEE);
      r[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0x44);
      r[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
    }
    for (int i = 0; i < 16; i += 8) {
      for (int j = 0; j < 4; ++j) {
        t[i + j] = _mm512_shuffle_f32x4(r[i + j], r[i + j + 4], 0x88);
        t[i + j + 4] = _mm512_shuffle_f32x4(r[i + j], r[i + j + 4], 0xDD);
      }
    }
    for (int j = 0; j < 8; ++j) {
      r[j] = _mm512_shuffle_f32x4(t[j], t[j + 8], 0x88);
      r[j + 8] = _mm512_shuffle_f32x4(t[j], t[j + 8], 0xDD);
    }
    for (int i = 0; i < 16; ++i) _mm512_storeu_ps(out + (d0 + i) * kChunk, r[i]);
  }
  for (int64_t d = d0; d < hd; ++d) {
    for (int64_t c = 0; c < kChunk; ++c) {
      out[d * kChunk + c] = c < n ? load_one(kv.dtype, src[c], d) : 0.0f;
    }
  }
}
#endif

using ChunkFn = void (*)(const float* const*, const int64_t*, int64_t, const float*, const float*, int64_t,
                         float, RowState*, float*);

#if defined(__x86_64__)
// PREFETCHT0 of the line at p, as an asm statement with a side effect: GCC takes a function whose
// only effects are __builtin_prefetch (_mm_prefetch) calls for a pure one and drops its calls.
inline void prefetch_line(const std::byte* p) {
  __asm__ volatile("prefetcht0 %0" : : "m"(*reinterpret_cast<const char*>(p)));
}

// Prefetches the K and V rows of one head (offset .. offset + hd of each slot) for the chunk of
// positions at c0 (up to end), where the sequence's block table has them.
void prefetch_chunk(const KvLayerView& kv, const AttentionSequence& seq, int64_t c0, int64_t end,
                    int64_t kv_dim, int64_t offset, int64_t hd) {
  if (c0 >= end) return;
  const int64_t first = c0 < seq.sink_len ? c0 : c0 - seq.evicted;
  const int64_t n = std::min(kChunk, end - c0);
  if (first < 0 || (first + n - 1) / kv.block_size >= static_cast<int64_t>(seq.block_table.size())) return;
  const size_t elem = kv_elem_bytes(kv.dtype);
  const size_t bytes = static_cast<size_t>(hd) * elem;
  const auto* keys = static_cast<const std::byte*>(kv.key);
  const auto* values = static_cast<const std::byte*>(kv.value);
  if (kv.key_groups) {  // the head's keys of the chunk: one run of hd x 16 elements; V: 16 slots in a row
    const int64_t slot = slot_of(kv, seq.block_table, first);
    const size_t at = static_cast<size_t>(key_group_index(slot, offset, kv_dim)) * elem;
    for (size_t line = at & ~size_t{63}; line < at + kChunk * bytes; line += 64) prefetch_line(keys + line);
    for (int64_t c = 0; c < n; ++c) {
      const size_t row = static_cast<size_t>((slot + c) * kv_dim + offset) * elem;
      for (size_t line = row & ~size_t{63}; line < row + bytes; line += 64) prefetch_line(values + line);
    }
    return;
  }
  for (int64_t c = 0; c < n; ++c) {
    const int64_t p = first + c;
    const int64_t slot = slot_of(kv, seq.block_table, p);
    const size_t at = static_cast<size_t>(slot * kv_dim + offset) * elem;
    for (size_t line = at & ~size_t{63}; line < at + bytes; line += 64) {
      prefetch_line(keys + line);
      prefetch_line(values + line);
    }
  }
}
#endif

void chunk_rows_scalar(const float* const* q, const int64_t* limit, int64_t rows, const float* k,
                       const float* v, int64_t hd, float scale, RowState* state, float* o) {
  chunk_rows_generic(q, limit, rows, k, v, hd, scale, state, o);
}

#if defined(__x86_64__)
__attribute__((target("avx2,fma,f16c"))) void chunk_rows_avx2(const float* const* q, const int64_t* limit,
                                                              int64_t rows, const float* k, const float* v,
                                                              int64_t hd, float scale, RowState* state,
                                                              float* o) {
  chunk_rows_generic(q, limit, rows, k, v, hd, scale, state, o);
}
#endif

ChunkFn chunk_kernel(Isa isa) {
#if defined(__x86_64__)
  if (static_cast<int>(isa) >= static_cast<int>(Isa::kAvx512)) return chunk_rows_avx512;
  if (static_cast<int>(isa) >= static_cast<int>(Isa::kAvx2)) return chunk_rows_avx2;
#else
  (void)isa;
#endif
  return chunk_rows_scalar;
}

}  // namespace

void paged_attention(const float* q, std::span<const AttentionSequence> sequences,
                     std::span<const int32_t> token_sequence, const KvLayerView& kv,
                     const AttentionShape& shape, float* out, ThreadPool& pool, Isa isa) {
  (void)token_sequence;  // rows are found through each sequence's query range
  const int64_t hd = shape.head_dim;
  const int64_t q_dim = shape.num_heads * hd;
  const int64_t kv_dim = shape.num_kv_heads * hd;
  const int64_t group = shape.num_heads / shape.num_kv_heads;
  INFERD_CHECK(!kv.key_groups || kv.block_size % kKeyGroup == 0);
  const ChunkFn chunk_fn = chunk_kernel(isa);
#if defined(__x86_64__)
  const CacheVChunkFn cache_v_fn = cache_v_chunk_kernel(kv.dtype);
  const CacheKvChunkFn cache_kv_fn = cache_kv_chunk_kernel(kv.dtype);
#endif
  // The transposed K is the same values either way; the vector transpose only saves time.
  [[maybe_unused]] const bool vector_transpose = static_cast<int>(isa) >= static_cast<int>(Isa::kAvx512);
  // Items: every sequence's query tokens in tiles, times the KV heads, times the segments of a
  // long context. Listed in an order that alternates long and short contexts (tiles from the
  // front and back of each prompt), so the contiguous split over threads gets a fair share of
  // the causal work.
  thread_local std::vector<Item> item_list;  // the caller's; workers reach it through `items`
  thread_local std::vector<float> partial_list;
  std::vector<Item>& items = item_list;
  std::vector<float>& partials = partial_list;
  items.clear();
  int64_t partial_floats = 0;
  bool split = false;
  for (size_t s = 0; s < sequences.size(); ++s) {
    const AttentionSequence& seq = sequences[s];
    const int64_t tiles = (seq.num_queries + kTileTokens - 1) / kTileTokens;
    for (int64_t i = 0; i < tiles; ++i) {
      const int64_t tile = i % 2 == 0 ? i / 2 : tiles - 1 - i / 2;
      const int64_t first = seq.query_start + tile * kTileTokens;
      const int64_t n = std::min(kTileTokens, seq.query_start + seq.num_queries - first);
      // The tile's last token sits at this position: its context decides the segments.
      const int64_t last_pos = seq.context_len - seq.num_queries + (first + n - 1 - seq.query_start);
      const auto segments = static_cast<int32_t>(last_pos / kSegment + 1);
      split = split || segments > 1;
      for (int64_t g = 0; g < shape.num_kv_heads; ++g) {
        for (int32_t sg = 0; sg < segments; ++sg) {
          items.push_back({static_cast<int32_t>(s), static_cast<int32_t>(g), first, n, sg, segments,
                           segments > 1 ? partial_floats : -1});
          if (segments > 1) partial_floats += n * group * (hd + 2);
        }
      }
    }
  }
  if (partials.size() < static_cast<size_t>(partial_floats))
    partials.resize(static_cast<size_t>(partial_floats));
  // Each thread's buffers for one item (a tile of rows against one KV head), grown here for every
  // thread: any thread may run any item.
  struct Scratch {
    std::vector<float> kt, vc, rows_out, krows;
    std::vector<RowState> state;
    std::vector<const float*> qrows, sink_qrows;
    std::vector<int64_t> pos, limit, lowest;
  };
  // A prompt's tile takes its chunks kBatchChunks at a time (chunks_rows_avx512): their K and V
  // converted side by side, each with its rows' limits.
#if defined(__x86_64__)
  const int64_t batch_chunks = vector_transpose ? kBatchChunks : 1;
#else
  const int64_t batch_chunks = 1;
#endif
  thread_local PerThread<Scratch> scratch_list;  // the caller's; workers reach it by reference
  PerThread<Scratch>& scratch = scratch_list;
  scratch.prepare(pool, [&](Scratch& s) {
    const auto max_rows = static_cast<size_t>(kTileTokens * group);
    if (s.kt.size() < static_cast<size_t>(batch_chunks * hd * kChunk)) {
      s.kt.resize(static_cast<size_t>(batch_chunks * hd * kChunk));
      s.vc.resize(s.kt.size());
    }
    if (s.krows.size() < static_cast<size_t>(hd * kChunk)) s.krows.resize(static_cast<size_t>(hd * kChunk));
    if (s.rows_out.size() < max_rows * static_cast<size_t>(hd))
      s.rows_out.resize(max_rows * static_cast<size_t>(hd));
    if (s.state.size() < max_rows) {
      s.state.resize(max_rows);
      s.qrows.resize(max_rows);
      s.sink_qrows.resize(max_rows);
      s.pos.resize(max_rows);
      s.lowest.resize(max_rows);
    }
    if (s.limit.size() < max_rows * static_cast<size_t>(batch_chunks))
      s.limit.resize(max_rows * static_cast<size_t>(batch_chunks));
  });
  pool.parallel_for(static_cast<int64_t>(items.size()), [&](int64_t begin, int64_t end) {
    Scratch& mine = scratch.mine();
    std::vector<float>&kt = mine.kt, &vc = mine.vc, &rows_out = mine.rows_out, &krows = mine.krows;
    std::vector<RowState>& state = mine.state;
    std::vector<const float*>&qrows = mine.qrows, &sink_qrows = mine.sink_qrows;
    std::vector<int64_t>&pos = mine.pos, &limit = mine.limit, &lowest = mine.lowest;
    const auto* key_base = static_cast<const std::byte*>(kv.key);
    const auto* value_base = static_cast<const std::byte*>(kv.value);
    const int64_t limit_stride = kTileTokens * group;
    for (int64_t it = begin; it < end; ++it) {
      const Item& item = items[static_cast<size_t>(it)];
      const AttentionSequence& seq = sequences[static_cast<size_t>(item.sequence)];
      const int64_t rows = item.num_tokens * group;
      const bool windowed = seq.window > 0;
      int64_t last_pos = 0;
      for (int64_t t = 0; t < item.num_tokens; ++t) {
        const int64_t row_index = item.first_token + t;
        const int64_t p = seq.context_len - seq.num_queries + (row_index - seq.query_start);
        last_pos = std::max(last_pos, p);
        for (int64_t h = 0; h < group; ++h) {
          const auto r = static_cast<size_t>(t * group + h);
          const int64_t head_offset = (item.kv_head * group + h) * hd;
          qrows[r] = q + row_index * q_dim + head_offset;
          sink_qrows[r] = windowed && seq.sink_q != nullptr
                              ? seq.sink_q + (row_index - seq.query_start) * q_dim + head_offset
                              : qrows[r];
          pos[r] = p;
          lowest[r] = windowed ? window_start(seq, p) : 0;
          state[r] = {-INFINITY, 0.0f};
        }
      }
      std::fill_n(rows_out.begin(), rows * hd, 0.0f);
      const int64_t offset = item.kv_head * hd;
#if defined(__x86_64__)
      // The chunk's keys of this head as f32 [hd][kChunk]: read as they are from a grouped K,
      // transposed from rows otherwise.
      const auto load_keys_avx512 = [&](int64_t first, int64_t n, float* out) {
        if (kv.key_groups) {
          load_key_group_avx512(kv.dtype,
                                key_group_ref(kv, key_base, kv.key_scale, slot_of(kv, seq.block_table, first),
                                              n, kv_dim, offset, hd),
                                n, hd, out);
        } else {
          load_transposed_avx512(kv, key_base, kv.key_scale, seq.block_table, first, n, kv_dim, offset, hd,
                                 out);
        }
      };
#endif
      const int64_t seg_begin = static_cast<int64_t>(item.segment) * kSegment;
      const int64_t seg_end =
          item.num_segments > 1 ? std::min(last_pos + 1, seg_begin + kSegment) : last_pos + 1;
#if defined(__x86_64__)
      // The first two chunks (the loop asks for each later one two chunks ahead).
      prefetch_chunk(kv, seq, seg_begin, seg_end, kv_dim, offset, hd);
      prefetch_chunk(kv, seq, seg_begin + kChunk, seg_end, kv_dim, offset, hd);
      // A prompt tile's chunks gathered so far for chunks_rows_avx512 (more than 8 rows).
      const float* const* batch_q[kBatchChunks];
      int64_t batched = 0;
      const auto run_batch = [&] {
        if (batched == 0) return;
        chunks_rows_avx512(batch_q, limit.data(), limit_stride, batched, rows, kt.data(), vc.data(), hd,
                           shape.scale, state.data(), rows_out.data());
        batched = 0;
      };
#endif
      for (int64_t c0 = seg_begin; c0 < seg_end; c0 += kChunk) {
        const int64_t n = std::min(kChunk, seg_end - c0);
        // Each row sees the chunk whole, in part (its own position inside) or not at all (past
        // its position; between the sink and its window). A chunk no row sees is not read: its
        // slots may have been given back.
        const bool in_sink = c0 < seq.sink_len;
        bool seen = false;
#if defined(__x86_64__)
        int64_t* lim = limit.data() + batched * limit_stride;
#else
        int64_t* lim = limit.data();
#endif
        for (int64_t r = 0; r < rows; ++r) {
          const auto i = static_cast<size_t>(r);
          lim[r] = !in_sink && c0 < lowest[i] ? 0 : std::min(n, pos[i] + 1 - c0);
          seen = seen || lim[r] > 0;
        }
        if (!seen) continue;
        const int64_t first = in_sink ? c0 : c0 - seq.evicted;  // index into the block table
#if defined(__x86_64__)
        // The K and V rows two chunks ahead, asked for now: a head's row is a short piece of each
        // position's slot, and the slots of one context are spread over the cache's blocks, so
        // the hardware prefetchers left decode at long contexts waiting on memory
        // (BM_AttentionDecode: 5-6 GB/s without, 10-12 GB/s with; 1 to 4 chunks ahead alike).
        prefetch_chunk(kv, seq, c0 + 2 * kChunk, seg_end, kv_dim, offset, hd);
        // V is read from the cache as it is when few rows share the chunk (decode): up to 8 rows
        // take V in at most two passes of accumulate_v; more rows take it converted once.
        if (vector_transpose && rows <= 8) {
          RowRef v_rows[kChunk];
          if (kv.key_groups) {  // the chunk is one group: its positions are 16 slots in a row
            const int64_t slot = slot_of(kv, seq.block_table, first);
            for (int64_t c = 0; c < n; ++c)
              v_rows[c] = row_at(kv, value_base, kv.value_scale, slot + c, kv_dim, offset, hd);
            cache_kv_fn(in_sink ? sink_qrows.data() : qrows.data(), lim, rows,
                        key_group_ref(kv, key_base, kv.key_scale, slot, n, kv_dim, offset, hd), v_rows, hd,
                        shape.scale, state.data(), rows_out.data());
            continue;
          }
          for (int64_t c = 0; c < n; ++c)
            v_rows[c] =
                row_ref(kv, value_base, kv.value_scale, seq.block_table, first + c, kv_dim, offset, hd);
          load_keys_avx512(first, n, kt.data());
          cache_v_fn(in_sink ? sink_qrows.data() : qrows.data(), lim, rows, kt.data(), v_rows, hd,
                     shape.scale, state.data(), rows_out.data());
          continue;
        }
        if (vector_transpose) {
          load_keys_avx512(first, n, kt.data() + batched * hd * kChunk);
          load_rows_avx512(kv, value_base, kv.value_scale, seq.block_table, first, n, kv_dim, offset, hd,
                           vc.data() + batched * kChunk * hd);
          batch_q[batched] = in_sink ? sink_qrows.data() : qrows.data();
          if (++batched == kBatchChunks) run_batch();
          continue;
        }
#endif
        {
          if (kv.key_groups) {
            load_key_group(kv.dtype,
                           key_group_ref(kv, key_base, kv.key_scale, slot_of(kv, seq.block_table, first), n,
                                         kv_dim, offset, hd),
                           n, hd, kt.data());
          } else {
            load_rows(kv, key_base, kv.key_scale, seq.block_table, first, n, kv_dim, offset, hd,
                      krows.data());
            for (int64_t d = 0; d < hd; ++d)
              for (int64_t c = 0; c < kChunk; ++c)
                kt[static_cast<size_t>(d * kChunk + c)] =
                    c < n ? krows[static_cast<size_t>(c * hd + d)] : 0.0f;
          }
          load_rows(kv, value_base, kv.value_scale, seq.block_table, first, n, kv_dim, offset, hd, vc.data());
        }
        chunk_fn(in_sink ? sink_qrows.data() : qrows.data(), lim, rows, kt.data(), vc.data(), hd, shape.scale,
                 state.data(), rows_out.data());
      }
#if defined(__x86_64__)
      run_batch();
#endif
      if (item.num_segments > 1) {  // this segment's rows, for the merge below
        float* dst = partials.data() + item.partial;
        for (int64_t r = 0; r < rows; ++r, dst += hd + 2) {
          dst[0] = state[static_cast<size_t>(r)].max;
          dst[1] = state[static_cast<size_t>(r)].sum;
          std::copy_n(rows_out.data() + r * hd, hd, dst + 2);
        }
        continue;
      }
      for (int64_t t = 0; t < item.num_tokens; ++t) {
        for (int64_t h = 0; h < group; ++h) {
          const auto r = static_cast<size_t>(t * group + h);
          const float inv = 1.0f / state[r].sum;
          float* o = out + (item.first_token + t) * q_dim + (item.kv_head * group + h) * hd;
          const float* src = rows_out.data() + r * static_cast<size_t>(hd);
          for (int64_t d = 0; d < hd; ++d) o[d] = src[d] * inv;
        }
      }
    }
  });
  if (!split) return;
  // Merge: per row, its segments in order, weighted by exp(segment max - overall max). Items of
  // one (tile, KV head) are consecutive, segment 0 first.
  thread_local std::vector<int64_t> merge_list;
  std::vector<int64_t>& merges = merge_list;  // index of each split group's segment 0
  merges.clear();
  for (size_t i = 0; i < items.size(); ++i)
    if (items[i].num_segments > 1 && items[i].segment == 0) merges.push_back(static_cast<int64_t>(i));
  pool.parallel_for(static_cast<int64_t>(merges.size()), [&](int64_t begin, int64_t end) {
    for (int64_t m = begin; m < end; ++m) {
      const Item& first = items[static_cast<size_t>(merges[static_cast<size_t>(m)])];
      const int64_t rows = first.num_tokens * group;
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t t = r / group, h = r % group;
        float top = -INFINITY;
        for (int32_t sg = 0; sg < first.num_segments; ++sg)
          top = std::max(top, partials[static_cast<size_t>(first.partial + (sg * rows + r) * (hd + 2))]);
        float* o = out + (first.first_token + t) * q_dim + (first.kv_head * group + h) * hd;
        std::fill_n(o, hd, 0.0f);
        float sum = 0.0f;
        for (int32_t sg = 0; sg < first.num_segments; ++sg) {
          const float* src = partials.data() + first.partial + (sg * rows + r) * (hd + 2);
          if (src[0] == -INFINITY) continue;  // no position of this segment is in the row's context
          const float w = std::exp(src[0] - top);
          sum += w * src[1];
          for (int64_t d = 0; d < hd; ++d) o[d] += w * src[2 + d];
        }
        const float inv = 1.0f / sum;
        for (int64_t d = 0; d < hd; ++d) o[d] *= inv;
      }
    }
  });
}

}  // namespace inferd
