// Scheduler and KV accounting with fake requests and no model.
#include "engine/scheduler.h"

#include <gtest/gtest.h>

#include <chrono>
#include <random>
#include <thread>

namespace inferd {
namespace {

struct Fixture {
  BlockPool pool;
  KVCacheManager kv;
  Scheduler sched;
  uint64_t next = 1;
  Fixture(int32_t blocks, int32_t block_size, SchedulerOptions o, bool prefix_caching = false)
      : pool(blocks), kv(pool, block_size, prefix_caching), sched(o, kv) {}

  // A prompt of token 7 repeated, or with `first_token`, of first_token, first_token + 1, ...
  RequestId add(int64_t prompt_len, int64_t max_tokens, int32_t priority = 0, int32_t first_token = -1) {
    auto r = std::make_unique<Request>();
    r->id = next;
    r->arrival_order = next++;
    for (int64_t i = 0; i < prompt_len; ++i)
      r->prompt.push_back(first_token < 0 ? 7 : first_token + static_cast<int32_t>(i));
    r->limits.max_tokens = max_tokens;
    r->priority = priority;
    const RequestId id = r->id;
    sched.add(std::move(r));
    return id;
  }
  // Runs one step, "sampling" token 1 for every item.
  ScheduledBatch step() {
    ScheduledBatch b = sched.schedule();
    std::vector<int32_t> sampled(b.items.size(), 1);
    sched.update(b, sampled);
    return b;
  }
};

int64_t tokens_of(const ScheduledBatch& b, RequestId id) {
  for (const auto& it : b.items) {
    if (it.request->id == id) return it.num_new_tokens;
  }
  return 0;
}

SchedulerOptions opts(int64_t budget, SchedulePolicy policy = SchedulePolicy::kDecodeFirst) {
  SchedulerOptions o;
  o.max_num_batched_tokens = budget;
  o.max_prefill_tokens = budget;
  o.policy = policy;
  o.max_model_len = 1024;
  return o;
}

TEST(SchedulerTest, ChunkedPrefillKeepsDecodesRunning) {
  Fixture f(64, 4, opts(8));
  const RequestId a = f.add(3, 10);
  f.step();  // a's prompt (3) in one step, first token sampled
  const RequestId b = f.add(20, 2);
  auto s1 = f.step();
  EXPECT_EQ(tokens_of(s1, a), 1);  // decode first
  EXPECT_EQ(tokens_of(s1, b), 7);  // the rest of the budget
  auto s2 = f.step();
  EXPECT_EQ(tokens_of(s2, a), 1);
  EXPECT_EQ(tokens_of(s2, b), 7);
  auto s3 = f.step();
  EXPECT_EQ(tokens_of(s3, b), 6);  // 20 = 7 + 7 + 6, then b samples
  EXPECT_EQ(tokens_of(s3, a), 1);
}

TEST(SchedulerTest, PrefillFirstAdmitsBeforeDecodes) {
  Fixture f(64, 4, opts(8, SchedulePolicy::kPrefillFirst));
  const RequestId a = f.add(3, 10);
  f.step();
  const RequestId b = f.add(8, 2);
  auto s = f.step();
  EXPECT_EQ(tokens_of(s, b), 8);  // the whole budget to the prefill
  EXPECT_EQ(tokens_of(s, a), 0);  // the decode waits this step
  ASSERT_FALSE(s.items.empty());
  EXPECT_EQ(s.items[0].request->id, b);
}

// MindIE's rule: prefill when (prefill s/request x running decodes) <= (decode step s x
// waiting requests that free slots could admit).
TEST(SchedulerTest, AdaptivePolicyWeighsMeasuredCosts) {
  SchedulerOptions o = opts(64, SchedulePolicy::kAdaptive);
  o.max_num_seqs = 8;
  Fixture f(256, 4, o);
  for (int i = 0; i < 4; ++i) f.add(4, 50);
  f.step();  // nothing measured, nobody running: prefill
  EXPECT_EQ(f.sched.num_running(), 4);
  f.add(4, 50);
  f.add(4, 50);  // 2 waiting, 4 free slots -> 2 admittable
  ScheduledBatch prefill_batch;
  prefill_batch.items.push_back({nullptr, 8});
  ScheduledBatch decode_batch;
  decode_batch.items.push_back({nullptr, 1});
  // Expensive prefills (1 s/request x 4 running = 4) vs cheap decodes (0.1 s x 2 = 0.2): decode.
  f.sched.observe_step(prefill_batch, 1.0);
  f.sched.observe_step(decode_batch, 0.1);
  EXPECT_FALSE(f.sched.adaptive_prefers_prefill());
  auto s = f.step();
  EXPECT_EQ(s.items[0].request->prompt.size(), 4u);
  EXPECT_EQ(s.items[0].num_new_tokens, 1);  // a decode leads the batch
  // Decodes become slow relative to prefills: many observations move the averages.
  f.add(4, 50);
  f.add(4, 50);
  for (int i = 0; i < 40; ++i) {
    f.sched.observe_step(prefill_batch, 0.01);
    f.sched.observe_step(decode_batch, 5.0);
  }
  EXPECT_TRUE(f.sched.adaptive_prefers_prefill());
  auto p = f.step();
  ASSERT_FALSE(p.items.empty());
  EXPECT_EQ(p.items[0].num_new_tokens, 4);  // a waiting prompt leads the batch
}

TEST(SchedulerTest, WaitingQueueOrderedByPriorityThenArrival) {
  Fixture f(64, 4, opts(4));
  const RequestId low = f.add(4, 1, 5);
  const RequestId high = f.add(4, 1, -1);
  const RequestId mid = f.add(4, 1, 0);
  EXPECT_EQ(f.step().items[0].request->id, high);
  EXPECT_EQ(f.step().items[0].request->id, mid);
  EXPECT_EQ(f.step().items[0].request->id, low);
}

TEST(SchedulerTest, PreemptsLowestPriorityLatestWhenBlocksRunOut) {
  Fixture f(4, 2, opts(64));  // 8 token slots
  const RequestId a = f.add(2, 5, 0);
  const RequestId b = f.add(2, 5, 1);  // lower priority
  f.step();                            // prompts: 2 tokens computed each (1 block each), 3 known
  f.step();                            // token 3 of each: 2 blocks each = all 4 blocks
  f.step();                            // token 4 of each: still 2 blocks each
  auto s = f.step();                   // token 5 needs a 3rd block: b gives way
  ASSERT_EQ(s.preempted.size(), 1u);
  EXPECT_EQ(s.preempted[0], b);
  EXPECT_EQ(tokens_of(s, a), 1);
  EXPECT_EQ(f.sched.num_waiting(), 1);
  EXPECT_GE(f.sched.num_preemptions(), 1);
}

TEST(SchedulerTest, RequestTooLargeIsAnErrorForItAlone) {
  Fixture f(4, 2, opts(64));
  const RequestId big = f.add(5, 10);  // 15 tokens > 8 slots
  const RequestId ok = f.add(2, 2);
  auto fin = f.sched.take_finished();
  ASSERT_EQ(fin.size(), 1u);
  EXPECT_EQ(fin[0]->id, big);
  EXPECT_EQ(fin[0]->finish_reason, FinishReason::kError);
  EXPECT_NE(fin[0]->error.find("more KV cache than exists"), std::string::npos);
  while (f.sched.has_work()) f.step();
  fin = f.sched.take_finished();
  ASSERT_EQ(fin.size(), 1u);
  EXPECT_EQ(fin[0]->id, ok);
  EXPECT_EQ(fin[0]->finish_reason, FinishReason::kLength);
  EXPECT_EQ(fin[0]->output.size(), 2u);
}

// Property: random submissions, aborts (waiting, mid-prefill, mid-decode) and steps; every
// request ends, and afterwards every block is free.
TEST(SchedulerTest, RandomWorkloadFreesEveryBlock) {
  std::mt19937 rng(11);
  for (SchedulePolicy policy : {SchedulePolicy::kDecodeFirst, SchedulePolicy::kPrefillFirst}) {
    Fixture f(24, 4, opts(16, policy));
    std::vector<RequestId> live;
    int64_t added = 0, ended = 0;
    for (int iter = 0; iter < 3000; ++iter) {
      const unsigned dice = rng() % 10;
      if (dice < 3) {
        live.push_back(f.add(1 + static_cast<int64_t>(rng() % 30), 1 + static_cast<int64_t>(rng() % 20),
                             static_cast<int32_t>(rng() % 3)));
        ++added;
      } else if (dice < 4 && !live.empty()) {
        f.sched.abort(live[rng() % live.size()]);
      } else {
        f.step();
      }
      for (auto& r : f.sched.take_finished()) {
        ++ended;
        live.erase(std::find(live.begin(), live.end(), r->id));
      }
      ASSERT_LE(f.pool.num_used_blocks(), 24);
    }
    while (f.sched.has_work()) f.step();
    ended += static_cast<int64_t>(f.sched.take_finished().size());
    EXPECT_EQ(ended, added);
    EXPECT_EQ(f.pool.num_free_blocks(), 24);
  }
}

// Loads that land when the test says: the bookkeeping of both fakes below (the offload tiers'
// reader thread, or a prefill instance, stand behind their interfaces).
struct FakeLoads {
  struct Started {
    uint64_t ticket;
    RemoteKvRef from;         // the remote fake's only
    int64_t first_block = 0;  // the remote fake's only
    std::vector<BlockHash> keys;
    std::vector<int32_t> blocks;
    bool cancelled = false, timed_out = false, landed = false;
  };
  std::vector<Started> started;
  std::vector<KvBlockSource::Finished> ready;
  uint64_t next = 1;

