// KV offload end to end on real (tiny) weights: a prefix whose blocks the pool reused comes back
// from the disk or Redis tier, in another engine too (another process), and the tokens are the
// ones a recomputation gives; a Redis that dies mid-run or holds a corrupt value costs only
// recomputation.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <sstream>

#include "engine/engine.h"
#include "model/model_loader.h"
#include "test_support.h"

namespace inferd {
namespace {

EngineOptions small_pool() {
  EngineOptions o;
  o.num_kv_blocks = 24;  // 96 slots of 4
  o.block_size = 4;
  o.scheduler.max_num_batched_tokens = 64;
  o.scheduler.max_prefill_tokens = 64;
  o.scheduler.max_model_len = 256;
  return o;
}

RequestSpec prompt(int64_t len, int32_t first, int64_t max_tokens) {
  RequestSpec s;
  s.prompt.push_back(first);
  for (int64_t k = 1; k < len; ++k) s.prompt.push_back(static_cast<int32_t>((k * 37 + 11) % 256));
  s.limits.max_tokens = max_tokens;
  return s;
}

std::vector<int32_t> run_one(Engine& engine, const RequestSpec& spec) {
  std::vector<int32_t> out;
  engine.add(spec);
  while (engine.has_work()) {
    for (const StepOutput& s : engine.step()) {
      EXPECT_TRUE(s.error.empty()) << s.error;
      out.insert(out.end(), s.new_tokens.begin(), s.new_tokens.end());
    }
  }
  return out;
}

// Requests unrelated to `prompt` that cycle through the whole pool.
void flood(Engine& engine) {
  for (int i = 0; i < 4; ++i) run_one(engine, prompt(60, 100 + i, 8));
}

int64_t tier_reads(const Engine& e) {
  return e.offloader() == nullptr ? 0 : e.offloader()->tiers()[0]->stats().reads.load();
}

class EngineOffloadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto w = load_model(test::fixture_path("tiny/qwen2"));
    ASSERT_TRUE(w.has_value()) << w.status().message();
    weights_ = std::move(*w);
    model_ = std::make_unique<Transformer>(*weights_, threads_);
    EngineOptions off = small_pool();
    off.prefix_caching = false;
    Engine plain(*model_, off);
    expected_ = run_one(plain, system_prompt_);
  }
  // 41 tokens: 10 full blocks of 4 can come from a tier.
  RequestSpec system_prompt_ = prompt(41, 7, 6);
  std::unique_ptr<ModelWeights> weights_;
  ThreadPool threads_{2};
  std::unique_ptr<Transformer> model_;
  std::vector<int32_t> expected_;
};

TEST_F(EngineOffloadTest, DiskTierServesEvictedPrefixesAndSurvivesARestart) {
  const std::string dir = test::temp_dir();
  EngineOptions o = small_pool();
  o.offload.disk_dir = dir;
  o.offload.watermark = 0.5;
  {
    Engine engine(*model_, o);
    ASSERT_NE(engine.offloader(), nullptr);
    EXPECT_EQ(run_one(engine, system_prompt_), expected_);
    flood(engine);  // reuses every block the prompt had
    engine.flush_offload();
    const int64_t hits = engine.kv_cache_manager().prefix_hit_tokens();
    EXPECT_EQ(run_one(engine, system_prompt_), expected_);
    EXPECT_EQ(engine.kv_cache_manager().prefix_hit_tokens() - hits, 40);
    EXPECT_EQ(tier_reads(engine), 10);
    EXPECT_GT(engine.offloader()->tiers()[0]->stats().writes.load(), 10);
  }
  Engine restarted(*model_, o);  // a new process on the same folder
  EXPECT_EQ(run_one(restarted, system_prompt_), expected_);
  EXPECT_EQ(tier_reads(restarted), 10);
  std::filesystem::remove_all(dir);
}

