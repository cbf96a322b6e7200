#include "kv/block_pool.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <numeric>
#include <random>

#include "kv/kv_cache_manager.h"

namespace inferd {
namespace {

TEST(BlockPoolTest, AllocateReleaseAndLruOrder) {
  BlockPool pool(4);
  EXPECT_EQ(pool.num_free_blocks(), 4);
  auto a = pool.allocate(3);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(*a, (std::vector<int32_t>{0, 1, 2}));
  EXPECT_FALSE(pool.allocate(2).has_value());  // only 1 free: nothing taken
  EXPECT_EQ(pool.num_free_blocks(), 1);
  pool.release(std::vector<int32_t>{2, 0});  // no content key: each goes to the head, 0 last
  auto b = pool.allocate(3);
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(*b, (std::vector<int32_t>{0, 2, 3}));
}

TEST(BlockPoolTest, FreedBlocksWithContentQueueBehindEmptyOnes) {
  BlockPool pool(4);
  auto a = pool.allocate(4);
  ASSERT_TRUE(a.has_value());
  pool.cache_block(0, BlockHash{1, 0});
  pool.cache_block(1, BlockHash{2, 0});
  pool.release(std::vector<int32_t>{1, 2, 0, 3});  // cached 1 then 0 to the tail; 2 and 3 to the head
  EXPECT_DOUBLE_EQ(pool.content_usage(), 0.5);     // two free blocks still hold content
  auto b = pool.allocate(4);
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(*b, (std::vector<int32_t>{3, 2, 1, 0}));
  EXPECT_EQ(pool.num_cached_blocks(), 0);  // reused: their keys are gone
}

TEST(BlockPoolTest, SharedBlocksFreeOnLastRelease) {
  BlockPool pool(2);
  auto a = pool.allocate(1);
  ASSERT_TRUE(a.has_value());
  pool.add_ref((*a)[0]);
  EXPECT_EQ(pool.ref_count((*a)[0]), 2);
  pool.release(*a);
  EXPECT_EQ(pool.num_free_blocks(), 1);
  pool.release(*a);
  EXPECT_EQ(pool.num_free_blocks(), 2);
}

// The index of cached blocks (open addressing, fixed size) against a plain map, on random
// caching, freeing and reuse. Keys share a few home slots at the table's end, so probe runs
// wrap around and deletions shift entries back across the wrap.
TEST(PrefixCacheTest, CachedIndexMatchesAMapUnderCollisions) {
  std::mt19937 rng(23);
  for (const int32_t num_blocks : {1, 5, 8, 13}) {
    BlockPool pool(num_blocks);
    size_t slots = 16;
    while (slots < 2 * static_cast<size_t>(num_blocks)) slots *= 2;
    std::map<std::pair<uint64_t, uint64_t>, int32_t> expected;  // key -> block
    std::vector<BlockHash> keys;                                // every key ever offered
    std::vector<int32_t> held;
    auto forget_block = [&](int32_t b) {
      for (auto it = expected.begin(); it != expected.end(); ++it) {
        if (it->second == b) {
          expected.erase(it);
          return;
        }
      }
    };
    for (int op = 0; op < 4000; ++op) {
      const uint32_t what = rng() % 3;
      if (what == 0 && pool.num_free_blocks() > 0) {
        const int32_t n = 1 + static_cast<int32_t>(rng() % static_cast<uint32_t>(pool.num_free_blocks()));
        std::vector<int32_t> got;
        ASSERT_TRUE(pool.allocate(n, &got));
        ASSERT_EQ(got.size(), static_cast<size_t>(n));
        for (int32_t b : got) forget_block(b);  // reused: its old key is gone
        held.insert(held.end(), got.begin(), got.end());
      } else if (what == 1 && !held.empty()) {
        const int32_t b = held[rng() % held.size()];
        // Homes in the last three slots and the first: runs wrap around the table's end.
        const BlockHash h{(slots - 3 + rng() % 4) + (uint64_t{rng() % 8} << 32), rng() % 6};
        keys.push_back(h);
        const bool keyed =
            std::any_of(expected.begin(), expected.end(), [&](const auto& e) { return e.second == b; });
        pool.cache_block(b, h);
        if (!keyed && expected.count({h.lo, h.hi}) == 0) expected[{h.lo, h.hi}] = b;
      } else if (!held.empty()) {
        const size_t i = rng() % held.size();
        pool.release(std::vector<int32_t>{held[i]});
        held.erase(held.begin() + static_cast<std::ptrdiff_t>(i));
      }
      ASSERT_EQ(pool.num_cached_blocks(), static_cast<int32_t>(expected.size()));
      for (const BlockHash& h : keys) {
        auto it = expected.find({h.lo, h.hi});
        ASSERT_EQ(pool.find_cached(h), it == expected.end() ? -1 : it->second) << "op " << op;
      }
      if (keys.size() > 64) keys.erase(keys.begin(), keys.begin() + 32);
    }
  }
}

TEST(KVCacheManagerTest, TablesGrowAndSlotsMapThroughBlocks) {
  BlockPool pool(8);
  KVCacheManager m(pool, 4);
  ASSERT_TRUE(m.allocate_slots(1, 5));  // 2 blocks
  ASSERT_TRUE(m.allocate_slots(2, 1));  // 1 block
  ASSERT_TRUE(m.allocate_slots(1, 8));  // still 2
  EXPECT_EQ(m.block_table(1).size(), 2u);
  ASSERT_TRUE(m.allocate_slots(1, 9));  // 3
  const auto t = m.block_table(1);
  EXPECT_EQ(m.slot(1, 0), t[0] * 4);
  EXPECT_EQ(m.slot(1, 8), t[2] * 4);
  EXPECT_EQ(m.slot(1, 7), t[1] * 4 + 3);
  EXPECT_FALSE(m.allocate_slots(3, 4 * 5 + 1));  // needs 6, 4 free
  EXPECT_TRUE(m.block_table(3).empty());
  EXPECT_DOUBLE_EQ(m.usage(), 4.0 / 8);
  m.free(1);
  m.free(2);
  m.free(99);
  EXPECT_EQ(pool.num_free_blocks(), 8);
  EXPECT_EQ(m.num_requests(), 0);
}

// A sliding window gives back the blocks between the sink and the window: slots map across the
// hole, growing counts the given-back blocks as covered, caching skips them (their keys stay with
// the pool's copies), a fork keeps the hole, and a session pins only the blocks before it.
TEST(KVCacheManagerTest, EvictingAWindowLeavesAHoleTheTableMapsAcross) {
  BlockPool pool(16);
  KVCacheManager m(pool, 4, /*prefix_caching=*/true);
  std::vector<int32_t> prompt(30);
  std::iota(prompt.begin(), prompt.end(), 100);
  const KVCacheManager::Tokens tokens{prompt, {}, {}};
  ASSERT_TRUE(m.allocate_slots(1, 24));  // position blocks 0..5
  const std::vector<int32_t> before(m.block_table(1).begin(), m.block_table(1).end());
  m.cache_full_blocks(1, tokens, 24);
  EXPECT_EQ(m.evict(1, 1, 4), 3);  // blocks 1, 2, 3 go; 0 (the sink), 4, 5 stay
  EXPECT_EQ(m.evicted_blocks(1), 3);
  EXPECT_EQ(m.block_table(1).size(), 3u);
  EXPECT_EQ(m.num_table_tokens(1), 24);
  EXPECT_EQ(pool.num_used_blocks(), 3);
  EXPECT_EQ(pool.num_cached_blocks(), 6);  // the given-back blocks keep their keys
  EXPECT_EQ(m.slot(1, 2), before[0] * 4 + 2);
  EXPECT_EQ(m.slot(1, 17), before[4] * 4 + 1);
  EXPECT_EQ(m.slot(1, 23), before[5] * 4 + 3);
  EXPECT_EQ(m.evict(1, 1, 4), 0);        // nothing more below block 4
  ASSERT_TRUE(m.allocate_slots(1, 30));  // position blocks 6, 7: two fresh blocks
  EXPECT_EQ(m.block_table(1).size(), 5u);
  m.cache_full_blocks(1, tokens, 28);  // position block 6 keyed into its table entry 3
  EXPECT_EQ(pool.num_cached_blocks(), 7);
  EXPECT_EQ(m.evict(1, 1, 6), 2);  // blocks 4, 5
  EXPECT_EQ(m.slot(1, 25), m.block_table(1)[1] * 4 + 1);
  // A fork of the first 29 tokens: the sink and block 6 shared, the partial block 7 copied.
  std::optional<KVCacheManager::BlockCopy> copy;
  ASSERT_TRUE(m.fork(1, 2, 29, &copy));
  ASSERT_TRUE(copy.has_value());
  EXPECT_EQ(copy->src, m.block_table(1)[2]);
  EXPECT_EQ(m.evicted_blocks(2), 5);
  EXPECT_EQ(m.slot(2, 1), m.slot(1, 1));
  EXPECT_EQ(m.slot(2, 26), m.slot(1, 26));
  EXPECT_EQ(m.slot(2, 28), copy->dst * 4);
  // A session pins the chain up to the hole: the sink block.
  m.pin_session("s", 1, std::chrono::steady_clock::now() + std::chrono::hours(1), 16);
  EXPECT_EQ(m.num_pinned_blocks(), 1);
  m.free(1);
  m.free(2);
  EXPECT_EQ(pool.num_used_blocks(), 1);  // the pin
}

// Property: after any sequence of grow / free operations every block is free again and no
// block is ever in two tables.
TEST(KVCacheManagerTest, RandomWorkloadAccountsForEveryBlock) {
  std::mt19937 rng(5);
  BlockPool pool(37);
  KVCacheManager m(pool, 3);
  std::vector<int64_t> lengths(10, 0);
  for (int step = 0; step < 20000; ++step) {
    const auto r = static_cast<RequestId>(rng() % lengths.size());
    if (rng() % 5 == 0) {
      m.free(r);
      lengths[r] = 0;
    } else {
      const int64_t want = lengths[r] + 1 + static_cast<int64_t>(rng() % 7);
      if (m.allocate_slots(r, want)) lengths[r] = want;
    }
    std::vector<int> owner(37, 0);
    int64_t used = 0;
    for (RequestId q = 0; q < lengths.size(); ++q) {
      const auto t = m.block_table(q);
      ASSERT_EQ(static_cast<int64_t>(t.size()), m.blocks_for(lengths[q]));
      for (int32_t b : t) ASSERT_EQ(owner[static_cast<size_t>(b)]++, 0);
      used += static_cast<int64_t>(t.size());
    }
    ASSERT_EQ(used, pool.num_used_blocks());
  }
  for (RequestId q = 0; q < lengths.size(); ++q) m.free(q);
  EXPECT_EQ(pool.num_free_blocks(), 37);
}

}  // namespace
}  // namespace inferd