  uint64_t record(RemoteKvRef from, int64_t first_block, std::vector<BlockHash> keys,
                  std::vector<int32_t> blocks) {
    started.push_back({next, std::move(from), first_block, std::move(keys), std::move(blocks)});
    return next++;
  }
  void drain(std::vector<KvBlockSource::Finished>* out) {
    for (auto& f : ready) out->push_back(f);
    ready.clear();
  }
  void mark_cancelled(uint64_t ticket, bool timed_out) {
    for (auto& st : started) {
      if (st.ticket != ticket) continue;
      st.cancelled = true;
      st.timed_out = timed_out;
    }
  }
  void land(size_t i, int64_t loaded, std::string error = "") {
    ASSERT_FALSE(started[i].landed);
    started[i].landed = true;
    ready.push_back({started[i].ticket,
                     std::min<int64_t>(loaded, static_cast<int64_t>(started[i].keys.size())),
                     std::move(error)});
  }
};

// An offload tier's block source.
struct FakeSource final : KvBlockSource, FakeLoads {
  uint64_t start_load(std::vector<BlockHash> keys, std::vector<int32_t> blocks) override {
    return record({}, 0, std::move(keys), std::move(blocks));
  }
  void poll(std::vector<Finished>* out) override { drain(out); }
  void cancel(uint64_t ticket) override { mark_cancelled(ticket, false); }
};

// Prefix caching on, blocks of 4 tokens, the fake source behind the KV manager.
struct LoadFixture : Fixture {
  FakeSource source;
  LoadFixture(int32_t blocks, SchedulerOptions o) : Fixture(blocks, 4, o, /*prefix_caching=*/true) {
    kv.set_block_source(&source);
  }
  // Distinct tokens from `first_token` on, so prompts share prefixes only when they start alike.
  RequestId add(int64_t prompt_len, int64_t max_tokens, int32_t first_token = 7) {
    return Fixture::add(prompt_len, max_tokens, 0, first_token);
  }
};

// A request whose prefix is elsewhere waits for it with its blocks reserved while the running
// requests keep stepping, then joins with the landed blocks counted as computed.
TEST(SchedulerKvLoadTest, ARequestWaitsForItsKvWhileOthersStep) {
  LoadFixture f(64, opts(64));
  const RequestId a = f.add(3, 50, 1000);
  f.step();
  const RequestId b = f.add(20, 5);  // 4 full blocks before its last token: 4 keys to load
  auto s1 = f.step();
  ASSERT_EQ(f.source.started.size(), 1u);
  EXPECT_EQ(f.source.started[0].keys.size(), 4u);
  EXPECT_EQ(tokens_of(s1, b), 0);
  EXPECT_EQ(tokens_of(s1, a), 1);
  EXPECT_EQ(f.sched.num_waiting_for_kv(), 1);
  for (int i = 0; i < 5; ++i) {
    auto s = f.step();
    EXPECT_EQ(tokens_of(s, a), 1) << "the running request stalled behind the load";
    EXPECT_EQ(tokens_of(s, b), 0);
  }
  f.source.land(0, 3);  // three of the four blocks arrive
  auto s2 = f.step();
  EXPECT_EQ(f.sched.num_waiting_for_kv(), 0);
  EXPECT_EQ(tokens_of(s2, b), 8);  // 20 - 12 landed
  EXPECT_EQ(f.kv.prefix_hit_tokens(), 12);
  while (f.sched.has_work()) f.step();
  EXPECT_EQ(f.sched.take_finished().size(), 2u);
  EXPECT_EQ(f.pool.num_used_blocks(), 0);
}

TEST(SchedulerKvLoadTest, ALoadThatTimesOutIsRecomputedAndItsBlocksReturnWhenItLands) {
  SchedulerOptions o = opts(64);
  o.kv_load_timeout_seconds = 0.02;
  LoadFixture f(64, o);
  const RequestId b = f.add(20, 3);
  f.step();
  ASSERT_EQ(f.source.started.size(), 1u);
  std::this_thread::sleep_for(std::chrono::milliseconds(40));
  auto s = f.step();
  EXPECT_EQ(tokens_of(s, b), 20) << "after the timeout the whole prompt is computed";
  EXPECT_TRUE(f.source.started[0].cancelled);
  EXPECT_EQ(f.sched.num_kv_load_timeouts(), 1);
  EXPECT_EQ(f.sched.num_kv_loads(), 1);  // its reserved blocks are still the source's
  while (f.sched.has_runnable()) f.step();
  EXPECT_EQ(f.pool.num_used_blocks(), 4);
  f.source.land(0, 4);  // late: nobody waits for it any more
  f.step();
  EXPECT_EQ(f.sched.num_kv_loads(), 0);
  EXPECT_EQ(f.pool.num_used_blocks(), 0);
  auto done = f.sched.take_finished();
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0]->finish_reason, FinishReason::kLength);
}

