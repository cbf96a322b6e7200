// The engine end to end on real weights: continuous batching gives each request exactly the
// tokens it gets alone; preemption under a tiny KV budget changes nothing but timing.
#include "engine/engine.h"

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>

#include "model/default_model.h"
#include "model/model_loader.h"
#include "test_support.h"

namespace inferd {
namespace {

struct Workload {
  std::vector<RequestSpec> specs;
};

Workload random_workload(int n, int64_t vocab, int64_t max_prompt, int64_t max_out, uint32_t seed) {
  std::mt19937 rng(seed);
  Workload w;
  for (int i = 0; i < n; ++i) {
    RequestSpec s;
    const int64_t len = 1 + static_cast<int64_t>(rng() % static_cast<uint32_t>(max_prompt));
    for (int64_t k = 0; k < len; ++k)
      s.prompt.push_back(static_cast<int32_t>(rng() % static_cast<uint32_t>(vocab)));
    s.limits.max_tokens = 1 + static_cast<int64_t>(rng() % static_cast<uint32_t>(max_out));
    w.specs.push_back(s);
  }
  return w;
}

EngineOptions options(int64_t blocks, int32_t block_size, int64_t budget) {
  EngineOptions o;
  o.num_kv_blocks = blocks;
  o.block_size = block_size;
  o.scheduler.max_num_batched_tokens = budget;
  o.scheduler.max_prefill_tokens = budget;
  o.scheduler.max_num_seqs = 64;
  o.scheduler.max_model_len = 256;
  return o;
}

// Runs the specs (all submitted at once, or one at a time) and returns each one's tokens.
std::vector<std::vector<int32_t>> run(Transformer& model, const EngineOptions& o, const Workload& w,
                                      bool together, int64_t* preemptions = nullptr) {
  Engine engine(model, o);
  std::vector<std::vector<int32_t>> out(w.specs.size());
  std::map<RequestId, size_t> index;
  auto drain = [&] {
    while (engine.has_work()) {
      for (const StepOutput& s : engine.step()) {
        auto& tokens = out[index.at(s.id)];
        tokens.insert(tokens.end(), s.new_tokens.begin(), s.new_tokens.end());
        EXPECT_TRUE(s.error.empty()) << s.error;
      }
    }
  };
  for (size_t i = 0; i < w.specs.size(); ++i) {
    index[engine.add(w.specs[i])] = i;
    if (!together) drain();
  }
  drain();
  EXPECT_EQ(engine.block_pool().num_free_blocks(), engine.block_pool().num_blocks());
  if (preemptions != nullptr) *preemptions = engine.scheduler().num_preemptions();
  return out;
}

// Loads `path` and checks that the workload run all at once gives each request exactly the
// tokens it gets alone, and the asked number of them.
void expect_batched_equals_alone(const std::string& path, const Workload& w, const EngineOptions& o) {
  auto weights = load_model(path);
  ASSERT_TRUE(weights.has_value()) << weights.status().message();
  ThreadPool pool(2);
  Transformer model(**weights, pool);
  const auto alone = run(model, o, w, false);
  const auto together = run(model, o, w, true);
  EXPECT_EQ(together, alone) << path;
  for (size_t i = 0; i < w.specs.size(); ++i) {
    EXPECT_EQ(static_cast<int64_t>(alone[i].size()), w.specs[i].limits.max_tokens);
  }
}

TEST(EngineTest, ThirtyTwoRequestsTogetherEqualAloneTinyModels) {
  for (const char* variant : {"llama_untied", "qwen2", "qwen3"}) {
    expect_batched_equals_alone(test::fixture_path(std::string("tiny/") + variant),
                                random_workload(32, 256, 40, 24, 3), options(512, 16, 64));
  }
}

TEST(EngineTest, ThirtyTwoRequestsTogetherEqualAloneDefaultModel) {
  auto path = default_model_path();
  INFERD_REQUIRE_OR_SKIP(path.has_value(), "default model not installed");
  // No stop ids in these specs: every request runs to its max_tokens.
  expect_batched_equals_alone(*path, random_workload(32, 49152, 12, 4, 9), options(256, 16, 256));
}

// Requests arriving in bursts of sixteen (steps 0, 25 and 50) while others decode, run under
// `policy`: each request's tokens, and how the adaptive policy chose.
struct StaggeredRun {
  std::vector<std::vector<int32_t>> tokens;
  Scheduler::AdaptiveChoices choices;
};
StaggeredRun run_staggered(Transformer& model, EngineOptions o, SchedulePolicy policy, const Workload& w) {
  o.scheduler.policy = policy;
  Engine engine(model, o);
  StaggeredRun r;
  r.tokens.resize(w.specs.size());
  std::map<RequestId, size_t> index;
  size_t next = 0;
  for (int step = 0; next < w.specs.size() || engine.has_work(); ++step) {
    for (int k = 0; k < 16 && step % 25 == 0 && next < w.specs.size(); ++k, ++next)
      index[engine.add(w.specs[next])] = next;
    for (const StepOutput& s : engine.step()) {
      auto& tokens = r.tokens[index.at(s.id)];
      tokens.insert(tokens.end(), s.new_tokens.begin(), s.new_tokens.end());
      EXPECT_TRUE(s.error.empty()) << s.error;
    }
  }
  EXPECT_EQ(engine.block_pool().num_free_blocks(), engine.block_pool().num_blocks());
  r.choices = engine.scheduler().adaptive_choices();
  return r;
}

// The adaptive policy in a real engine run. The first request of each burst is long, so a burst
// finds one request decoding and sixteen waiting: prefill-first pays one decode's wait against
// sixteen requests' (the rule picks it mid-run, not only on the idle first step); in between it
// decodes. Every request gets exactly the tokens the fixed policies give it, whatever it chose.
// Which order it chooses depends on what steps cost: the run on wall time (noisy on a shared
// machine: one preempted step skews the few prefill samples) only prints its choices; the
// asserted run learns from a fixed cost model of a memory-bound CPU step (a weight read per step,
// a little compute per token), so its choices are the same on every machine and load.
TEST(EngineTest, AdaptivePolicyChoosesBothOrdersAndKeepsOutputs) {
  auto weights = load_model(test::fixture_path("tiny/qwen2"));
  ASSERT_TRUE(weights.has_value());
  ThreadPool pool(2);
  Transformer model(**weights, pool);
  // Prompts of 2-4 tokens (the rule counts an item of one new token as a decode).
  Workload w = random_workload(48, 256, 3, 10, 17);
  for (auto& spec : w.specs) spec.prompt.push_back(7);
  for (size_t i = 0; i < w.specs.size(); i += 16) w.specs[i].limits.max_tokens = 40;
  EngineOptions o = options(512, 16, 80);
  const auto decode_first = run_staggered(model, o, SchedulePolicy::kDecodeFirst, w);
  const auto prefill_first = run_staggered(model, o, SchedulePolicy::kPrefillFirst, w);
  const auto on_wall_time = run_staggered(model, o, SchedulePolicy::kAdaptive, w);
  o.step_cost = [](const ScheduledBatch& b) { return 1e-3 + 2e-5 * static_cast<double>(b.num_tokens); };
  const auto modelled = run_staggered(model, o, SchedulePolicy::kAdaptive, w);
  EXPECT_EQ(prefill_first.tokens, decode_first.tokens);
  EXPECT_EQ(on_wall_time.tokens, decode_first.tokens);
  EXPECT_EQ(modelled.tokens, decode_first.tokens);
  for (size_t i = 0; i < w.specs.size(); ++i)
    EXPECT_EQ(static_cast<int64_t>(modelled.tokens[i].size()), w.specs[i].limits.max_tokens);
  // One prefill-first step per burst: the idle first one, then the two that meet a decode.
  EXPECT_EQ(modelled.choices.prefill_first, 3);
  EXPECT_GT(modelled.choices.decode_first, 0);
  EXPECT_EQ(decode_first.choices.prefill_first + decode_first.choices.decode_first, 0);
  for (const auto* run : {&on_wall_time, &modelled})
    std::printf("[ figures  ] adaptive on %s: %lld prefill-first steps, %lld decode-first steps\n",
                run == &modelled ? "the cost model" : "wall time",
                static_cast<long long>(run->choices.prefill_first),
                static_cast<long long>(run->choices.decode_first));
}

TEST(EngineTest, FrequentPreemptionKeepsOutputs) {
  auto weights = load_model(test::fixture_path("tiny/qwen3"));
  ASSERT_TRUE(weights.has_value());
  ThreadPool pool(2);
  Transformer model(**weights, pool);
  const Workload w = random_workload(16, 256, 20, 30, 21);
  int64_t preemptions = 0;
  const auto roomy = run(model, options(512, 4, 32), w, true);
  const auto tight = run(model, options(13, 4, 32), w, true, &preemptions);  // 52 slots
  EXPECT_EQ(tight, roomy);
  EXPECT_GT(preemptions, 0);
  std::printf("[ figures  ] %lld preemptions with 13 blocks of 4\n", static_cast<long long>(preemptions));
}

TEST(EngineTest, HighPriorityGetsItsFirstTokenFirst) {
  auto weights = load_model(test::fixture_path("tiny/llama_tied"));
  ASSERT_TRUE(weights.has_value());
  ThreadPool pool(1);
  Transformer model(**weights, pool);
  Engine engine(model, options(512, 16, 24));  // budget fits about one prompt a step
  Workload w = random_workload(6, 256, 1, 4, 5);
  std::vector<RequestId> low;
  for (auto s : w.specs) {
    s.prompt.assign(20, 3);
    s.priority = 5;
    low.push_back(engine.add(s));
  }
  RequestSpec urgent = w.specs[0];
  urgent.prompt.assign(20, 4);
  urgent.priority = -1;
  const RequestId high = engine.add(urgent);
  std::map<RequestId, int> first_step;
  for (int step = 0; engine.has_work(); ++step) {
    for (const auto& s : engine.step()) {
      if (!s.new_tokens.empty() && !first_step.count(s.id)) first_step[s.id] = step;
    }
  }
  for (RequestId id : low) EXPECT_LT(first_step.at(high), first_step.at(id));
}

TEST(EngineTest, BadRequestsFailAlone) {
  auto weights = load_model(test::fixture_path("tiny/llama_tied"));
  ASSERT_TRUE(weights.has_value());
  ThreadPool pool(1);
  Transformer model(**weights, pool);
  Engine engine(model, options(4, 4, 32));
  RequestSpec good{{1, 2, 3}, {}, {2, {}, false}, 0};
  RequestSpec bad_id{{1, 999}, {}, {2, {}, false}, 0};
  RequestSpec too_big{{1, 2, 3}, {}, {30, {}, false}, 0};
  const RequestId g = engine.add(good), b = engine.add(bad_id), t = engine.add(too_big);
  std::map<RequestId, StepOutput> last;
  while (engine.has_work()) {
    for (auto& s : engine.step()) last[s.id] = s;
  }
  for (auto& s : engine.step()) last[s.id] = s;
  EXPECT_EQ(last[g].finish_reason, FinishReason::kLength);
  EXPECT_EQ(last[b].finish_reason, FinishReason::kError);
  EXPECT_NE(last[b].error.find("outside the vocabulary"), std::string::npos);
  EXPECT_EQ(last[t].finish_reason, FinishReason::kError);
}

// n > 1: runs one request and returns each sample's tokens. Checks that every sample finishes
// exactly once and that every block is free at the end; `used_after_first_step` gets the pool's
// used blocks right after the step that computed the prompt.
std::vector<std::vector<int32_t>> run_samples(Transformer& model, const EngineOptions& o,
                                              const RequestSpec& spec,
                                              int64_t* used_after_first_step = nullptr,
                                              int64_t abort_after_steps = -1) {
  Engine engine(model, o);
  const RequestId id = engine.add(spec);
  std::vector<std::vector<int32_t>> tokens(static_cast<size_t>(spec.n));
  std::vector<int> finished(static_cast<size_t>(spec.n));
  for (int64_t step = 0; engine.has_work(); ++step) {
    if (step == abort_after_steps) engine.abort(id);
    for (const StepOutput& out : engine.step()) {
      EXPECT_EQ(out.id, id);
      auto& t = tokens.at(static_cast<size_t>(out.index));
      t.insert(t.end(), out.new_tokens.begin(), out.new_tokens.end());
      if (out.finished) ++finished.at(static_cast<size_t>(out.index));
    }
    if (step == 0 && used_after_first_step != nullptr)
      *used_after_first_step = engine.block_pool().num_used_blocks();
  }
  for (int f : finished) EXPECT_EQ(f, 1);
  EXPECT_EQ(engine.block_pool().num_free_blocks(), engine.block_pool().num_blocks());
  return tokens;
}

RequestSpec prompt_of(int64_t len, int64_t max_tokens, int32_t n) {
  RequestSpec s;
  for (int64_t k = 0; k < len; ++k) s.prompt.push_back(static_cast<int32_t>((k * 37 + 11) % 256));
  s.limits.max_tokens = max_tokens;
  s.n = n;
  return s;
}

TEST(EngineTest, SamplesShareThePromptsFullBlocks) {
  auto weights = load_model(test::fixture_path("tiny/qwen2"));
  ASSERT_TRUE(weights.has_value());
  ThreadPool pool(2);
  Transformer model(**weights, pool);
  for (int64_t len : {37, 32}) {
    SCOPED_TRACE("prompt of " + std::to_string(len));
    const auto alone = run_samples(model, options(64, 16, 256), prompt_of(len, 6, 1));
    int64_t used = 0;
    const auto four = run_samples(model, options(64, 16, 256), prompt_of(len, 6, 4), &used);
    // 37 tokens: 2 full blocks shared by all, the partial third copied per sample (2 + 4 = 6).
    // 32 tokens: both blocks shared, nothing copied.
    EXPECT_EQ(used, len == 37 ? 6 : 2);
    for (const auto& sample : four) EXPECT_EQ(sample, alone[0]);  // greedy: the copied KV is right
  }
}

TEST(EngineTest, SeededSamplesEqualSingleRequestsWithSeedPlusIndex) {
  auto weights = load_model(test::fixture_path("tiny/llama_untied"));
  ASSERT_TRUE(weights.has_value());
  ThreadPool pool(2);
  Transformer model(**weights, pool);
  RequestSpec spec = prompt_of(21, 12, 3);
  spec.sampling.temperature = 1.0f;
  spec.sampling.seed = 7;
  const auto samples = run_samples(model, options(64, 16, 256), spec);
  std::set<std::vector<int32_t>> distinct(samples.begin(), samples.end());
  EXPECT_GT(distinct.size(), 1u);  // the samples are independent draws
  for (int32_t i = 0; i < 3; ++i) {
    RequestSpec single = spec;
    single.n = 1;
    single.sampling.seed = 7u + static_cast<uint64_t>(i);
    EXPECT_EQ(run_samples(model, options(64, 16, 256), single)[0], samples[static_cast<size_t>(i)]) << i;
  }
}

TEST(EngineTest, SamplesSurviveAKvPoolTooSmallToForkThemAll) {
  auto weights = load_model(test::fixture_path("tiny/qwen3"));
  ASSERT_TRUE(weights.has_value());
  ThreadPool pool(2);
  Transformer model(**weights, pool);
  const auto alone = run_samples(model, options(64, 16, 256), prompt_of(37, 10, 1));
  // 5 blocks: the prompt takes 3, two forks take one each, the third sample must recompute, and
  // decoding needs preemption.
  const auto four = run_samples(model, options(5, 16, 256), prompt_of(37, 10, 4));
  for (const auto& sample : four) EXPECT_EQ(sample, alone[0]);
}

TEST(EngineTest, AbortEndsEverySampleAndFreesTheirBlocks) {
  auto weights = load_model(test::fixture_path("tiny/llama_tied"));
  ASSERT_TRUE(weights.has_value());
  ThreadPool pool(1);
  Transformer model(**weights, pool);
  for (int64_t when : {0, 1, 3}) {  // before the prompt is computed, right after the fork, later
    const auto samples = run_samples(model, options(64, 4, 256), prompt_of(9, 20, 3), nullptr, when);
    for (const auto& s : samples) EXPECT_LT(s.size(), 20u);
  }
}

TEST(EngineTest, OutOfRangeNIsAnErrorForThatRequestOnly) {
  auto weights = load_model(test::fixture_path("tiny/llama_tied"));
  ASSERT_TRUE(weights.has_value());
  ThreadPool pool(1);
  Transformer model(**weights, pool);
  Engine engine(model, options(64, 16, 256));
  const RequestId bad = engine.add(prompt_of(5, 2, 0));
  const RequestId good = engine.add(prompt_of(5, 2, 2));
  std::map<std::pair<RequestId, int32_t>, StepOutput> last;
  while (engine.has_work()) {
    for (auto& s : engine.step()) last[{s.id, s.index}] = s;
  }
  EXPECT_EQ(last[std::pair(bad, 0)].finish_reason, FinishReason::kError);
  EXPECT_NE(last[std::pair(bad, 0)].error.find("n must be in"), std::string::npos);
  EXPECT_EQ(last[std::pair(good, 0)].finish_reason, FinishReason::kLength);
  EXPECT_EQ(last[std::pair(good, 1)].finish_reason, FinishReason::kLength);
}

// Property: random requests with n of 1 to 3, random aborts of whole requests and of single
// samples, under a KV pool small enough to force failed forks and preemption. Every sample
// finishes exactly once and every block is free again.
TEST(EngineTest, RandomSamplesAndAbortsReturnEveryBlock) {
  auto weights = load_model(test::fixture_path("tiny/llama_untied"));
  ASSERT_TRUE(weights.has_value());
  ThreadPool pool(2);
  Transformer model(**weights, pool);
  std::mt19937 rng(77);
  for (int round = 0; round < 6; ++round) {
    Engine engine(model, options(12 + round, 4, 24));
    std::map<RequestId, std::vector<int>> finished;  // per request, per sample
    std::vector<RequestId> ids;
    for (int step = 0; step < 400 && (step < 40 || engine.has_work()); ++step) {
      if (step < 40 && rng() % 3 == 0) {
        RequestSpec spec = prompt_of(1 + rng() % 11, 1 + rng() % 8, static_cast<int32_t>(1 + rng() % 3));
        const RequestId id = engine.add(spec);
        finished[id].assign(static_cast<size_t>(spec.n), 0);
        ids.push_back(id);
      }
      if (!ids.empty() && rng() % 7 == 0) {
        const RequestId id = ids[rng() % ids.size()];
        if (rng() % 2 == 0) {
          engine.abort(id);
        } else {
          engine.abort(id, static_cast<int32_t>(rng() % 3));
        }
      }
      for (const StepOutput& out : engine.step()) {
        if (out.finished) ++finished.at(out.id).at(static_cast<size_t>(out.index));
      }
    }
    EXPECT_FALSE(engine.has_work());
    for (const auto& [id, samples] : finished) {
      for (int f : samples) EXPECT_EQ(f, 1) << "request " << id;
    }
    EXPECT_EQ(engine.block_pool().num_free_blocks(), engine.block_pool().num_blocks());
  }
}

// Prefix caching: a workload gives the same greedy tokens with caching on and off, and hits
// when on. Requests run one after another (so later ones find earlier ones' blocks) and all at
// once (so they share blocks while running).
void expect_caching_changes_nothing(Transformer& model, const Workload& w, int64_t min_hit_tokens) {
  for (bool together : {false, true}) {
    EngineOptions on = options(256, 4, 64), off = on;
    off.prefix_caching = false;
    const auto cached = run(model, on, w, together);
    const auto plain = run(model, off, w, together);
    EXPECT_EQ(cached, plain) << (together ? "together" : "one by one");
  }
  Engine engine(model, options(256, 4, 64));
  for (const auto& spec : w.specs) {
    engine.add(spec);
    while (engine.has_work()) engine.step();
  }
  EXPECT_GE(engine.kv_cache_manager().prefix_hit_tokens(), min_hit_tokens);
  EXPECT_EQ(engine.block_pool().num_free_blocks(), engine.block_pool().num_blocks());
}

TEST(EngineTest, PrefixCachingKeepsOutputsForSharedSystemPrompts) {
  auto weights = load_model(test::fixture_path("tiny/qwen2"));
  ASSERT_TRUE(weights.has_value());
  ThreadPool pool(2);
  Transformer model(**weights, pool);
  Workload w;
  for (int i = 0; i < 8; ++i) {
    RequestSpec s = prompt_of(41, 6, 1);  // the shared "system prompt" (10 full blocks of 4)
    for (int k = 0; k < 3 + i % 4; ++k) s.prompt.push_back(static_cast<int32_t>((i * 31 + k * 7) % 256));
    w.specs.push_back(s);
  }
  expect_caching_changes_nothing(model, w, 7 * 40);
}

TEST(EngineTest, PrefixCachingKeepsOutputsForMultiTurnAndMidBlockDivergence) {
  auto weights = load_model(test::fixture_path("tiny/llama_untied"));
  ASSERT_TRUE(weights.has_value());
  ThreadPool pool(2);
  Transformer model(**weights, pool);
  // Turn 2 resends turn 1's prompt and answer: learn the answer first, with caching off.
  RequestSpec turn1 = prompt_of(23, 9, 1);
  EngineOptions off = options(256, 4, 64);
  off.prefix_caching = false;
  const auto answer = run(model, off, Workload{{turn1}}, true)[0];
  RequestSpec turn2 = turn1;
  turn2.prompt.insert(turn2.prompt.end(), answer.begin(), answer.end());
  for (int32_t t : {5, 6, 7, 8, 9}) turn2.prompt.push_back(t);
  RequestSpec diverge = turn1;  // same first 21 tokens, then different: diverges inside block 6
  diverge.prompt[21] = 200;
  RequestSpec samples = turn1;
  samples.n = 3;
  expect_caching_changes_nothing(model, Workload{{turn1, turn2, diverge}}, 20 + 28);
  // n > 1 with caching: every sample equals the single greedy answer.
  EngineOptions on = options(256, 4, 64);
  for (const auto& s : run_samples(model, on, samples)) EXPECT_EQ(s, answer);
}

// Session context pool: a session's last turn survives a flood of other requests that would
// otherwise reuse its blocks, so the next turn is a prefix hit; a lone request larger than
// what the pins leave free still runs (pins give way).
TEST(EngineTest, SessionTurnsSurviveAFloodAndPinsNeverStarveARequest) {
  auto weights = load_model(test::fixture_path("tiny/qwen2"));
  ASSERT_TRUE(weights.has_value());
  ThreadPool pool(2);
  Transformer model(**weights, pool);
  auto hits_of_next_turn = [&](bool with_session) {
    EngineOptions o = options(24, 4, 64);  // 96 slots
    o.scheduler.session_max_share = 0.5;
    Engine engine(model, o);
    RequestSpec turn1 = prompt_of(33, 4, 1);
    if (with_session) turn1.session_id = "chat-1";
    engine.add(turn1);
    while (engine.has_work()) engine.step();
    for (int i = 0; i < 6; ++i) {  // unrelated requests cycle through the whole pool
      RequestSpec other = prompt_of(40, 8, 1);
      other.prompt[0] = static_cast<int32_t>(100 + i);
      engine.add(other);
      while (engine.has_work()) engine.step();
    }
    const int64_t before = engine.kv_cache_manager().prefix_hit_tokens();
    RequestSpec turn2 = turn1;
    turn2.prompt.push_back(7);
    engine.add(turn2);
    while (engine.has_work()) engine.step();
    return engine.kv_cache_manager().prefix_hit_tokens() - before;
  };
  EXPECT_EQ(hits_of_next_turn(true), 32);
  EXPECT_EQ(hits_of_next_turn(false), 0);

  EngineOptions o = options(24, 4, 64);
  o.scheduler.session_max_share = 0.5;
  Engine engine(model, o);
  RequestSpec pinned = prompt_of(45, 2, 1);  // pins 11 blocks
  pinned.session_id = "s";
  engine.add(pinned);
  while (engine.has_work()) engine.step();
  EXPECT_EQ(engine.kv_cache_manager().num_pinned_blocks(), 11);
  RequestSpec big = prompt_of(60, 20, 1);  // 80 tokens = 20 blocks: more than the 13 left
  big.prompt[0] = 255;
  std::vector<int32_t> out;
  engine.add(big);
  while (engine.has_work()) {
    for (const auto& s : engine.step()) out.insert(out.end(), s.new_tokens.begin(), s.new_tokens.end());
  }
  EXPECT_EQ(out.size(), 20u);
  EXPECT_EQ(engine.kv_cache_manager().num_sessions(), 0);
}

// vLLM's cache_salt: a prompt's cached blocks serve a later request only under the same salt
// (none counts as a salt of its own); the tokens are the same either way.
TEST(EngineTest, ACacheSaltSharesBlocksOnlyWithTheSameSalt) {
  auto weights = load_model(test::fixture_path("tiny/qwen2"));
  ASSERT_TRUE(weights.has_value());
  ThreadPool pool(2);
  Transformer model(**weights, pool);
  Engine engine(model, options(64, 4, 64));
  auto run = [&](const std::string& salt) {
    RequestSpec r = prompt_of(33, 4, 1);
    r.cache_salt = cache_salt_key(salt);
    const int64_t before = engine.kv_cache_manager().prefix_hit_tokens();
    std::vector<int32_t> out;
    engine.add(r);
    while (engine.has_work()) {
      for (const auto& s : engine.step()) out.insert(out.end(), s.new_tokens.begin(), s.new_tokens.end());
    }
    return std::pair{engine.kv_cache_manager().prefix_hit_tokens() - before, out};
  };
  const auto first = run("tenant-a");
  EXPECT_EQ(first.first, 0);
  const auto same = run("tenant-a");
  EXPECT_EQ(same.first, 32);  // 8 full blocks of 4
  EXPECT_EQ(run("tenant-b").first, 0);
  EXPECT_EQ(run("").first, 0);
  EXPECT_EQ(run("").first, 32);
  EXPECT_EQ(same.second, first.second);
  EXPECT_EQ(cache_salt_key(""), BlockHash{});
  EXPECT_NE(cache_salt_key("a"), cache_salt_key("b"));
}

// Everything one request's outputs carried: its tokens and logprobs, its prompt logprobs.
struct Collected {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  std::vector<int32_t> prompt_tokens;
  std::vector<float> prompt_logprobs;
  std::vector<int64_t> prompt_ranks;
  std::vector<std::vector<std::pair<int32_t, float>>> prompt_top;
  int64_t first_prompt_index = -1;
  std::string error;
};

// `warm` runs first in the same engine (its full blocks stay in the prefix cache).
std::vector<Collected> run_collecting(Transformer& model, const EngineOptions& o,
                                      const std::vector<RequestSpec>& specs,
                                      const std::vector<RequestSpec>& warm = {},
                                      size_t* most_rows = nullptr) {
  Engine engine(model, o);
  for (const RequestSpec& s : warm) engine.add(s);
  while (engine.has_work()) engine.step();
  std::vector<Collected> out(specs.size());
  std::map<RequestId, size_t> index;
  for (size_t i = 0; i < specs.size(); ++i) index[engine.add(specs[i])] = i;
  while (engine.has_work()) {
    size_t rows = 0;  // prompt logprobs this step, all requests together
    for (const StepOutput& s : engine.step()) {
      rows += s.prompt_tokens.size();
      if (most_rows != nullptr) *most_rows = std::max(*most_rows, rows);
      Collected& c = out[index.at(s.id)];
      c.tokens.insert(c.tokens.end(), s.new_tokens.begin(), s.new_tokens.end());
      c.logprobs.insert(c.logprobs.end(), s.logprobs.begin(), s.logprobs.end());
      if (!s.prompt_tokens.empty() && c.first_prompt_index < 0) c.first_prompt_index = s.prompt_logprobs_from;
      if (!s.prompt_tokens.empty()) {  // contiguous with what came before
        EXPECT_EQ(s.prompt_logprobs_from,
                  c.first_prompt_index + static_cast<int64_t>(c.prompt_tokens.size()));
      }
      c.prompt_tokens.insert(c.prompt_tokens.end(), s.prompt_tokens.begin(), s.prompt_tokens.end());
      c.prompt_logprobs.insert(c.prompt_logprobs.end(), s.prompt_logprobs.begin(), s.prompt_logprobs.end());
      c.prompt_ranks.insert(c.prompt_ranks.end(), s.prompt_ranks.begin(), s.prompt_ranks.end());
      c.prompt_top.insert(c.prompt_top.end(), s.prompt_top_logprobs.begin(), s.prompt_top_logprobs.end());
      if (!s.error.empty()) c.error = s.error;
    }
  }
  EXPECT_EQ(engine.block_pool().num_free_blocks(), engine.block_pool().num_blocks());
  return out;
}

// Prompt logprobs: the log-probability of each prompt token from the second on, given the ones
// before it, is the logprob decoding gave that token (the rows are batch-invariant), in chunks
// of any size, with other requests in the batch, and with a cached prefix in the pool.
TEST(EngineTest, PromptLogprobsAreTheLogprobsDecodingGave) {
  auto weights = load_model(test::fixture_path("tiny/qwen2"));
  ASSERT_TRUE(weights.has_value());
  ThreadPool pool(2);
  Transformer model(**weights, pool);
  const Workload w = random_workload(6, 256, 30, 1, 17);
  // Decode each prompt 20 tokens greedily, with the chosen tokens' logprobs.
  std::vector<RequestSpec> decode = w.specs;
  for (RequestSpec& s : decode) {
    s.limits.max_tokens = 20;
    s.sampling.logprobs = 0;
  }
  const auto decoded = run_collecting(model, options(512, 16, 64), decode);
  // The prompt + those tokens, scored as a prompt (after the same decoding in the same engine,
  // so the pool's prefix cache holds their blocks: prompt logprobs must not start from it).
  std::vector<RequestSpec> score;
  for (size_t i = 0; i < decode.size(); ++i) {
    RequestSpec s = decode[i];
    s.prompt.insert(s.prompt.end(), decoded[i].tokens.begin(), decoded[i].tokens.end());
    s.sampling.logprobs.reset();
    s.sampling.prompt_logprobs = 3;
    s.limits.max_tokens = 1;
    score.push_back(s);
  }
  for (const int64_t budget : {int64_t{7}, int64_t{64}, int64_t{256}}) {
    const auto scored = run_collecting(model, options(512, 16, budget), score, decode);
    for (size_t i = 0; i < score.size(); ++i) {
      const Collected& c = scored[i];
      ASSERT_TRUE(c.error.empty()) << c.error;
      const auto& prompt = score[i].prompt;
      ASSERT_EQ(c.first_prompt_index, 1);
      ASSERT_EQ(c.prompt_tokens, std::vector<int32_t>(prompt.begin() + 1, prompt.end()))
          << "budget " << budget;
      const size_t head = w.specs[i].prompt.size() - 1;  // the entries of the decoded tokens
      for (size_t t = 0; t < decoded[i].tokens.size(); ++t)
        EXPECT_NEAR(c.prompt_logprobs[head + t], decoded[i].logprobs[t], 1e-5) << i << " " << t;
      for (size_t t = 0; t < c.prompt_tokens.size(); ++t) {
        ASSERT_EQ(c.prompt_top[t].size(), 3u);
        EXPECT_LE(c.prompt_logprobs[t], c.prompt_top[t][0].second + 1e-6f);
        EXPECT_GE(c.prompt_ranks[t], 1);
        // Greedy picked the decoded tokens: rank 1.
        if (t >= head) {
          EXPECT_EQ(c.prompt_ranks[t], 1) << i << " " << t;
        }
      }
    }
  }
  // Many such requests at once: at most kPromptLogprobsChunk rows each and
  // kPromptLogprobsRowsPerStep in all per step, and the same logprobs.
  std::vector<RequestSpec> many_scored;
  for (int k = 0; k < 3; ++k) many_scored.insert(many_scored.end(), score.begin(), score.end());
  const auto alone = run_collecting(model, options(512, 16, 64), score);
  size_t most_rows = 0;
  const auto together = run_collecting(model, options(1024, 16, 2048), many_scored, {}, &most_rows);
  EXPECT_LE(most_rows, static_cast<size_t>(kPromptLogprobsRowsPerStep));
  EXPECT_GT(most_rows, static_cast<size_t>(kPromptLogprobsChunk));  // several requests share a step
  for (size_t i = 0; i < many_scored.size(); ++i) {
    EXPECT_EQ(together[i].prompt_tokens, alone[i % score.size()].prompt_tokens);
    EXPECT_EQ(together[i].prompt_logprobs, alone[i % score.size()].prompt_logprobs);
  }
  // n > 1 and disaggregated prefill are refused for prompt logprobs.
  RequestSpec many = score[0];
  many.n = 2;
  const auto refused = run_collecting(model, options(512, 16, 64), {many, score[1]});
  EXPECT_EQ(refused[1].prompt_tokens.size(), score[1].prompt.size() - 1);  // the other one is served
  EXPECT_NE(refused[0].error.find("prompt_logprobs"), std::string::npos)
      << refused[0].error << " tokens " << refused[0].tokens.size();
}

}  // namespace
}  // namespace inferd