TEST_F(EngineOffloadTest, WithoutTiersAFloodMeansRecomputation) {
  Engine engine(*model_, small_pool());
  EXPECT_EQ(engine.offloader(), nullptr);
  EXPECT_EQ(run_one(engine, system_prompt_), expected_);
  flood(engine);
  const int64_t hits = engine.kv_cache_manager().prefix_hit_tokens();
  EXPECT_EQ(run_one(engine, system_prompt_), expected_);
  EXPECT_EQ(engine.kv_cache_manager().prefix_hit_tokens() - hits, 0);
}

class EngineRedisOffloadTest : public EngineOffloadTest {
 protected:
  void SetUp() override {
    INFERD_REQUIRE_OR_SKIP(test::RedisServer::available(),
                           "redis-server is not installed (scripts/setup installs it)");
    ASSERT_TRUE(redis_.start());
    EngineOffloadTest::SetUp();
  }
  EngineOptions with_redis() const {
    EngineOptions o = small_pool();
    o.offload.redis_url = redis_.url();
    o.offload.watermark = 0.0;  // every cached block goes out once freed: shared at once
    return o;
  }
  test::RedisServer redis_;
};

TEST_F(EngineRedisOffloadTest, TwoEnginesShareAPrefixAndACorruptValueIsRecomputed) {
  {
    Engine a(*model_, with_redis());
    EXPECT_EQ(run_one(a, system_prompt_), expected_);
    while (a.has_offload_work()) a.offload_idle();
    a.flush_offload();
  }
  Engine b(*model_, with_redis());  // another process: nothing in its pool
  EXPECT_EQ(run_one(b, system_prompt_), expected_);
  EXPECT_EQ(tier_reads(b), 10);
  EXPECT_EQ(b.kv_cache_manager().prefix_hit_tokens(), 40);

  // Damage every stored value: the next engine detects it, recomputes, and answers the same.
  std::istringstream keys(redis_.cli("--scan --pattern 'inferd:kv:*'"));
  int damaged = 0;
  for (std::string key; std::getline(keys, key);) {
    if (key.empty()) continue;
    redis_.cli("SETRANGE " + key + " 100 XYZ");
    ++damaged;
  }
  EXPECT_GE(damaged, 10);
  Engine c(*model_, with_redis());
  EXPECT_EQ(run_one(c, system_prompt_), expected_);
  EXPECT_EQ(tier_reads(c), 0);
  EXPECT_EQ(c.offloader()->tiers()[0]->stats().corrupt.load(), 1);
}

TEST_F(EngineRedisOffloadTest, RedisKilledMidRunFailsNoRequest) {
  Engine engine(*model_, with_redis());
  std::vector<std::vector<int32_t>> outs(6);
  std::vector<RequestId> ids;
  for (int i = 0; i < 6; ++i) ids.push_back(engine.add(i % 2 == 0 ? system_prompt_ : prompt(50, 60 + i, 8)));
  int steps = 0;
  while (engine.has_work()) {
    if (++steps == 5) redis_.kill();
    for (const StepOutput& s : engine.step()) {
      EXPECT_TRUE(s.error.empty()) << s.error;
      const auto k = static_cast<size_t>(std::find(ids.begin(), ids.end(), s.id) - ids.begin());
      outs[k].insert(outs[k].end(), s.new_tokens.begin(), s.new_tokens.end());
    }
  }
  EXPECT_GT(steps, 5);
  for (int i = 0; i < 6; i += 2) EXPECT_EQ(outs[static_cast<size_t>(i)], expected_);
  flood(engine);  // more lookups and writes against the dead Redis: still no errors
  EXPECT_EQ(run_one(engine, system_prompt_), expected_);
  EXPECT_FALSE(engine.offloader()->tiers()[0]->up());
  EXPECT_GE(engine.offloader()->tiers()[0]->stats().failures.load(), 1);
}

}  // namespace
}  // namespace inferd