TEST(SchedulerKvLoadTest, AFailedLoadRecomputesOrFailsByPolicy) {
  for (KvLoadFailure policy : {KvLoadFailure::kRecompute, KvLoadFailure::kFail}) {
    SchedulerOptions o = opts(64);
    o.kv_load_failure = policy;
    LoadFixture f(64, o);
    const RequestId b = f.add(20, 3);
    f.step();
    f.source.land(0, 1, "the redis KV tier failed during the load");
    auto s = f.step();
    EXPECT_EQ(f.sched.num_kv_load_failures(), 1);
    if (policy == KvLoadFailure::kRecompute) {
      EXPECT_EQ(tokens_of(s, b), 16);  // the one landed block counts; the rest is computed
      while (f.sched.has_work()) f.step();
      auto done = f.sched.take_finished();
      ASSERT_EQ(done.size(), 1u);
      EXPECT_EQ(done[0]->finish_reason, FinishReason::kLength);
    } else {
      auto done = f.sched.take_finished();
      ASSERT_EQ(done.size(), 1u);
      EXPECT_EQ(done[0]->finish_reason, FinishReason::kError);
      EXPECT_NE(done[0]->error.find("KV load failed: the redis KV tier failed"), std::string::npos);
    }
    EXPECT_EQ(f.pool.num_used_blocks(), 0);
  }
}

