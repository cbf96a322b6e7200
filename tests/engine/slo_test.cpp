// SLO classes: parsing the flag, and the scheduler serving the classes' ranks in order (fake
// requests, no model).
#include "engine/slo.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>

#include "engine/scheduler.h"

namespace inferd {
namespace {

TEST(SloClassTest, ParsesDurationsWeightsAndDefaults) {
  auto a = parse_slo_class("interactive:ttft=500ms,tpot=0.05s,weight=4");
  ASSERT_TRUE(a.has_value()) << a.status().message();
  EXPECT_EQ(a->name, "interactive");
  EXPECT_DOUBLE_EQ(a->ttft_seconds, 0.5);
  EXPECT_DOUBLE_EQ(a->tpot_seconds, 0.05);
  EXPECT_DOUBLE_EQ(a->weight, 4);
  auto b = parse_slo_class("batch:ttft=30000");  // a bare number is milliseconds
  ASSERT_TRUE(b.has_value());
  EXPECT_DOUBLE_EQ(b->ttft_seconds, 30);
  EXPECT_TRUE(std::isinf(b->tpot_seconds));
  EXPECT_DOUBLE_EQ(b->weight, 1);
  auto c = parse_slo_class("bare");
  ASSERT_TRUE(c.has_value());
  EXPECT_TRUE(std::isinf(c->ttft_seconds));
}

TEST(SloClassTest, BadSpecsNameTheProblem) {
  for (const char* spec : {"", ":ttft=1", "a b:ttft=1", "x:ttft", "x:ttft=-1", "x:ttft=0", "x:ttft=abc",
                           "x:tpot=1h", "x:weight=0", "x:weight=nan", "x:colour=red"}) {
    auto c = parse_slo_class(spec);
    EXPECT_FALSE(c.has_value()) << spec;
    if (!c) {
      EXPECT_NE(c.status().message().find("--slo-class"), std::string::npos) << c.status().message();
    }
  }
  auto unknown = parse_slo_class("x:colour=red");
  EXPECT_NE(unknown.status().message().find("colour"), std::string::npos);
}

SloClasses make_classes(std::vector<std::string> specs, const std::string& default_name = "") {
  std::vector<SloClass> v;
  for (const auto& s : specs) v.push_back(parse_slo_class(s).value());
  auto c = SloClasses::create(std::move(v), default_name);
  EXPECT_TRUE(c.has_value()) << c.status().message();
  return std::move(*c);
}

TEST(SloClassTest, RanksByWeightAndMapsPriorities) {
  const SloClasses c =
      make_classes({"chat:ttft=500ms,weight=4", "batch:ttft=30s,weight=1", "agent:weight=4"});
  EXPECT_EQ(c.rank(0), 0);
  EXPECT_EQ(c.rank(2), 0);  // equal weight, equal rank
  EXPECT_EQ(c.rank(1), 2);
  EXPECT_EQ(c.default_index(), 1u);  // the lightest
  EXPECT_EQ(c.for_priority(0), 0u);  // the first class of rank 0
  EXPECT_EQ(c.for_priority(1), 0u);  // no rank 1: the nearest better one
  EXPECT_EQ(c.for_priority(2), 1u);
  EXPECT_EQ(c.for_priority(99), 1u);
  EXPECT_EQ(c.for_priority(-5), 0u);
  EXPECT_EQ(c.class_of(2, 99), 2u);
  EXPECT_EQ(c.class_of(-1, 0), 1u);  // no class, no priority: the default
  EXPECT_EQ(c.class_of(-1, -1), 0u);
  EXPECT_EQ(*c.find("batch"), 1u);
  EXPECT_FALSE(c.find("nope"));
  EXPECT_EQ(make_classes({"a:weight=2", "b"}, "a").default_index(), 0u);
  EXPECT_FALSE(SloClasses::create({SloClass{"a"}, SloClass{"a"}}, "").has_value());
  EXPECT_FALSE(SloClasses::create({SloClass{"a"}}, "b").has_value());
  EXPECT_FALSE(SloClasses::create({}, "b").has_value());
  EXPECT_TRUE(SloClasses::create({}, "").value().empty());
}

// A scheduler with classes; requests get their class's rank and deadline as Engine::add gives them.
struct Fixture {
  BlockPool pool;
  KVCacheManager kv;
  SchedulerOptions options;
  Scheduler sched;
  uint64_t next = 1;
  Fixture(int32_t blocks, SchedulerOptions o) : pool(blocks), kv(pool, 4, false), options(o), sched(o, kv) {}