namespace inferd {
namespace {

TEST(PrefixCacheTest, FreedBlocksKeepTheirKeyUntilReused) {
  BlockPool pool(3);
  auto a = pool.allocate(2);
  ASSERT_TRUE(a.has_value());
  const BlockHash h0{1, 2}, h1{3, 4};
  pool.cache_block((*a)[0], h0);
  pool.cache_block((*a)[1], h1);
  pool.cache_block((*a)[1], h0);  // already keyed: ignored
  EXPECT_EQ(pool.find_cached(h0), (*a)[0]);
  pool.release(std::vector<int32_t>{(*a)[1], (*a)[0]});  // free order: 2 (never used), a1, a0
  EXPECT_EQ(pool.num_free_blocks(), 3);
  EXPECT_EQ(pool.find_cached(h1), (*a)[1]);  // still revivable
  pool.touch((*a)[1]);                       // revived: leaves the free queue
  EXPECT_EQ(pool.num_free_blocks(), 2);
  EXPECT_EQ(pool.ref_count((*a)[1]), 1);
  EXPECT_EQ(pool.num_revived(), 1);
  // Least recently freed first: block 2, then a0, whose key goes with its reuse.
  auto b = pool.allocate(2);
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(*b, (std::vector<int32_t>{2, (*a)[0]}));
  EXPECT_EQ(pool.find_cached(h0), -1);
  EXPECT_EQ(pool.find_cached(h1), (*a)[1]);
}

std::vector<int32_t> seq(int32_t from, int32_t n) {
  std::vector<int32_t> v;
  for (int32_t i = 0; i < n; ++i) v.push_back(from + i);
  return v;
}

TEST(PrefixCacheTest, ManagerTakesTheLongestMatchingChainButNeverTheLastTokensBlock) {
  BlockPool pool(32);
  KVCacheManager kv(pool, 4, /*prefix_caching=*/true);
  const std::vector<int32_t> a = seq(10, 13);  // 3 full blocks + 1 token
  ASSERT_EQ(kv.take_cached_prefix(1, {a, {}}), 0);
  ASSERT_TRUE(kv.allocate_slots(1, 13));
  kv.cache_full_blocks(1, {a, {}}, 13);
  // Same 12 first tokens: 3 blocks hit.
  std::vector<int32_t> b = seq(10, 12);
  b.push_back(99);
  b.push_back(98);
  EXPECT_EQ(kv.take_cached_prefix(2, {b, {}}), 12);
  EXPECT_EQ(kv.block_table(2)[2], kv.block_table(1)[2]);
  // Diverging in the second block: only the first block.
  std::vector<int32_t> c = a;
  c[6] = 77;
  EXPECT_EQ(kv.take_cached_prefix(3, {c, {}}), 4);
  // Exactly the cached 12 tokens: the last block is recomputed for its logits.
  EXPECT_EQ(kv.take_cached_prefix(4, {seq(10, 12), {}}), 8);
  // The chain depends on position: the same block content later in a prompt is not a hit.
  std::vector<int32_t> d = seq(14, 4);
  d.insert(d.end(), {1, 2, 3});
  EXPECT_EQ(kv.take_cached_prefix(5, {d, {}}), 0);
  EXPECT_EQ(kv.prefix_hit_tokens(), 24);
  for (RequestId id : {1, 2, 3, 4, 5}) kv.free(id);
  EXPECT_EQ(pool.num_free_blocks(), 32);
}

// A chain's root key (a LoRA adapter's fingerprint; zero for the base) keeps the same tokens of
// two adapters in blocks of their own: every block key differs, and a request of one never takes
// the other's blocks.
TEST(PrefixCacheTest, TheRootKeyKeepsAdaptersApart) {
  BlockPool pool(32);
  KVCacheManager kv(pool, 4, /*prefix_caching=*/true);
  const std::vector<int32_t> a = seq(10, 13);
  const BlockHash adapter{0x1234, 0x5678}, other{0x1234, 0x5679};
  ASSERT_EQ(kv.take_cached_prefix(1, {a, {}, adapter}), 0);
  ASSERT_TRUE(kv.allocate_slots(1, 13));
  kv.cache_full_blocks(1, {a, {}, adapter}, 13);
  EXPECT_EQ(kv.take_cached_prefix(2, {a, {}}), 0);            // the base
  EXPECT_EQ(kv.take_cached_prefix(3, {a, {}, other}), 0);     // another adapter
  EXPECT_EQ(kv.take_cached_prefix(4, {a, {}, adapter}), 12);  // the same adapter
  const auto base_keys = kv.block_keys({a, {}}, 13), adapter_keys = kv.block_keys({a, {}, adapter}, 13);
  ASSERT_EQ(base_keys.size(), 4u);  // three full blocks and the partial one
  for (size_t i = 0; i < base_keys.size(); ++i) EXPECT_FALSE(base_keys[i] == adapter_keys[i]) << i;
  EXPECT_TRUE(adapter_keys == kv.block_keys({a, {}, adapter}, 13));
  for (RequestId id : {1, 4}) kv.free(id);
}

TEST(PrefixCacheTest, OffMeansNoHits) {
  BlockPool pool(8);
  KVCacheManager kv(pool, 4, /*prefix_caching=*/false);
  const std::vector<int32_t> a = seq(1, 9);
  ASSERT_TRUE(kv.allocate_slots(1, 9));
  kv.cache_full_blocks(1, {a, {}}, 9);
  EXPECT_EQ(kv.take_cached_prefix(2, {a, {}}), 0);
  EXPECT_EQ(pool.num_cached_blocks(), 0);
}

TEST(SessionPoolTest, PinsSurviveLruPressureUntilTheyExpire) {
  using Clock = std::chrono::steady_clock;
  BlockPool pool(8);
  KVCacheManager kv(pool, 4, /*prefix_caching=*/true);
  const std::vector<int32_t> turn = seq(1, 9);  // 2 full blocks + 1 token
  ASSERT_TRUE(kv.allocate_slots(1, 9));
  kv.cache_full_blocks(1, {turn, {}}, 9);
  const auto t0 = Clock::now();
  kv.pin_session("s", 1, t0 + std::chrono::seconds(10), /*max_pinned=*/4);
  kv.free(1);
  EXPECT_EQ(kv.num_sessions(), 1);
  EXPECT_EQ(kv.num_pinned_blocks(), 2);
  EXPECT_EQ(pool.num_free_blocks(), 6);  // the pinned two are not in the free queue
  // Pressure: other requests take every free block, then free them.
  ASSERT_TRUE(kv.allocate_slots(2, 24));
  EXPECT_FALSE(kv.allocate_slots(3, 4));
  kv.free(2);
  std::vector<int32_t> next = turn;
  next.push_back(50);
  EXPECT_EQ(kv.take_cached_prefix(4, {next, {}}), 8);  // the session's blocks are still there
  kv.free(4);
  kv.expire_sessions(t0 + std::chrono::seconds(5));
  EXPECT_EQ(kv.num_sessions(), 1);
  kv.expire_sessions(t0 + std::chrono::seconds(11));
  EXPECT_EQ(kv.num_sessions(), 0);
  EXPECT_EQ(pool.num_free_blocks(), 8);
  ASSERT_TRUE(kv.allocate_slots(5, 32));  // now LRU reuse takes them
  kv.free(5);
  EXPECT_EQ(kv.take_cached_prefix(6, {next, {}}), 0);
}

TEST(SessionPoolTest, ShareLimitDropsTheOldestSessionAndRepinReplaces) {
  using Clock = std::chrono::steady_clock;
  BlockPool pool(16);
  KVCacheManager kv(pool, 4, /*prefix_caching=*/true);
  const auto later = Clock::now() + std::chrono::hours(1);
  auto turn = [&](RequestId id, int32_t from, const char* session, int64_t max_pinned) {
    const std::vector<int32_t> t = seq(from, 8);
    ASSERT_TRUE(kv.allocate_slots(id, 8));
    kv.cache_full_blocks(id, {t, {}}, 8);
    kv.pin_session(session, id, later, max_pinned);
    kv.free(id);
  };
  turn(1, 100, "a", 4);
  turn(2, 200, "b", 4);
  EXPECT_EQ(kv.num_pinned_blocks(), 4);
  turn(3, 300, "c", 4);  // over the share: "a", the oldest, goes back to LRU
  EXPECT_EQ(kv.num_sessions(), 2);
  EXPECT_EQ(kv.num_pinned_blocks(), 4);
  turn(4, 400, "b", 4);  // b's new turn replaces its old pin
  EXPECT_EQ(kv.num_sessions(), 2);
  EXPECT_EQ(kv.num_pinned_blocks(), 4);
  turn(5, 500, "d", 1);  // more than the whole share: not pinned, nothing else dropped
  EXPECT_EQ(kv.num_sessions(), 2);
  while (kv.drop_oldest_session()) {
  }
  EXPECT_EQ(pool.num_free_blocks(), 16);
}

}  // namespace
}  // namespace inferd
