// The offload tiers without a model: the stored record format and its checks, KvCache block
// export/import, the pool's offload bookkeeping, the disk tier, and a real redis-server.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include "kv/block_pool.h"
#include "kv/disk_kv_tier.h"
#include "kv/kv_cache.h"
#include "kv/kv_offloader.h"
#include "kv/kv_record.h"
#include "test_support.h"

namespace inferd {
namespace {

namespace fs = std::filesystem;

KvStoreIdentity identity(uint64_t model) {
  KvStoreIdentity id;
  id.model = BlockHash{model, ~model};
  id.num_layers = 2;
  id.block_size = 4;
  id.kv_dim = 6;
  id.dtype = static_cast<uint32_t>(KvDType::kF16);
  return id;
}

std::vector<std::byte> sealed(size_t payload, const KvStoreIdentity& id, const BlockHash& key,
                              std::mt19937& rng) {
  std::vector<std::byte> rec(kv_record_bytes(payload));
  for (size_t i = kKvRecordHeaderBytes; i < rec.size(); ++i) rec[i] = static_cast<std::byte>(rng());
  seal_kv_record(rec, id, key);
  return rec;
}

TEST(KvRecordTest, SealedRecordsPassAndEveryDamageIsCaught) {
  std::mt19937 rng(7);
  const KvStoreIdentity id = identity(1);
  const BlockHash key{11, 12};
  for (size_t payload : {size_t{1}, size_t{7}, size_t{1000}, size_t{4099}}) {
    const auto rec = sealed(payload, id, key, rng);
    EXPECT_EQ(check_kv_record(rec, id, key, payload), KvRecordCheck::kOk);

    auto cut = rec;
    cut.pop_back();
    EXPECT_EQ(check_kv_record(cut, id, key, payload), KvRecordCheck::kTruncated);
    EXPECT_EQ(check_kv_record(std::span(rec).first(40), id, key, payload), KvRecordCheck::kTruncated);

    auto flipped = rec;
    flipped[kKvRecordHeaderBytes + rng() % payload] ^= std::byte{0x10};
    EXPECT_EQ(check_kv_record(flipped, id, key, payload), KvRecordCheck::kBadChecksum);

    auto magic = rec;
    magic[1] = std::byte{'x'};
    EXPECT_EQ(check_kv_record(magic, id, key, payload), KvRecordCheck::kBadMagic);

    EXPECT_EQ(check_kv_record(rec, identity(2), key, payload), KvRecordCheck::kForeign);
    KvStoreIdentity other_layout = id;
    other_layout.dtype = static_cast<uint32_t>(KvDType::kBF16);
    EXPECT_EQ(check_kv_record(rec, other_layout, key, payload), KvRecordCheck::kForeign);
    EXPECT_EQ(check_kv_record(rec, id, BlockHash{11, 13}, payload), KvRecordCheck::kWrongKey);
    EXPECT_EQ(check_kv_record(rec, id, key, payload + 1), KvRecordCheck::kForeign);
  }
  EXPECT_NE(identity(1).store_name(), identity(2).store_name());
  EXPECT_EQ(identity(1).store_name().size(), 32u);
}

// Writes random K/V into every slot of `block`.
void fill_block(KvCache& cache, int64_t block, std::mt19937& rng) {
  for (int64_t layer = 0; layer < cache.num_layers(); ++layer) {
    for (int64_t s = 0; s < cache.block_size(); ++s) {
      const auto k = test::random_floats(static_cast<size_t>(cache.kv_dim()), rng);
      const auto v = test::random_floats(static_cast<size_t>(cache.kv_dim()), rng);
      cache.write(layer, block * cache.block_size() + s, k.data(), v.data());
    }
  }
}

std::vector<std::byte> exported(const KvCache& cache, int64_t block) {
  std::vector<std::byte> out(cache.block_bytes());
  cache.export_block(block, out.data());
  return out;
}

TEST(KvCacheTest, ExportImportRoundTripsEveryLayerAndDtype) {
  std::mt19937 rng(3);
  for (KvDType dtype : {KvDType::kF16, KvDType::kBF16, KvDType::kF32, KvDType::kInt8, KvDType::kFp8}) {
    KvCache cache(3, 5, 4, 6, dtype, /*head_dim=*/3);
    // 8-bit: two heads' f32 scales per slot ride along with the codes.
    const size_t scales = kv_dtype_is_8bit(dtype) ? 2 * 4 : 0;
    EXPECT_EQ(cache.block_bytes(), 2u * 3 * 4 * (6 * kv_dtype_bytes(dtype) + scales));
    EXPECT_EQ(static_cast<int64_t>(cache.block_bytes()), KvCache::bytes_per_token(3, 6, 3, dtype) * 4);
    fill_block(cache, 2, rng);
    fill_block(cache, 3, rng);
    const auto a = exported(cache, 2);
    EXPECT_NE(a, exported(cache, 3));
    cache.import_block(4, a.data());
    EXPECT_EQ(exported(cache, 4), a);
    EXPECT_NE(exported(cache, 3), a);  // neighbours untouched
    // What attention reads comes back too (codes and scales), and copy_block moves the same.
    std::vector<float> k2(6), v2(6), k4(6), v4(6);
    cache.copy_block(2, 1);
    for (int64_t layer = 0; layer < 3; ++layer) {
      for (int64_t s = 0; s < 4; ++s) {
        cache.read(layer, 2 * 4 + s, k2.data(), v2.data());
        cache.read(layer, 4 * 4 + s, k4.data(), v4.data());
        EXPECT_EQ(k2, k4);
        EXPECT_EQ(v2, v4);
        cache.read(layer, 1 * 4 + s, k4.data(), v4.data());
        EXPECT_EQ(k2, k4);
        EXPECT_EQ(v2, v4);
      }
    }
  }
}

TEST(BlockPoolTest, OffloadBookkeepingFollowsTheFreeQueue) {
  BlockPool pool(6);
  auto a = pool.allocate(6);
  ASSERT_TRUE(a.has_value());
  for (int32_t b = 0; b < 4; ++b) pool.cache_block(b, BlockHash{static_cast<uint64_t>(b + 1), 0});
  std::vector<int32_t> evicted;
  pool.set_evict_hook([&](int32_t b, const BlockHash&) { evicted.push_back(b); });
  pool.release(std::vector<int32_t>{2, 0, 3, 1, 4, 5});
  EXPECT_EQ(pool.num_free_unoffloaded(), 4);
  std::vector<int32_t> cold;
  pool.coldest_unoffloaded(3, &cold);
  EXPECT_EQ(cold, (std::vector<int32_t>{2, 0, 3}));  // least recently freed first
  pool.mark_offloaded(0);
  EXPECT_TRUE(pool.offloaded(0));
  EXPECT_EQ(pool.num_free_unoffloaded(), 3);
  pool.coldest_unoffloaded(8, &cold);
  EXPECT_EQ(cold, (std::vector<int32_t>{2, 3, 1}));
  // Reuse: the two empty blocks first (no hook), then 2 (hooked: not offloaded), then 0 (offloaded).
  auto b = pool.allocate(4);
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(evicted, (std::vector<int32_t>{2}));
  EXPECT_FALSE(pool.offloaded(0));  // new contents: no tier holds them
  EXPECT_EQ(pool.num_free_unoffloaded(), 2);
  EXPECT_DOUBLE_EQ(pool.content_usage(), 1.0);
}

TEST(DiskKvTierTest, ChainsStopAtTheFirstMissAndTheCapEvictsLeastRecentlyUsed) {
  std::mt19937 rng(5);
  const std::string dir = test::temp_dir();
  const KvStoreIdentity id = identity(9);
  const size_t payload = 100, rec = kv_record_bytes(payload);
  auto tier = DiskKvTier::open(dir, id.store_name(), static_cast<int64_t>(3 * rec + rec / 2));
  ASSERT_TRUE(tier.has_value()) << tier.status().message();
  std::vector<BlockHash> keys;
  std::vector<std::vector<std::byte>> records;
  for (uint64_t i = 0; i < 4; ++i) {
    keys.push_back(BlockHash{i + 100, i});
    records.push_back(sealed(payload, id, keys.back(), rng));
  }
  for (int i = 0; i < 3; ++i)
    ASSERT_TRUE((*tier)->put(keys[static_cast<size_t>(i)], records[static_cast<size_t>(i)]));
  std::vector<std::vector<std::byte>> got;
  auto collect = [&](std::span<const std::byte> r) {
    got.emplace_back(r.begin(), r.end());
    return true;
  };
  (*tier)->get(std::span(keys).first(3), collect);
  EXPECT_EQ(got, std::vector(records.begin(), records.begin() + 3));
  got.clear();
  const std::vector<BlockHash> gap = {keys[0], BlockHash{1, 1}, keys[2]};
  (*tier)->get(gap, collect);
  EXPECT_EQ(got.size(), 1u);
  // keys[0] was just read: keys[1] is now the least recently used and goes when keys[3] comes.
  ASSERT_TRUE((*tier)->put(keys[3], records[3]));
  EXPECT_EQ((*tier)->num_records(), 3);
  EXPECT_LE((*tier)->num_bytes(), static_cast<int64_t>(3 * rec + rec / 2));
  EXPECT_FALSE(fs::exists((*tier)->path() + "/" + hex_of(keys[1]) + ".kvb"));
  got.clear();
  (*tier)->get(std::span(keys).first(1), collect);
  EXPECT_EQ(got.size(), 1u);

  // A new process finds what the last one left, and drops a half-written temporary file.
  std::ofstream((*tier)->path() + "/" + hex_of(BlockHash{5, 5}) + ".kvb.tmp") << "partial";
  tier->reset();
  auto again = DiskKvTier::open(dir, id.store_name(), static_cast<int64_t>(3 * rec + rec / 2));
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ((*again)->num_records(), 3);
  EXPECT_FALSE(fs::exists((*again)->path() + "/" + hex_of(BlockHash{5, 5}) + ".kvb.tmp"));
  fs::remove_all(dir);
}

TEST(DiskKvTierTest, AFolderThatCannotBeWrittenIsAClearError) {
  const std::string dir = test::temp_dir();
  std::ofstream(dir + "/file") << "x";
  auto tier = DiskKvTier::open(dir + "/file", "store", 1000);
  ASSERT_FALSE(tier.has_value());
  EXPECT_NE(tier.status().message().find("--kv-offload-dir"), std::string::npos) << tier.status().message();
  fs::remove_all(dir);
}

// A KvCache with `blocks` blocks of random contents, its pool, and every block cached under a
// key chain and freed: what a finished request leaves behind.
struct CachedPool {
  KvCache cache;
  BlockPool pool;
  std::vector<BlockHash> keys;
  CachedPool(int32_t blocks, int32_t filled, std::mt19937& rng)
      : cache(2, blocks, 4, 6, KvDType::kF16), pool(blocks) {
    auto all = pool.allocate(filled);
    INFERD_CHECK(all.has_value());
    for (int32_t b = 0; b < filled; ++b) {
      fill_block(cache, b, rng);
      keys.push_back(BlockHash{rng(), rng()});
      pool.cache_block(b, keys.back());
    }
    pool.release(*all);
  }
};

KvOffloadOptions disk_options(const std::string& dir, double watermark) {
  KvOffloadOptions o;
  o.disk_dir = dir;
  o.disk_gb = 1;
  o.watermark = watermark;
  return o;
}

TEST(KvOffloaderTest, ColdBlocksGoOutAboveTheWatermarkAndComeBackIntoAnotherPool) {
  std::mt19937 rng(11);
  const std::string dir = test::temp_dir();
  CachedPool a(8, 6, rng);  // content usage 6/8
  const BlockHash model{42, 43};
  {
    auto high = KvOffloader::create(disk_options(dir, 0.9), a.cache, model);
    ASSERT_TRUE(high.has_value()) << high.status().message();
    EXPECT_EQ((*high)->offload_cold(a.pool, 100), 0);  // 0.75 < 0.9: nothing to do
  }
  auto o = KvOffloader::create(disk_options(dir, 0.5), a.cache, model);
  ASSERT_TRUE(o.has_value());
  (*o)->attach(a.pool);
  EXPECT_TRUE((*o)->has_cold_work(a.pool));
  EXPECT_EQ((*o)->offload_cold(a.pool, 4), 4);
  EXPECT_EQ((*o)->offload_cold(a.pool, 100), 2);
  EXPECT_FALSE((*o)->has_cold_work(a.pool));
  (*o)->flush();
  const KvTierStats& st = (*o)->tiers()[0]->stats();
  EXPECT_EQ(st.writes.load(), 6);
  EXPECT_EQ(st.write_bytes.load(), 6 * static_cast<int64_t>(kv_record_bytes(a.cache.block_bytes())));

  // Another process (empty pool) with the same model and layout loads the chain.
  CachedPool b(8, 0, rng);
  auto ob = KvOffloader::create(disk_options(dir, 0.8), b.cache, model);
  ASSERT_TRUE(ob.has_value());
  std::vector<int32_t> blocks;
  ASSERT_EQ((*ob)->load(a.keys, b.pool, &blocks), 6);
  for (size_t i = 0; i < blocks.size(); ++i) {
    EXPECT_EQ(exported(b.cache, blocks[i]), exported(a.cache, static_cast<int64_t>(i)));
    EXPECT_EQ(b.pool.find_cached(a.keys[i]), blocks[i]);
    EXPECT_TRUE(b.pool.offloaded(blocks[i]));  // never written back
  }
  EXPECT_EQ((*ob)->tiers()[0]->stats().reads.load(), 6);

  // A truncated file is a miss (and is removed); the chain stops there.
  const std::string f3 = dir + "/" + (*ob)->identity().store_name() + "/" + hex_of(a.keys[3]) + ".kvb";
  fs::resize_file(f3, fs::file_size(f3) - 10);
  CachedPool c(8, 0, rng);
  auto oc = KvOffloader::create(disk_options(dir, 0.8), c.cache, model);
  ASSERT_TRUE(oc.has_value());
  blocks.clear();
  EXPECT_EQ((*oc)->load(a.keys, c.pool, &blocks), 3);
  EXPECT_EQ((*oc)->tiers()[0]->stats().corrupt.load(), 1);
  EXPECT_FALSE(fs::exists(f3));

  // Another model's record under this store's name is foreign: a miss, never loaded.
  CachedPool d(8, 0, rng);
  auto od = KvOffloader::create(disk_options(dir, 0.8), d.cache, BlockHash{1, 2});
  ASSERT_TRUE(od.has_value());
  const std::string theirs = dir + "/" + (*od)->identity().store_name() + "/" + hex_of(a.keys[0]) + ".kvb";
  fs::copy_file(dir + "/" + (*ob)->identity().store_name() + "/" + hex_of(a.keys[0]) + ".kvb", theirs);
  od->reset();
  od = KvOffloader::create(disk_options(dir, 0.8), d.cache, BlockHash{1, 2});
  ASSERT_TRUE(od.has_value());
  blocks.clear();
  EXPECT_EQ((*od)->load(a.keys, d.pool, &blocks), 0);
  EXPECT_EQ((*od)->tiers()[0]->stats().corrupt.load(), 1);
  EXPECT_EQ(d.pool.num_free_blocks(), 8);
  fs::remove_all(dir);
}

TEST(KvOffloaderTest, EvictionStagesBlocksNoTierHoldsAndFullStagingSkipsWithoutBlocking) {
  std::mt19937 rng(13);
  const std::string dir = test::temp_dir();
  CachedPool a(6, 6, rng);
  KvOffloadOptions opts = disk_options(dir, 1.0);
  opts.max_staging_blocks = 2;
  auto o = KvOffloader::create(opts, a.cache, BlockHash{7, 7});
  ASSERT_TRUE(o.has_value());
  (*o)->attach(a.pool);
  // Reusing all six cached blocks stages each first; with two slots some may be skipped, never waited for.
  auto taken = a.pool.allocate(6);
  ASSERT_TRUE(taken.has_value());
  (*o)->flush();
  const int64_t writes = (*o)->tiers()[0]->stats().writes.load();
  EXPECT_EQ(writes + (*o)->num_dropped_writes(), 6);
  EXPECT_GE(writes, 2);
  fs::remove_all(dir);
}

// A parallel job's ranks (docs/parallelism.md): rank 0's offloader reports each block it stages
// (the hook the step mirror sends on), another rank stages its slice by key with no pool of its
// own and follows rank 0's loads with wait_load; each rank's store is its own.
TEST(KvOffloaderTest, AnotherRankStagesByKeyAndWaitsForItsLoadsInAStoreOfItsOwn) {
  std::mt19937 rng(17);
  const std::string dir = test::temp_dir();
  const BlockHash model{5, 6};
  EXPECT_EQ(kv_shard_fingerprint(model, KvShard{}), model);  // one process: its stores stay valid
  const BlockHash r0 = kv_shard_fingerprint(model, KvShard{0, 2, 1});
  const BlockHash r1 = kv_shard_fingerprint(model, KvShard{1, 2, 1});
  EXPECT_NE(r0, model);
  EXPECT_NE(r0, r1);
  EXPECT_NE(kv_shard_fingerprint(model, KvShard{1, 1, 2}), r1);  // another split, another store
  CachedPool rank0(6, 4, rng), rank1(6, 4, rng);  // the same keys' blocks, other contents (slices)
  auto o0 = KvOffloader::create(disk_options(dir, 0.0), rank0.cache, r0);
  auto o1 = KvOffloader::create(disk_options(dir, 0.0), rank1.cache, r1);
  ASSERT_TRUE(o0.has_value() && o1.has_value());
  EXPECT_NE((*o0)->identity().store_name(), (*o1)->identity().store_name());
  std::vector<std::pair<int32_t, BlockHash>> mirrored;
  (*o0)->set_stage_hook([&](int32_t block, const BlockHash& key) { mirrored.emplace_back(block, key); });
  (*o0)->attach(rank0.pool);
  ASSERT_EQ((*o0)->offload_cold(rank0.pool, 100), 4);
  ASSERT_EQ(mirrored.size(), 4u);
  for (auto& [block, key] : mirrored) {
    EXPECT_EQ(key, rank0.keys[static_cast<size_t>(block)]);
    EXPECT_TRUE((*o1)->stage_block(block, rank0.keys[static_cast<size_t>(block)]));
  }
  (*o0)->flush();
  (*o1)->flush();

  // Both ranks load the chain into blocks 2.. of fresh caches; rank 1 waits for its own load.
  CachedPool back0(6, 0, rng), back1(6, 0, rng);
  auto l0 = KvOffloader::create(disk_options(dir, 0.0), back0.cache, r0);
  auto l1 = KvOffloader::create(disk_options(dir, 0.0), back1.cache, r1);
  ASSERT_TRUE(l0.has_value() && l1.has_value());
  const std::vector<int32_t> into = {2, 3, 4, 5};
  const uint64_t t1 = (*l1)->start_load(rank0.keys, into);
  const KvBlockSource::Finished f1 = (*l1)->wait_load(t1);
  EXPECT_EQ(f1.ticket, t1);
  EXPECT_EQ(f1.loaded, 4);
  EXPECT_TRUE(f1.error.empty());
  for (size_t i = 0; i < into.size(); ++i)
    EXPECT_EQ(exported(back1.cache, into[i]),
              exported(rank1.cache, static_cast<int64_t>(i)));  // its own slice
  std::vector<KvBlockSource::Finished> polled;
  (*l1)->poll(&polled);
  EXPECT_TRUE(polled.empty());                      // wait_load took it
  EXPECT_EQ((*l1)->wait_load(t1 + 100).loaded, 0);  // no such load: nothing, not a hang
  // A key rank 1 never stored: its load stops there, whatever rank 0 holds.
  std::vector<BlockHash> keys = rank0.keys;
  keys[1] = BlockHash{99, 99};
  EXPECT_EQ((*l1)->wait_load((*l1)->start_load(keys, into)).loaded, 1);
  std::vector<int32_t> blocks;
  EXPECT_EQ((*l0)->load(rank0.keys, back0.pool, &blocks), 4);
  fs::remove_all(dir);
}

class RedisTierTest : public ::testing::Test {
 protected:
  void SetUp() override {
    INFERD_REQUIRE_OR_SKIP(test::RedisServer::available(),
                           "redis-server is not installed (scripts/setup installs it)");
    ASSERT_TRUE(redis_.start());
  }
  KvOffloadOptions redis_options() const {
    KvOffloadOptions o;
    o.redis_url = redis_.url();
    o.watermark = 0.0;
    return o;
  }
  test::RedisServer redis_;
};

TEST_F(RedisTierTest, TwoProcessesShareBlocksAndACorruptValueIsRecomputed) {
  std::mt19937 rng(17);
  CachedPool a(12, 12, rng);  // more blocks than one pipeline round
  const BlockHash model{5, 6};
  auto oa = KvOffloader::create(redis_options(), a.cache, model);
  ASSERT_TRUE(oa.has_value()) << oa.status().message();
  EXPECT_TRUE((*oa)->tiers()[0]->up());
  while ((*oa)->offload_cold(a.pool, 100) > 0) (*oa)->flush();
  (*oa)->flush();
  EXPECT_EQ((*oa)->tiers()[0]->stats().writes.load(), 12);

  CachedPool b(12, 0, rng);
  auto ob = KvOffloader::create(redis_options(), b.cache, model);
  ASSERT_TRUE(ob.has_value());
  std::vector<int32_t> blocks;
  ASSERT_EQ((*ob)->load(a.keys, b.pool, &blocks), 12);
  for (size_t i = 0; i < blocks.size(); ++i)
    EXPECT_EQ(exported(b.cache, blocks[i]), exported(a.cache, static_cast<int64_t>(i)));

  // Damage block 5's value in Redis: the chain stops there and the value is deleted.
  const std::string key = "inferd:kv:" + (*ob)->identity().store_name() + ":" + hex_of(a.keys[5]);
  const std::string len = redis_.cli("SETRANGE " + key + " 200 XYZ");  // the value's length
  EXPECT_EQ(std::stoul(len), kv_record_bytes(a.cache.block_bytes())) << len;
  CachedPool c(12, 0, rng);
  auto oc = KvOffloader::create(redis_options(), c.cache, model);
  ASSERT_TRUE(oc.has_value());
  blocks.clear();
  EXPECT_EQ((*oc)->load(a.keys, c.pool, &blocks), 5);
  EXPECT_EQ((*oc)->tiers()[0]->stats().corrupt.load(), 1);
  EXPECT_EQ(redis_.cli("EXISTS " + key).find("0"), 0u);
}

TEST_F(RedisTierTest, ARedisThatDiesDegradesToMissesAndComesBack) {
  std::mt19937 rng(19);
  CachedPool a(4, 4, rng);
  auto o = KvOffloader::create(redis_options(), a.cache, BlockHash{8, 8});
  ASSERT_TRUE(o.has_value());
  KvTier& tier = *(*o)->tiers()[0];
  redis_.kill();
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<int32_t> blocks;
  EXPECT_EQ((*o)->load(a.keys, a.pool, &blocks), 0);
  while ((*o)->offload_cold(a.pool, 100) > 0) (*o)->flush();
  (*o)->flush();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(3));  // misses, not hangs
  EXPECT_FALSE(tier.up());
  EXPECT_EQ(tier.stats().writes.load(), 0);
  EXPECT_GE(tier.stats().failures.load(), 1);

  ASSERT_TRUE(redis_.start());  // same port: the writer thread's retries find it
  for (int i = 0; i < 100 && !tier.up(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_TRUE(tier.up());
}

TEST_F(RedisTierTest, ARedisDownAtStartIsAWarningNotAnError) {
  redis_.kill();
  std::mt19937 rng(23);
  CachedPool a(2, 2, rng);
  auto o = KvOffloader::create(redis_options(), a.cache, BlockHash{9, 9});
  ASSERT_TRUE(o.has_value());
  EXPECT_FALSE((*o)->tiers()[0]->up());
}

TEST(KvOffloadOptionsTest, BadValuesNameTheFlag) {
  KvOffloadOptions o;
  o.redis_url = "http://x";
  EXPECT_NE(o.validate().message().find("--kv-offload-redis"), std::string::npos);
  o.redis_url = "redis://h:99999";
  EXPECT_FALSE(o.validate().is_ok());
  o.redis_url = "redis://:secret@10.0.0.1:7000/3";
  EXPECT_TRUE(o.validate().is_ok());
  o.watermark = 1.5;
  EXPECT_NE(o.validate().message().find("--kv-offload-watermark"), std::string::npos);
}

}  // namespace
}  // namespace inferd