  RequestId add(int64_t prompt_len, int64_t max_tokens, size_t slo_class) {
    auto r = std::make_unique<Request>();
    r->id = next;
    r->arrival_order = next++;
    r->prompt.assign(static_cast<size_t>(prompt_len), 7);
    r->limits.max_tokens = max_tokens;
    r->slo_class = static_cast<int32_t>(slo_class);
    r->priority = options.slo.rank(slo_class);
    const double ttft = options.slo.at(slo_class).ttft_seconds;
    if (std::isfinite(ttft))
      r->deadline =
          std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                                 std::chrono::duration<double>(ttft));
    const RequestId id = r->id;
    sched.add(std::move(r));
    return id;
  }
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

SchedulerOptions opts(int64_t budget, int64_t max_seqs,
                      SchedulePolicy policy = SchedulePolicy::kDecodeFirst) {
  SchedulerOptions o;
  o.max_num_batched_tokens = budget;
  o.max_prefill_tokens = budget;
  o.max_num_seqs = max_seqs;
  o.policy = policy;
  o.max_model_len = 1024;
  o.slo = make_classes({"chat:ttft=500ms,tpot=50ms,weight=4", "batch:ttft=60s,weight=1"});
  return o;
}
constexpr size_t kChat = 0, kBatch = 1;

TEST(SloSchedulerTest, ABetterClassPrefillsBeforeALowerClassThatIsAlreadyRunning) {
  for (SchedulePolicy policy : {SchedulePolicy::kDecodeFirst, SchedulePolicy::kPrefillFirst}) {
    Fixture f(256, opts(16, 8, policy));
    const RequestId batch = f.add(100, 4, kBatch);
    EXPECT_EQ(tokens_of(f.step(), batch), 16);  // its long prompt, chunk by chunk
    const RequestId chat = f.add(10, 4, kChat);
    const ScheduledBatch s = f.step();
    // The chat prompt runs whole in this step; the batch prefill takes what is left. Without
    // classes (decode-first) the running prefill would take the whole budget first.
    EXPECT_EQ(tokens_of(s, chat), 10);
    EXPECT_EQ(tokens_of(s, batch), 6);
    EXPECT_EQ(s.items.front().request->id, chat);
  }
}

TEST(SloSchedulerTest, WithoutClassesTheRunningPrefillKeepsTheBudget) {
  SchedulerOptions o = opts(16, 8);
  o.slo = SloClasses();
  Fixture f(256, o);
  f.options.slo = make_classes({"chat:weight=4", "batch"});  // ranks for add() only
  const RequestId batch = f.add(100, 4, kBatch);
  f.step();
  const RequestId chat = f.add(10, 4, kChat);
  const ScheduledBatch s = f.step();
  EXPECT_EQ(tokens_of(s, batch), 16);
  EXPECT_EQ(tokens_of(s, chat), 0);
}

TEST(SloSchedulerTest, ABetterClassTakesTheSequenceSlotOfALowerOne) {
  Fixture f(256, opts(64, 2));
  const RequestId b1 = f.add(8, 50, kBatch);
  const RequestId b2 = f.add(8, 50, kBatch);
  f.step();
  f.step();
  const RequestId chat = f.add(8, 4, kChat);
  const ScheduledBatch s = f.step();
  EXPECT_EQ(tokens_of(s, chat), 8);
  ASSERT_EQ(s.preempted.size(), 1u);
  EXPECT_EQ(s.preempted[0], b2);  // the latest arrival of the lowest rank
  EXPECT_EQ(tokens_of(s, b1), 1);
  // The preempted request comes back when the chat request is done, and finishes.
  for (int i = 0; i < 200 && f.sched.has_work(); ++i) f.step();
  EXPECT_FALSE(f.sched.has_work());
  const auto finished = f.sched.take_finished();
  ASSERT_EQ(finished.size(), 3u);
  for (const auto& r : finished) EXPECT_NE(r->finish_reason, FinishReason::kError);
}

TEST(SloSchedulerTest, AnEqualClassNeverPreemptsForASlot) {
  Fixture f(256, opts(64, 1));
  const RequestId a = f.add(8, 20, kBatch);
  f.step();
  const RequestId b = f.add(8, 4, kBatch);
  const ScheduledBatch s = f.step();
  EXPECT_TRUE(s.preempted.empty());
  EXPECT_EQ(tokens_of(s, a), 1);
  EXPECT_EQ(tokens_of(s, b), 0);
}

TEST(SloSchedulerTest, EqualRanksRunEarliestDeadlineFirst) {
  SchedulerOptions o = opts(8, 8);
  o.slo = make_classes({"slow:ttft=10s,weight=2", "fast:ttft=100ms,weight=2"});
  Fixture f(256, o);
  const RequestId slow = f.add(8, 2, 0);
  const RequestId fast = f.add(8, 2, 1);  // arrived later, due earlier
  const ScheduledBatch s = f.step();
  EXPECT_EQ(tokens_of(s, fast), 8);
  EXPECT_EQ(tokens_of(s, slow), 0);
}

TEST(SloSchedulerTest, QueuedPrefillTokensAreCountedByRank) {
  Fixture f(256, opts(16, 8));
  f.add(100, 4, kBatch);
  f.step();  // 16 of 100 computed
  f.add(10, 4, kChat);
  std::vector<int64_t> q;
  f.sched.queued_prefill_tokens(&q);
  ASSERT_EQ(q.size(), 2u);
  EXPECT_EQ(q[0], 10);
  EXPECT_EQ(q[1], 84);
  f.step();  // chat's 10 and 6 more of batch; chat now decodes
  f.sched.queued_prefill_tokens(&q);
  EXPECT_EQ(q[0], 0);
  EXPECT_EQ(q[1], 78);
}

TEST(SloSchedulerTest, MeasuresThePrefillRate) {
  Fixture f(256, opts(16, 8));
  EXPECT_EQ(f.sched.prefill_tokens_per_second(), 0);
  f.add(100, 4, kBatch);
  ScheduledBatch b = f.sched.schedule();
  f.sched.update(b, std::vector<int32_t>(b.items.size(), 1));
  f.sched.observe_step(b, 0.5);  // 16 prompt tokens in 0.5 s
  EXPECT_DOUBLE_EQ(f.sched.prefill_tokens_per_second(), 32);
}

TEST(SloSchedulerTest, StepsAreCappedToTheTightestClassPresent) {
  SchedulerOptions o = opts(2048, 8);
  o.max_model_len = 4096;
  Fixture f(1024, o);
  const RequestId batch = f.add(3000, 4, kBatch);
  ScheduledBatch b = f.sched.schedule();
  EXPECT_EQ(tokens_of(b, batch), 2048);  // only the batch class here: its TTFT (60 s) allows the whole budget
  f.sched.update(b, std::vector<int32_t>(b.items.size(), 1));
  f.sched.observe_step(b, 2.048);  // 1000 prompt tokens per second
  const RequestId chat = f.add(10, 4, kChat);
  b = f.sched.schedule();
  // chat's TPOT (50 ms) at 1000 tokens/s: 50 tokens in the step, chat's 10 first.
  EXPECT_EQ(b.num_tokens, 50);
  EXPECT_EQ(tokens_of(b, chat), 10);
  EXPECT_EQ(tokens_of(b, batch), 40);
}

TEST(SchedulerStepModelTest, FitsTheFixedAndPerTokenCostOfASteps) {
  Fixture f(1024, opts(4096, 8));
  EXPECT_EQ(f.sched.step_fixed_seconds(), 0);
  ScheduledBatch b;
  b.items.push_back({nullptr, 1});
  for (int i = 0; i < 200; ++i) {
    b.num_tokens = i % 2 == 0 ? 16 : 512;
    f.sched.observe_step(b, 0.004 + 0.0001 * static_cast<double>(b.num_tokens));
  }
  EXPECT_NEAR(f.sched.step_fixed_seconds(), 0.004, 1e-6);
  EXPECT_NEAR(f.sched.step_seconds_per_token(), 0.0001, 1e-9);
}

}  // namespace
}  // namespace inferd
