// Scheduler and KV accounting with fake requests and no model.
#include "engine/scheduler.h"

#include <gtest/gtest.h>

#include <random>

namespace inferd {
namespace {

struct Fixture {
  BlockPool pool;
  KVCacheManager kv;
  Scheduler sched;
  uint64_t next = 1;
  Fixture(int32_t blocks, int32_t block_size, SchedulerOptions o)
      : pool(blocks), kv(pool, block_size), sched(o, kv) {}

  RequestId add(int64_t prompt_len, int64_t max_tokens, int32_t priority = 0) {
    auto r = std::make_unique<Request>();
    r->id = next;
    r->arrival_order = next++;
    r->prompt.assign(static_cast<size_t>(prompt_len), 7);
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

}  // namespace
}  // namespace inferd