TEST(SchedulerKvLoadTest, AbortWhileWaitingForKvFreesEverything) {
  LoadFixture f(64, opts(64));
  const RequestId b = f.add(20, 3);
  f.step();
  f.sched.abort(b);
  auto done = f.sched.take_finished();
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0]->finish_reason, FinishReason::kAborted);
  EXPECT_TRUE(f.source.started[0].cancelled);
  EXPECT_TRUE(f.sched.has_work());  // the load's blocks are still out
  f.source.land(0, 0);
  f.step();
  EXPECT_FALSE(f.sched.has_work());
  EXPECT_EQ(f.pool.num_used_blocks(), 0);
}

// Random arrivals, aborts, loads landing whole, partly, failed or late, and timeouts: every
// request ends and every block comes back.
TEST(SchedulerKvLoadTest, RandomLoadsLoseNoRequestAndNoBlock) {
  std::mt19937 rng(3);
  for (KvLoadFailure policy : {KvLoadFailure::kRecompute, KvLoadFailure::kFail}) {
    SchedulerOptions o = opts(16);
    o.kv_load_failure = policy;
    o.kv_load_timeout_seconds = 0.002;
    LoadFixture f(40, o);
    std::vector<RequestId> live;
    int64_t added = 0, ended = 0;
    for (int iter = 0; iter < 3000; ++iter) {
      const unsigned dice = rng() % 12;
      if (dice < 3) {
        live.push_back(f.add(1 + static_cast<int64_t>(rng() % 30), 1 + static_cast<int64_t>(rng() % 10),
                             static_cast<int32_t>(rng() % 4) * 100));
        ++added;
      } else if (dice < 4 && !live.empty()) {
        f.sched.abort(live[rng() % live.size()]);
      } else if (dice < 7) {
        for (size_t i = 0; i < f.source.started.size(); ++i) {
          if (f.source.started[i].landed || rng() % 2) continue;
          f.source.land(i, static_cast<int64_t>(rng() % 6), rng() % 5 == 0 ? "tier down" : "");
        }
      } else if (dice < 8) {
        std::this_thread::sleep_for(std::chrono::microseconds(2500));
      } else {
        f.step();
      }
      for (auto& r : f.sched.take_finished()) {
        ++ended;
        live.erase(std::find(live.begin(), live.end(), r->id));
      }
      ASSERT_LE(f.pool.num_used_blocks(), 40);
    }
    for (size_t i = 0; i < f.source.started.size(); ++i) {
      if (!f.source.started[i].landed) f.source.land(i, 2);
    }
    while (f.sched.has_work()) f.step();
    ended += static_cast<int64_t>(f.sched.take_finished().size());
    EXPECT_EQ(ended, added);
    EXPECT_EQ(f.pool.num_free_blocks(), 40);
    EXPECT_GT(f.source.started.size(), 50u);
  }
}

