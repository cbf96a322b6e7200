#include "kernels/attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>

#include "common/half.h"
#include "kv/kv_cache.h"
#include "test_support.h"

namespace inferd {
namespace {

// Naive causal attention over contiguous K/V of one sequence ([ctx, kv_dim]) for one query.
void reference(const float* q, const std::vector<float>& k, const std::vector<float>& v, int64_t pos,
               const AttentionShape& s, float* out) {
  const int64_t kv_dim = s.num_kv_heads * s.head_dim;
  for (int64_t h = 0; h < s.num_heads; ++h) {
    const int64_t kvh = h / (s.num_heads / s.num_kv_heads);
    std::vector<double> w(static_cast<size_t>(pos + 1));
    double mx = -1e300;
    for (int64_t p = 0; p <= pos; ++p) {
      double d = 0;
      for (int64_t i = 0; i < s.head_dim; ++i) {
        d += static_cast<double>(q[h * s.head_dim + i]) *
             k[static_cast<size_t>(p * kv_dim + kvh * s.head_dim + i)];
      }
      w[static_cast<size_t>(p)] = d * s.scale;
      mx = std::max(mx, w[static_cast<size_t>(p)]);
    }
    double sum = 0;
    for (auto& x : w) sum += (x = std::exp(x - mx));
    for (int64_t i = 0; i < s.head_dim; ++i) {
      double acc = 0;
      for (int64_t p = 0; p <= pos; ++p)
        acc += w[static_cast<size_t>(p)] / sum * v[static_cast<size_t>(p * kv_dim + kvh * s.head_dim + i)];
      out[h * s.head_dim + i] = static_cast<float>(acc);
    }
  }
}

struct Seq {
  int64_t cached, queries;
};

std::vector<Isa> paths() {
  std::vector<Isa> out{Isa::kScalar};
  if (static_cast<int>(detected_isa()) >= static_cast<int>(Isa::kAvx2)) out.push_back(Isa::kAvx2);
  if (static_cast<int>(detected_isa()) >= static_cast<int>(Isa::kAvx512)) out.push_back(Isa::kAvx512);
  return out;
}

// Sequences over shuffled blocks of a paged cache, with GQA, checked against naive attention on
// every path; f16 / bf16 storage within its rounding.
void check_against_naive(const AttentionShape& shape, const std::vector<Seq>& seqs, int64_t block_size,
                         uint32_t seed) {
  std::mt19937 rng(seed);
  const int64_t kv_dim = shape.num_kv_heads * shape.head_dim;
  const int64_t q_dim = shape.num_heads * shape.head_dim;
  int64_t num_blocks = 0;  // exactly the sequences' blocks, shuffled
  for (const Seq& sq : seqs) num_blocks += (sq.cached + sq.queries + block_size - 1) / block_size;
  std::vector<float> key_cache(static_cast<size_t>(num_blocks * block_size * kv_dim));
  std::vector<float> value_cache(key_cache.size());
  std::vector<int32_t> free_blocks(num_blocks);
  std::iota(free_blocks.begin(), free_blocks.end(), 0);
  std::shuffle(free_blocks.begin(), free_blocks.end(), rng);
  std::vector<std::vector<int32_t>> tables;
  std::vector<std::vector<float>> contiguous_k, contiguous_v;
  std::vector<AttentionSequence> att;
  std::vector<int32_t> token_seq;
  int64_t row = 0;
  size_t next_block = 0;
  for (size_t si = 0; si < seqs.size(); ++si) {
    const int64_t ctx = seqs[si].cached + seqs[si].queries;
    std::vector<int32_t> table;
    for (int64_t b = 0; b < (ctx + block_size - 1) / block_size; ++b)
      table.push_back(free_blocks[next_block++]);
    auto k = test::random_floats(static_cast<size_t>(ctx * kv_dim), rng);
    auto v = test::random_floats(static_cast<size_t>(ctx * kv_dim), rng);
    for (int64_t p = 0; p < ctx; ++p) {
      const int64_t slot = table[static_cast<size_t>(p / block_size)] * block_size + p % block_size;
      std::copy_n(k.begin() + p * kv_dim, kv_dim, key_cache.begin() + slot * kv_dim);
      std::copy_n(v.begin() + p * kv_dim, kv_dim, value_cache.begin() + slot * kv_dim);
    }
    tables.push_back(table);
    contiguous_k.push_back(k);
    contiguous_v.push_back(v);
    for (int64_t i = 0; i < seqs[si].queries; ++i) token_seq.push_back(static_cast<int32_t>(si));
    row += seqs[si].queries;
  }
  row = 0;
  for (size_t si = 0; si < seqs.size(); ++si) {
    att.push_back({row, seqs[si].queries, seqs[si].cached + seqs[si].queries, tables[si]});
    row += seqs[si].queries;
  }
  const int64_t num_tokens = row;
  auto q = test::random_floats(static_cast<size_t>(num_tokens * q_dim), rng);
  for (Isa isa : paths()) {
    SCOPED_TRACE(std::string(isa_name(isa)));
    std::vector<float> out(q.size());
    ThreadPool pool(3);
    paged_attention(q.data(), att, token_seq,
                    KvLayerView{key_cache.data(), value_cache.data(), block_size, KvDType::kF32}, shape,
                    out.data(), pool, isa);
    // The same K/V stored as f16 and bf16: attention within the storage rounding of f32's.
    for (KvDType dtype : {KvDType::kF16, KvDType::kBF16}) {
      std::vector<uint16_t> k16(key_cache.size()), v16(value_cache.size());
      for (size_t i = 0; i < k16.size(); ++i) {
        k16[i] = dtype == KvDType::kF16 ? f32_to_f16(key_cache[i]) : f32_to_bf16(key_cache[i]);
        v16[i] = dtype == KvDType::kF16 ? f32_to_f16(value_cache[i]) : f32_to_bf16(value_cache[i]);
      }
      std::vector<float> out16(q.size());
      paged_attention(q.data(), att, token_seq, KvLayerView{k16.data(), v16.data(), block_size, dtype}, shape,
                      out16.data(), pool, isa);
      const double bound = dtype == KvDType::kF16 ? 2e-3 : 2e-2;
      EXPECT_LT(test::relative_max_error(out16.data(), out.data(), out.size()), bound);
    }
    for (int64_t t = 0; t < num_tokens; ++t) {
      const AttentionSequence& s = att[static_cast<size_t>(token_seq[static_cast<size_t>(t)])];
      const int64_t pos = s.context_len - s.num_queries + (t - s.query_start);
      std::vector<float> want(static_cast<size_t>(q_dim));
      const auto si = static_cast<size_t>(token_seq[static_cast<size_t>(t)]);
      reference(q.data() + t * q_dim, contiguous_k[si], contiguous_v[si], pos, shape, want.data());
      for (int64_t i = 0; i < q_dim; ++i)
        ASSERT_NEAR(out[static_cast<size_t>(t * q_dim + i)], want[static_cast<size_t>(i)], 1e-5) << t;
    }
  }
}

// Three sequences: a prefill chunk after 5 cached tokens, a decode at position 17, a fresh
// prompt; odd head size.
TEST(AttentionTest, PagedMatchesNaiveWithShuffledBlocksAndGqa) {
  check_against_naive({6, 2, 10, 1.0f / std::sqrt(10.0f)}, {{5, 7}, {17, 1}, {0, 3}}, 4, 77);
}

// Contexts spanning several 16-position chunks, tiles of 16 query tokens cut mid-prompt, Qwen's
// head size and a GQA group of 7.
TEST(AttentionTest, PagedMatchesNaiveAcrossChunksAndTiles) {
  check_against_naive({14, 2, 64, 0.125f}, {{0, 21}, {50, 1}, {33, 9}, {3, 2}}, 16, 5);
  check_against_naive({3, 1, 33, 0.2f}, {{40, 17}}, 8, 6);
}

// Batch invariance: a token's output is the same bits whether its sequence runs alone, with
// other sequences, or its prompt is split into chunks (the later chunk reading the earlier's K/V),
// on a context of `ctx` over shuffled blocks; `decoded` tokens are also run one at a time next to
// another sequence.
void expect_batch_and_chunk_invariant(int64_t ctx, const std::vector<int64_t>& chunks,
                                      const std::vector<int64_t>& decoded, uint32_t seed) {
  for (Isa isa : paths()) {
    std::mt19937 rng(seed);
    const AttentionShape shape{6, 2, 64, 0.125f};
    const int64_t kv_dim = 2 * 64, q_dim = 6 * 64, block_size = 16;
    const int64_t blocks = (ctx + block_size - 1) / block_size + 1;  // the last one: the other sequence's
    std::vector<int32_t> table(static_cast<size_t>(blocks));
    std::iota(table.begin(), table.end(), 0);
    std::shuffle(table.begin(), table.end(), rng);
    const std::vector<int32_t> other_table = {table.back()};
    table.pop_back();
    std::vector<float> key(static_cast<size_t>(blocks * block_size * kv_dim)), value(key.size());
    for (auto& x : key) x = std::uniform_real_distribution<float>(-1, 1)(rng);
    for (auto& x : value) x = std::uniform_real_distribution<float>(-1, 1)(rng);
    auto q = test::random_floats(static_cast<size_t>(ctx * q_dim), rng);
    const KvLayerView kv{key.data(), value.data(), block_size, KvDType::kF32};
    ThreadPool pool(2);
    std::vector<float> whole(q.size());
    std::vector<int32_t> ts(static_cast<size_t>(ctx), 0);
    const AttentionSequence all{0, ctx, ctx, table};
    paged_attention(q.data(), {&all, 1}, ts, kv, shape, whole.data(), pool, isa);
    std::vector<float> chunked(q.size());
    int64_t done = 0;
    for (int64_t n : chunks) {
      const AttentionSequence part{0, n, done + n, table};
      std::vector<int32_t> pts(static_cast<size_t>(n), 0);
      paged_attention(q.data() + done * q_dim, {&part, 1}, pts, kv, shape, chunked.data() + done * q_dim,
                      pool, isa);
      done += n;
    }
    ASSERT_EQ(done, ctx);
    EXPECT_EQ(whole, chunked) << isa_name(isa);
    for (int64_t token : decoded) {
      const AttentionSequence both[2] = {{0, 3, 10, other_table}, {3, 1, token + 1, table}};
      std::vector<float> qq(static_cast<size_t>(4 * q_dim));
      std::copy_n(q.begin() + token * q_dim, q_dim, qq.begin() + 3 * q_dim);
      std::vector<float> out(qq.size());
      std::vector<int32_t> bts = {0, 0, 0, 1};
      paged_attention(qq.data(), both, bts, kv, shape, out.data(), pool, isa);
      EXPECT_TRUE(std::equal(out.begin() + 3 * q_dim, out.end(), whole.begin() + token * q_dim))
          << isa_name(isa) << " token " << token;
    }
  }
}

TEST(AttentionTest, TokenOutputIndependentOfBatchAndChunking) {
  expect_batch_and_chunk_invariant(45, {13, 1, 31}, {20}, 31);
}

// Contexts past one segment (512 positions): the split over segments and its merge match naive
// attention, prefill tiles straddling a segment boundary included.
TEST(AttentionTest, PagedMatchesNaiveOverSegmentsOfLongContexts) {
  check_against_naive({6, 2, 64, 0.125f}, {{1100, 9}, {1290, 1}, {505, 12}, {0, 40}}, 16, 41);
  check_against_naive({3, 3, 20, 0.2f}, {{1023, 2}, {511, 1}}, 8, 42);
}

// Over segments: chunks that cross the segment boundaries (a tile split into segments next to
// tokens that fit in one), and tokens decoded on either side of a boundary.
TEST(AttentionTest, TokenOutputIndependentOfBatchAndChunkingOverSegments) {
  expect_batch_and_chunk_invariant(1100, {509, 7, 1, 500, 83}, {511, 512, 1099}, 32);
}

// A cache of any dtype gives the bits of an f32 cache holding its values (f16 / bf16 rounded;
// 8-bit: q times the row's scale, FP8's code as its f16 times 2^8), on every path: prefill tiles,
// decode rows (which read V from the cache rows as they are), a context over several segments, GQA
// groups of 1, 3 and 7, and head sizes that are not a multiple of 16 (the masked tail of a row).
TEST(AttentionTest, EveryCacheDtypeGivesTheBitsOfAnF32CacheOfItsValues) {
  struct Case {
    AttentionShape shape;
    int64_t ctx, queries;
  };
  const Case cases[] = {{{14, 2, 64, 0.125f}, 700, 1},
                        {{6, 2, 40, 0.15f}, 300, 9},
                        {{3, 3, 20, 0.2f}, 45, 1},
                        {{9, 3, 64, 0.125f}, 1100, 3}};
  std::mt19937 rng(77);
  for (KvDType dtype : {KvDType::kF16, KvDType::kBF16, KvDType::kInt8, KvDType::kFp8}) {
    for (const Case& c : cases) {
      const AttentionShape& shape = c.shape;
      const int64_t kv_dim = shape.num_kv_heads * shape.head_dim, q_dim = shape.num_heads * shape.head_dim;
      const int64_t block_size = 16, blocks = (c.ctx + block_size - 1) / block_size;
      std::vector<int32_t> table(static_cast<size_t>(blocks));
      std::iota(table.begin(), table.end(), 0);
      std::shuffle(table.begin(), table.end(), rng);
      const int64_t slots = blocks * block_size;
      const auto n = static_cast<size_t>(slots * kv_dim);
      const auto heads = static_cast<size_t>(slots * shape.num_kv_heads);
      // Both tensors' bytes in the dtype, their scales (8-bit), and the f32 values they stand for.
      std::vector<std::byte> raw[2];
      std::vector<float> scales[2], values[2];
      for (int t = 0; t < 2; ++t) {
        raw[t].resize(n * 2);
        values[t].resize(n);
        scales[t].resize(heads);
        for (float& x : scales[t]) x = std::uniform_real_distribution<float>(0.002f, 0.01f)(rng);
        for (size_t i = 0; i < n; ++i) {
          const float x = std::uniform_real_distribution<float>(-1, 1)(rng);
          const float scale = scales[t][i / static_cast<size_t>(shape.head_dim)];
          if (dtype == KvDType::kF16 || dtype == KvDType::kBF16) {
            const uint16_t h = dtype == KvDType::kF16 ? f32_to_f16(x) : f32_to_bf16(x);
            std::memcpy(raw[t].data() + 2 * i, &h, 2);
            values[t][i] = dtype == KvDType::kF16 ? f16_to_f32(h) : bf16_to_f32(h);
          } else if (dtype == KvDType::kInt8) {
            const auto q = static_cast<int8_t>(std::uniform_int_distribution<int>(-127, 127)(rng));
            raw[t][i] = static_cast<std::byte>(q);
            values[t][i] = static_cast<float>(q) * scale;
          } else {
            const uint8_t code = f32_to_fp8_e4m3(x * 300.0f);
            raw[t][i] = static_cast<std::byte>(code);
            values[t][i] = f16_to_f32(fp8_e4m3_as_f16_bits(code)) * (scale * 256.0f);
          }
        }
      }
      const bool scaled = dtype == KvDType::kInt8 || dtype == KvDType::kFp8;
      const auto q = test::random_floats(static_cast<size_t>(c.queries * q_dim), rng);
      const std::vector<int32_t> ts(static_cast<size_t>(c.queries), 0);
      const AttentionSequence seq{0, c.queries, c.ctx, table};
      const KvLayerView cache{raw[0].data(),
                              raw[1].data(),
                              block_size,
                              dtype,
                              scaled ? scales[0].data() : nullptr,
                              scaled ? scales[1].data() : nullptr};
      const KvLayerView f32{values[0].data(), values[1].data(), block_size, KvDType::kF32};
      ThreadPool pool(2);
      for (Isa isa : paths()) {
        std::vector<float> a(q.size()), b(q.size());
        paged_attention(q.data(), {&seq, 1}, ts, cache, shape, a.data(), pool, isa);
        paged_attention(q.data(), {&seq, 1}, ts, f32, shape, b.data(), pool, isa);
        EXPECT_EQ(a, b) << kv_dtype_name(dtype) << " " << isa_name(isa) << " head size " << shape.head_dim
                        << ", " << c.queries << " queries";
      }
    }
  }
}

// Keys stored in groups of 16 slots (what KvCache keeps for the CPU backends) give the bits of the
// same keys in rows, for every dtype and path: prefill tiles and decode rows in one batch, partial
// last chunks, contexts over several segments, GQA groups of 1, 3 and 7, head sizes that are not a
// multiple of 16, blocks of 16 and 48 slots, and a StreamingLLM sequence (sink, window, evicted
// positions).
TEST(AttentionTest, KeysInGroupsGiveTheBitsOfKeysInRows) {
  struct Case {
    AttentionShape shape;
    int64_t block_size;
  };
  const Case cases[] = {{{14, 2, 64, 0.125f}, 16}, {{6, 2, 40, 0.15f}, 48}, {{3, 3, 20, 0.2f}, 16}};
  std::mt19937 rng(91);
  for (KvDType dtype : {KvDType::kF32, KvDType::kF16, KvDType::kBF16, KvDType::kInt8, KvDType::kFp8}) {
    for (const Case& c : cases) {
      const AttentionShape& shape = c.shape;
      const int64_t kv_dim = shape.num_kv_heads * shape.head_dim, q_dim = shape.num_heads * shape.head_dim;
      // Sequences: a prompt of 21 after 5 cached (tiles of 16 and a partial chunk), a decode at
      // position 700 (two segments), a decode at 37, and a windowed decode at 299 with a sink of 16
      // whose positions 16 .. 175 were given back.
      struct Seq {
        int64_t ctx, queries, window, sink, evicted;
      };
      const Seq seqs[] = {{26, 21, 0, 0, 0}, {701, 1, 0, 0, 0}, {38, 1, 0, 0, 0}, {300, 1, 64, 16, 160}};
      int64_t blocks = 0;
      for (const Seq& q : seqs) blocks += (q.ctx - q.evicted + c.block_size - 1) / c.block_size;
      std::vector<int32_t> free_blocks(static_cast<size_t>(blocks));
      std::iota(free_blocks.begin(), free_blocks.end(), 0);
      std::shuffle(free_blocks.begin(), free_blocks.end(), rng);
      const int64_t slots = blocks * c.block_size;
      const size_t elem = dtype == KvDType::kF32 ? 4 : kv_dtype_is_8bit(dtype) ? 1 : 2;
      const auto n = static_cast<size_t>(slots * kv_dim);
      std::vector<std::byte> rows[2];
      std::vector<float> scales[2];
      for (int t = 0; t < 2; ++t) {
        rows[t].resize(n * elem);
        scales[t].resize(static_cast<size_t>(slots * shape.num_kv_heads));
        for (float& x : scales[t]) x = std::uniform_real_distribution<float>(0.002f, 0.01f)(rng);
        for (size_t i = 0; i < n; ++i) {
          const float x = std::uniform_real_distribution<float>(-1, 1)(rng);
          std::byte* at = rows[t].data() + i * elem;
          if (dtype == KvDType::kF32) {
            std::memcpy(at, &x, 4);
          } else if (dtype == KvDType::kF16 || dtype == KvDType::kBF16) {
            const uint16_t h = dtype == KvDType::kF16 ? f32_to_f16(x) : f32_to_bf16(x);
            std::memcpy(at, &h, 2);
          } else if (dtype == KvDType::kInt8) {
            *at = static_cast<std::byte>(
                static_cast<int8_t>(std::uniform_int_distribution<int>(-127, 127)(rng)));
          } else {
            *at = static_cast<std::byte>(f32_to_fp8_e4m3(x * 300.0f));
          }
        }
      }
      // The keys regrouped: element i of slot s at key_group_index(s, i, kv_dim).
      std::vector<std::byte> groups(rows[0].size());
      for (int64_t slot = 0; slot < slots; ++slot)
        for (int64_t i = 0; i < kv_dim; ++i)
          std::memcpy(groups.data() + static_cast<size_t>(key_group_index(slot, i, kv_dim)) * elem,
                      rows[0].data() + static_cast<size_t>(slot * kv_dim + i) * elem, elem);
      std::vector<std::vector<int32_t>> tables;
      std::vector<AttentionSequence> att;
      std::vector<int32_t> token_seq;
      int64_t row = 0;
      size_t next = 0;
      for (size_t si = 0; si < std::size(seqs); ++si) {
        const Seq& q = seqs[si];
        std::vector<int32_t> table;
        for (int64_t b = 0; b < (q.ctx - q.evicted + c.block_size - 1) / c.block_size; ++b)
          table.push_back(free_blocks[next++]);
        tables.push_back(std::move(table));
        for (int64_t i = 0; i < q.queries; ++i) token_seq.push_back(static_cast<int32_t>(si));
      }
      for (size_t si = 0; si < std::size(seqs); ++si) {
        const Seq& q = seqs[si];
        AttentionSequence a{row, q.queries, q.ctx, tables[si]};
        a.window = q.window;
        a.sink_len = q.sink;
        a.evicted = q.evicted;
        att.push_back(a);
        row += q.queries;
      }
      const auto q = test::random_floats(static_cast<size_t>(row * q_dim), rng);
      const bool scaled = kv_dtype_is_8bit(dtype);
      KvLayerView in_rows{rows[0].data(),
                          rows[1].data(),
                          c.block_size,
                          dtype,
                          scaled ? scales[0].data() : nullptr,
                          scaled ? scales[1].data() : nullptr};
      KvLayerView in_groups = in_rows;
      in_groups.key = groups.data();
      in_groups.key_groups = true;
      ThreadPool pool(2);
      for (Isa isa : paths()) {
        std::vector<float> a(q.size()), b(q.size());
        paged_attention(q.data(), att, token_seq, in_groups, shape, a.data(), pool, isa);
        paged_attention(q.data(), att, token_seq, in_rows, shape, b.data(), pool, isa);
        EXPECT_EQ(a, b) << kv_dtype_name(dtype) << " " << isa_name(isa) << " head size " << shape.head_dim
                        << ", blocks of " << c.block_size;
        // And the batch's tokens each alone (decode rows where a token was part of a prefill tile).
        for (size_t si = 0; si < att.size(); ++si) {
          AttentionSequence one = att[si];
          const int64_t last = one.query_start + one.num_queries - 1;
          one.query_start = 0;
          one.num_queries = 1;
          const std::vector<int32_t> ts = {0};
          std::vector<float> alone(static_cast<size_t>(q_dim));
          paged_attention(q.data() + last * q_dim, {&one, 1}, ts, in_groups, shape, alone.data(), pool, isa);
          EXPECT_TRUE(std::equal(alone.begin(), alone.end(), b.begin() + last * q_dim))
              << kv_dtype_name(dtype) << " " << isa_name(isa) << " sequence " << si;
        }
      }
    }
  }
}

}  // namespace
}  // namespace inferd
