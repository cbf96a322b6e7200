// StreamingLLM windows in paged attention: sink + sliding window against a naive reference, the
// given-back positions of a table with a hole, and batch / chunking invariance.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "kernels/attention.h"
#include "test_support.h"

namespace inferd {
namespace {

std::vector<Isa> paths() {
  std::vector<Isa> out{Isa::kScalar};
  if (static_cast<int>(detected_isa()) >= static_cast<int>(Isa::kAvx2)) out.push_back(Isa::kAvx2);
  if (static_cast<int>(detected_isa()) >= static_cast<int>(Isa::kAvx512)) out.push_back(Isa::kAvx512);
  return out;
}

// The window's first position past the sink, written out here apart from the header's.
int64_t first_seen(int64_t pos, int64_t window, int64_t sink_len) {
  const int64_t lo = std::max<int64_t>(0, pos + 1 - window);
  return std::max(sink_len, lo - lo % 16);
}

// Naive attention of one query at `pos`: the sink [0, sink_len) scored with sq, positions
// first_seen .. pos with q. k, v: [ctx, kv_dim].
void reference(const float* q, const float* sq, const std::vector<float>& k, const std::vector<float>& v,
               int64_t pos, int64_t window, int64_t sink_len, const AttentionShape& s, float* out) {
  const int64_t kv_dim = s.num_kv_heads * s.head_dim;
  std::vector<int64_t> seen;
  for (int64_t p = 0; p < std::min(sink_len, pos + 1); ++p) seen.push_back(p);
  for (int64_t p = first_seen(pos, window, sink_len); p <= pos; ++p) seen.push_back(p);
  for (int64_t h = 0; h < s.num_heads; ++h) {
    const int64_t kvh = h / (s.num_heads / s.num_kv_heads);
    std::vector<double> w(seen.size());
    double mx = -1e300;
    for (size_t j = 0; j < seen.size(); ++j) {
      const float* qq = seen[j] < sink_len ? sq : q;
      double d = 0;
      for (int64_t i = 0; i < s.head_dim; ++i)
        d += static_cast<double>(qq[h * s.head_dim + i]) *
             k[static_cast<size_t>(seen[j] * kv_dim + kvh * s.head_dim + i)];
      w[j] = d * s.scale;
      mx = std::max(mx, w[j]);
    }
    double sum = 0;
    for (auto& x : w) sum += (x = std::exp(x - mx));
    for (int64_t i = 0; i < s.head_dim; ++i) {
      double acc = 0;
      for (size_t j = 0; j < seen.size(); ++j)
        acc += w[j] / sum * v[static_cast<size_t>(seen[j] * kv_dim + kvh * s.head_dim + i)];
      out[h * s.head_dim + i] = static_cast<float>(acc);
    }
  }
}

struct WindowCase {
  int64_t context;  // positions, the queries' included
  int64_t queries;  // the last `queries` positions
  int64_t window;
  int64_t sink_len;  // multiple of 16
  bool give_back;    // leave the positions no query sees out of the table (as large as allowed)
};

// One sequence's K/V in shuffled blocks of a paged cache (positions between the sink and the
// first query's window left out when give_back), its queries and sink queries.
struct Paged {
  std::vector<float> k, v;  // contiguous [context, kv_dim]: the reference's
  std::vector<float> key_cache, value_cache;
  std::vector<int32_t> table;
  std::vector<float> q, sq;
  AttentionSequence seq;
};

Paged make_paged(const WindowCase& c, const AttentionShape& shape, int64_t block_size, std::mt19937& rng) {
  Paged p;
  const int64_t kv_dim = shape.num_kv_heads * shape.head_dim;
  const int64_t q_dim = shape.num_heads * shape.head_dim;
  p.k = test::random_floats(static_cast<size_t>(c.context * kv_dim), rng);
  p.v = test::random_floats(static_cast<size_t>(c.context * kv_dim), rng);
  p.q = test::random_floats(static_cast<size_t>(c.queries * q_dim), rng);
  p.sq = test::random_floats(p.q.size(), rng);
  p.seq.query_start = 0;
  p.seq.num_queries = c.queries;
  p.seq.context_len = c.context;
  p.seq.window = c.window;
  p.seq.sink_len = c.sink_len;
  if (c.give_back) {
    const int64_t unit = std::lcm<int64_t>(block_size, 16);
    const int64_t first = first_seen(c.context - c.queries, c.window, c.sink_len);
    p.seq.evicted = (first - c.sink_len) / unit * unit;
  }
  const int64_t held = c.context - p.seq.evicted;
  const int64_t blocks = (held + block_size - 1) / block_size;
  p.table.resize(static_cast<size_t>(blocks));
  std::iota(p.table.begin(), p.table.end(), 0);
  std::shuffle(p.table.begin(), p.table.end(), rng);
  p.key_cache.assign(static_cast<size_t>(blocks * block_size * kv_dim), NAN);  // NaN: never read
  p.value_cache.assign(p.key_cache.size(), NAN);
  for (int64_t pos = 0; pos < c.context; ++pos) {
    if (pos >= c.sink_len && pos < c.sink_len + p.seq.evicted) continue;
    const int64_t i = pos < c.sink_len ? pos : pos - p.seq.evicted;
    const int64_t slot = p.table[static_cast<size_t>(i / block_size)] * block_size + i % block_size;
    std::copy_n(p.k.begin() + pos * kv_dim, kv_dim, p.key_cache.begin() + slot * kv_dim);
    std::copy_n(p.v.begin() + pos * kv_dim, kv_dim, p.value_cache.begin() + slot * kv_dim);
  }
  p.seq.block_table = p.table;
  p.seq.sink_q = p.sq.data();
  return p;
}

std::vector<float> run(const Paged& p, const AttentionShape& shape, int64_t block_size, Isa isa,
                       ThreadPool& pool) {
  std::vector<float> out(p.q.size());
  std::vector<int32_t> token_seq(static_cast<size_t>(p.seq.num_queries), 0);
  paged_attention(p.q.data(), {&p.seq, 1}, token_seq,
                  KvLayerView{p.key_cache.data(), p.value_cache.data(), block_size, KvDType::kF32}, shape,
                  out.data(), pool, isa);
  return out;
}

// Random windows, sinks, heads and block sizes (odd head sizes, GQA, contexts over several 512
// segments), the positions no query sees given back or not: every path within 1e-5 of naive.
TEST(AttentionWindowTest, SinkAndWindowMatchNaiveOnEveryPath) {
  std::mt19937 rng(7);
  ThreadPool pool(3);
  for (int trial = 0; trial < 24; ++trial) {
    const int64_t head_dim = std::vector<int64_t>{8, 24, 40, 64, 72}[static_cast<size_t>(trial % 5)];
    const int64_t kv_heads = 1 + trial % 2, group = 1 + trial % 3;
    const AttentionShape shape{kv_heads * group, kv_heads, head_dim, 1.0f / std::sqrt(float(head_dim))};
    const int64_t block_size = std::vector<int64_t>{16, 8, 32, 48}[static_cast<size_t>(trial % 4)];
    std::uniform_int_distribution<int64_t> ctx(2, trial < 12 ? 300 : 1400);
    WindowCase c;
    c.context = ctx(rng);
    c.queries = std::min<int64_t>(c.context, 1 + static_cast<int64_t>(rng() % (trial % 3 == 0 ? 1 : 40)));
    c.window = 16 + static_cast<int64_t>(rng() % 200);
    c.sink_len = 16 * static_cast<int64_t>(rng() % 3);
    c.give_back = trial % 2 == 0;
    SCOPED_TRACE("context " + std::to_string(c.context) + " queries " + std::to_string(c.queries) +
                 " window " + std::to_string(c.window) + " sink " + std::to_string(c.sink_len) + " block " +
                 std::to_string(block_size));
    const Paged p = make_paged(c, shape, block_size, rng);
    const int64_t q_dim = shape.num_heads * head_dim;
    for (Isa isa : paths()) {
      SCOPED_TRACE(std::string(isa_name(isa)));
      const std::vector<float> out = run(p, shape, block_size, isa, pool);
      std::vector<float> want(static_cast<size_t>(q_dim));
      for (int64_t t = 0; t < c.queries; ++t) {
        const int64_t pos = c.context - c.queries + t;
        reference(p.q.data() + t * q_dim, p.sq.data() + t * q_dim, p.k, p.v, pos, c.window, c.sink_len, shape,
                  want.data());
        for (int64_t i = 0; i < q_dim; ++i)
          ASSERT_NEAR(out[static_cast<size_t>(t * q_dim + i)], want[static_cast<size_t>(i)], 1e-5)
              << "query " << t;
      }
    }
  }
}

// A query's output has the same bits whether the positions it does not see are in the table or
// given back, whether it is computed alone or with the other queries of a chunk, and (a window
// covering the whole context, the sink scored with q) as full attention's.
TEST(AttentionWindowTest, GivingBackAndChunkingKeepTheBitsAndAWideWindowIsFullAttention) {
  std::mt19937 rng(11);
  ThreadPool pool(2);
  const AttentionShape shape{6, 2, 40, 0.15f};
  const int64_t q_dim = 6 * 40, block_size = 16;
  for (const WindowCase c : {WindowCase{1300, 37, 200, 16, true}, WindowCase{700, 9, 64, 0, true},
                             WindowCase{2100, 1, 300, 32, true}}) {
    Paged whole = make_paged(c, shape, block_size, rng);
    ASSERT_GT(whole.seq.evicted, 0);
    // The same K/V, nothing given back.
    WindowCase kept = c;
    kept.give_back = false;
    std::mt19937 same(3);
    Paged full = make_paged(kept, shape, block_size, same);
    full.k = whole.k;
    full.v = whole.v;
    full.q = whole.q;
    full.sq = whole.sq;
    full.seq.sink_q = full.sq.data();
    const int64_t kv_dim = shape.num_kv_heads * shape.head_dim;
    for (int64_t pos = 0; pos < c.context; ++pos) {
      const int64_t slot = full.table[static_cast<size_t>(pos / block_size)] * block_size + pos % block_size;
      std::copy_n(full.k.begin() + pos * kv_dim, kv_dim, full.key_cache.begin() + slot * kv_dim);
      std::copy_n(full.v.begin() + pos * kv_dim, kv_dim, full.value_cache.begin() + slot * kv_dim);
    }
    for (Isa isa : paths()) {
      SCOPED_TRACE(std::string(isa_name(isa)));
      const std::vector<float> a = run(whole, shape, block_size, isa, pool);
      const std::vector<float> b = run(full, shape, block_size, isa, pool);
      ASSERT_EQ(a, b);
      // The last query alone (a decode step): its row's bits.
      Paged last = whole;
      last.seq.num_queries = 1;
      last.q.assign(whole.q.end() - q_dim, whole.q.end());
      last.sq.assign(whole.sq.end() - q_dim, whole.sq.end());
      last.seq.block_table = last.table;
      last.seq.sink_q = last.sq.data();
      const std::vector<float> alone = run(last, shape, block_size, isa, pool);
      ASSERT_TRUE(std::equal(alone.begin(), alone.end(), a.end() - q_dim));
    }
  }
  // A window over the whole context with sink_q = q: full attention's bits.
  WindowCase wide{900, 20, 4096, 16, false};
  Paged w = make_paged(wide, shape, block_size, rng);
  w.sq = w.q;
  w.seq.sink_q = w.sq.data();
  Paged plain = w;
  plain.seq.window = 0;
  plain.seq.sink_len = 0;
  plain.seq.sink_q = nullptr;
  plain.seq.block_table = plain.table;
  for (Isa isa : paths())
    ASSERT_EQ(run(w, shape, block_size, isa, pool), run(plain, shape, block_size, isa, pool));
}

TEST(AttentionWindowTest, SinkLengthRoundsUpToBlocksAndSixteen) {
  EXPECT_EQ(streaming_sink_len({0, 64}, 16), 0);
  EXPECT_EQ(streaming_sink_len({4, 64}, 16), 16);
  EXPECT_EQ(streaming_sink_len({4, 64}, 8), 16);
  EXPECT_EQ(streaming_sink_len({17, 64}, 32), 32);
  EXPECT_EQ(streaming_sink_len({4, 64}, 24), 48);
  AttentionSequence s;
  s.window = 100;
  s.sink_len = 16;
  EXPECT_EQ(window_start(s, 50), 16);     // the window still reaches the sink
  EXPECT_EQ(window_start(s, 150), 48);    // 51 rounded down to 48
  EXPECT_EQ(sink_gap(s, 150), 32);        // positions 16 .. 47 between sink and window
  EXPECT_EQ(window_start(s, 1000), 896);  // 901 -> 896
}

}  // namespace
}  // namespace inferd