// A prefill instance whose pulls land when the test says.
struct FakeRemote final : RemoteKvSource, FakeLoads {
  KvTransferStats counters;
  uint64_t start_load(const RemoteKvRef& from, int64_t first_block, std::vector<BlockHash> keys,
                      std::vector<int32_t> blocks) override {
    return record(from, first_block, std::move(keys), std::move(blocks));
  }
  void poll(std::vector<KvBlockSource::Finished>* out) override { drain(out); }
  void cancel(uint64_t ticket, bool timed_out) override { mark_cancelled(ticket, timed_out); }
  const KvTransferStats& stats() const override { return counters; }
};

// Prefix caching on, blocks of 4 tokens, the fake prefill instance behind the scheduler.
struct RemoteFixture : Fixture {
  FakeRemote remote;
  explicit RemoteFixture(SchedulerOptions o, int32_t blocks = 64) : Fixture(blocks, 4, o, true) {
    sched.set_remote_source(&remote);
  }
  // A disaggregated request: tokens first_token, first_token + 1, ...; its first output `first`.
  RequestId add_remote(int64_t prompt_len, int64_t max_tokens, int32_t first = 5, int32_t first_token = 100) {
    auto r = std::make_unique<Request>();
    r->id = next;
    r->arrival_order = next++;
    for (int64_t i = 0; i < prompt_len; ++i) r->prompt.push_back(first_token + static_cast<int32_t>(i));
    r->output.push_back(first);
    r->limits.max_tokens = max_tokens;
    r->limits.stop_token_ids = {2};
    r->remote_kv = RemoteKvRef{"10.0.0.2", 4000, 77, prompt_len};
    const RequestId id = r->id;
    sched.add(std::move(r));
    return id;
  }
};

// The decode side: a prompt of 18 tokens (4 full blocks and a partial one of 2) is pulled whole,
// while the running request steps; then only the first token is computed: never the prompt.
TEST(SchedulerRemoteKvTest, APulledPromptIsNeverRecomputedAndItsPartialBlockStaysUncached) {
  RemoteFixture f(opts(64));
  const RequestId a = f.add(3, 40, 0, 1000);
  f.step();
  const RequestId b = f.add_remote(18, 3);
  auto s1 = f.step();
  ASSERT_EQ(f.remote.started.size(), 1u);
  const auto& st = f.remote.started[0];
  EXPECT_EQ(st.first_block, 0);
  EXPECT_EQ(st.from.transfer_id, 77u);
  ASSERT_EQ(st.keys.size(), 5u);
  std::vector<int32_t> prompt;
  for (int32_t i = 0; i < 18; ++i) prompt.push_back(100 + i);
  EXPECT_EQ(st.keys, f.kv.block_keys({prompt, {}}, 18));
  EXPECT_EQ(tokens_of(s1, a), 1);
  EXPECT_EQ(tokens_of(s1, b), 0);
  f.remote.land(0, 5);
  auto s2 = f.step();
  EXPECT_EQ(tokens_of(s2, b), 1) << "only the first token (from the prefill instance) is computed";
  EXPECT_EQ(f.kv.prefix_hit_tokens(), 18);
  // The 4 full blocks are cached under the keys a local computation would give them; the partial
  // block is not (a prompt of 18 with another tail finds 16 tokens).
  f.sched.abort(a);
  while (f.sched.has_work()) f.step();
  auto done = f.sched.take_finished();
  ASSERT_EQ(done.size(), 2u);
  for (auto& r : done) {
    if (r->id != b) continue;
    EXPECT_EQ(r->output.size(), 3u);
    EXPECT_EQ(r->output[0], 5);
  }
  EXPECT_EQ(f.pool.num_used_blocks(), 0);
  const RequestId c = f.add(20, 1, 0, 100);  // tokens 100..119: the same first 18
  auto s3 = f.step();
  EXPECT_EQ(tokens_of(s3, c), 4) << "16 tokens of full blocks came from the pulled ones";
}

// What the decode instance already caches is not pulled: the pull starts at the first block past
// its own prefix hit.
TEST(SchedulerRemoteKvTest, OnlyTheBlocksPastTheLocalPrefixHitArePulled) {
  RemoteFixture f(opts(64));
  f.add(9, 1, 0, 100);  // caches blocks 0 and 1 (tokens 100..107)
  while (f.sched.has_work()) f.step();
  f.sched.take_finished();
  const RequestId b = f.add_remote(18, 2);
  f.step();
  ASSERT_EQ(f.remote.started.size(), 1u);
  EXPECT_EQ(f.remote.started[0].first_block, 2);
  EXPECT_EQ(f.remote.started[0].keys.size(), 3u);
  f.remote.land(0, 3);
  auto s = f.step();
  EXPECT_EQ(tokens_of(s, b), 1);
  while (f.sched.has_work()) f.step();
  EXPECT_EQ(f.pool.num_used_blocks(), 0);
}

TEST(SchedulerRemoteKvTest, AFailedOrLatePullRecomputesOrFailsByPolicy) {
  for (KvLoadFailure policy : {KvLoadFailure::kRecompute, KvLoadFailure::kFail}) {
    SchedulerOptions o = opts(64);
    o.kv_load_failure = policy;
    RemoteFixture f(o);
    const RequestId b = f.add_remote(18, 3);
    f.step();
    f.remote.land(0, 2, "connection to the prefill instance 10.0.0.2:4000 failed");
    auto s = f.step();
    if (policy == KvLoadFailure::kRecompute) {
      EXPECT_EQ(tokens_of(s, b), 11)
          << "the 8 landed tokens are kept; 10 more and the first token are computed";
      while (f.sched.has_work()) f.step();
      auto done = f.sched.take_finished();
      ASSERT_EQ(done.size(), 1u);
      EXPECT_EQ(done[0]->finish_reason, FinishReason::kLength);
      EXPECT_EQ(done[0]->output.size(), 3u);
    } else {
      auto done = f.sched.take_finished();
      ASSERT_EQ(done.size(), 1u);
      EXPECT_EQ(done[0]->finish_reason, FinishReason::kError);
      EXPECT_NE(done[0]->error.find("10.0.0.2:4000"), std::string::npos) << done[0]->error;
    }
    EXPECT_EQ(f.pool.num_used_blocks(), 0);
  }
  SchedulerOptions o = opts(64);
  o.kv_load_timeout_seconds = 0.02;
  RemoteFixture f(o);
  const RequestId b = f.add_remote(18, 2);
  f.step();
  std::this_thread::sleep_for(std::chrono::milliseconds(40));
  auto s = f.step();
  EXPECT_EQ(tokens_of(s, b), 19) << "timed out: the prompt and the first token are computed";
  EXPECT_TRUE(f.remote.started[0].cancelled);
  EXPECT_TRUE(f.remote.started[0].timed_out);
  while (f.sched.has_runnable()) f.step();
  f.remote.land(0, 5);  // late: its blocks return to the pool
  f.step();
  EXPECT_EQ(f.pool.num_used_blocks(), 0);
}

TEST(SchedulerRemoteKvTest, AFirstTokenThatEndsTheRequestPullsNothing) {
  RemoteFixture f(opts(64));
  f.add_remote(18, 5, /*first=*/2);  // 2 is a stop token
  f.add_remote(18, 1, /*first=*/9);  // max_tokens 1: the first token is all
  auto done = f.sched.take_finished();
  ASSERT_EQ(done.size(), 2u);
  EXPECT_EQ(done[0]->finish_reason, FinishReason::kStop);
  EXPECT_EQ(done[1]->finish_reason, FinishReason::kLength);
  f.step();
  EXPECT_TRUE(f.remote.started.empty());
}

TEST(SchedulerRemoteKvTest, AbortWhilePullingCancelsAndFreesTheBlocksWhenItLands) {
  RemoteFixture f(opts(64));
  const RequestId b = f.add_remote(18, 3);
  f.step();
  EXPECT_EQ(f.pool.num_used_blocks(), 5);
  f.sched.abort(b);
  EXPECT_TRUE(f.remote.started[0].cancelled);
  EXPECT_FALSE(f.remote.started[0].timed_out);
  f.remote.land(0, 0);
  f.step();
  EXPECT_EQ(f.sched.num_kv_loads(), 0);
  EXPECT_EQ(f.pool.num_used_blocks(), 0);
}

// A pool too small for the pull right now: the request waits its turn, then pulls.
TEST(SchedulerRemoteKvTest, APullWaitsForFreeBlocks) {
  RemoteFixture f(opts(64), /*blocks=*/8);
  const RequestId a = f.add(20, 2, 0, 1000);  // 6 blocks with its output
  f.step();
  const RequestId b = f.add_remote(18, 2);  // needs 5
  f.step();
  EXPECT_TRUE(f.remote.started.empty());
  while (f.sched.contains(a)) f.step();
  f.step();
  ASSERT_EQ(f.remote.started.size(), 1u);
  f.remote.land(0, 5);
  while (f.sched.has_work()) f.step();
  EXPECT_FALSE(f.sched.contains(b));
  EXPECT_EQ(f.pool.num_used_blocks(), 0);
}

// Speculative drafts: a decoding request drafts the continuation of its prompt's repeats, the
// accepted ones are appended and computed, the rejected ones not; drafts that were all rejected
// make it skip drafting for 1, 2, 4, ... steps, an accepted one resets that.
TEST(SchedulerTest, DraftsAreAcceptedInPartAndAllRejectedOnesBackOff) {
  SchedulerOptions o = opts(64);
  o.speculative.enabled = true;
  o.speculative.ngram = {3, 1, 1};
  Fixture f(64, 4, o);
  const RequestId id = f.add(6, 40, 0, 20);  // prompt 20 21 22 23 24 25
  ScheduledBatch b = f.sched.schedule();     // the prompt
  f.sched.update(b, std::vector<int32_t>{20});
  Request* r = b.items[0].request;
  auto step = [&](int32_t accepted, int32_t last) {
    ScheduledBatch s = f.sched.schedule();
    EXPECT_EQ(s.items.size(), 1u);
    const auto drafts = static_cast<int64_t>(r->draft.size());
    EXPECT_EQ(s.items[0].num_new_tokens, 1 + drafts);
    EXPECT_EQ(s.items[0].num_draft_tokens, drafts);
    f.sched.update(s, std::vector<int32_t>{last}, std::vector<int32_t>{drafts > 0 ? accepted : 0});
    return drafts;
  };
  // Output so far "20": the 1-gram 20 occurred at the prompt's start, so 21 22 23 are drafted.
  EXPECT_EQ(step(2, 30), 3);  // 21 22 kept, 30 sampled after them
  EXPECT_EQ(r->output, (std::vector<int32_t>{20, 21, 22, 30}));
  EXPECT_EQ(r->num_computed_tokens, 6 + 3);  // 20 21 22 computed; 30 not yet
  // "30" never occurred before: no draft.
  EXPECT_EQ(step(0, 21), 0);
  // "21" again: 22 30 21 drafted, all rejected: the next step drafts nothing, the one after does.
  EXPECT_EQ(step(0, 24), 3);
  EXPECT_EQ(r->num_computed_tokens, static_cast<int64_t>(r->prompt.size() + r->output.size()) - 1);
  EXPECT_EQ(step(0, 20), 0);  // skipped (back-off 1)
  EXPECT_EQ(step(0, 20), 3);  // "20" drafts again; all rejected: back-off 2
  EXPECT_EQ(step(0, 20), 0);
  EXPECT_EQ(step(0, 20), 0);
  EXPECT_EQ(step(1, 20), 1);  // "20" was last followed by "20" alone; it is kept: the back-off resets
  EXPECT_GT(step(0, 20), 0);
  (void)id;
}

}  // namespace
}  // namespace inferd
