// Speculative decoding by prompt lookup: the proposer, --speculative-config, and the engine's
// verification, which must give exactly the tokens (and logprobs) of decoding without drafts:
// greedy, seeded sampling with penalties, stop tokens inside a draft, batches, preemption and the
// prefix cache, while drafts are really proposed, accepted and rejected.
#include <gtest/gtest.h>

#include <cstdio>
#include <functional>
#include <map>
#include <random>

#include "engine/engine.h"
#include "engine/ngram_proposer.h"
#include "engine/speculative_config.h"
#include "model/model_loader.h"
#include "test_support.h"

namespace inferd {
namespace {

std::vector<int32_t> propose(const std::vector<int32_t>& prompt, const std::vector<int32_t>& output,
                             NgramOptions o, int64_t max_tokens = 100) {
  std::vector<int32_t> draft{99};  // cleared by the proposer
  propose_ngram(prompt, output, o, max_tokens, &draft);
  return draft;
}

TEST(NgramProposerTest, TheLongestSuffixMatchesAtItsLatestOccurrence) {
  const NgramOptions o{3, 1, 3};
  // Suffix "5 6 7" occurs at 0 (then 1 2) and "6 7" later at 9 (then 8 8): the 3-gram wins.
  EXPECT_EQ(propose({5, 6, 7, 1, 2, 3, 4, 0, 0, 6, 7, 8, 8}, {5, 6, 7}, o), (std::vector<int32_t>{1, 2, 3}));
  // "1 2" twice: the latest occurrence (then 9) wins over the first (then 3).
  EXPECT_EQ(propose({1, 2, 3, 1, 2, 9, 4}, {1, 2}, NgramOptions{2, 2, 2}), (std::vector<int32_t>{9, 4}));
  // The continuation stops at the end of the history (it may run into the suffix itself).
  EXPECT_EQ(propose({4, 4, 4}, {}, NgramOptions{5, 2, 2}), (std::vector<int32_t>{4}));
}

TEST(NgramProposerTest, NoDraftBelowTheMinimumOrPastTheLimits) {
  EXPECT_TRUE(propose({1, 2, 3, 4}, {5}, NgramOptions{4, 1, 3}).empty());       // 5 never seen before
  EXPECT_TRUE(propose({1, 2, 3, 9, 2, 3}, {}, NgramOptions{4, 3, 3}).empty());  // only "2 3" matches
  EXPECT_EQ(propose({1, 2, 3, 9, 2, 3}, {}, NgramOptions{4, 2, 3}), (std::vector<int32_t>{9, 2, 3}));
  EXPECT_EQ(propose({1, 2, 3, 4, 5, 6, 1, 2}, {}, NgramOptions{2, 2, 2}), (std::vector<int32_t>{3, 4}));
  EXPECT_EQ(propose({1, 2, 3, 4, 5, 6, 1, 2}, {}, NgramOptions{5, 2, 2}, 3), (std::vector<int32_t>{3, 4, 5}));
  EXPECT_TRUE(propose({1, 2, 3, 1, 2}, {}, NgramOptions{5, 2, 2}, 0).empty());
  EXPECT_TRUE(propose({7}, {}, NgramOptions{5, 1, 4}).empty());
}

std::vector<int32_t> from_prediction(const std::vector<int32_t>& prediction,
                                     const std::vector<int32_t>& output, int64_t* cursor, int32_t k = 3,
                                     int64_t max_tokens = 100) {
  std::vector<int32_t> draft{99};  // cleared by the proposer
  propose_from_prediction(prediction, output, k, max_tokens, cursor, &draft);
  return draft;
}

// Predicted outputs: the prediction's tokens after the longest match of the output's end (4
// tokens down to 1), the first at or after the cursor, else the first anywhere.
TEST(PredictionProposerTest, FollowsThePredictionFromWhereTheOutputMatchesIt) {
  const std::vector<int32_t> prediction = {1, 2, 3, 4, 5, 1, 2, 7, 8, 9};
  int64_t cursor = 0;
  EXPECT_EQ(from_prediction(prediction, {1}, &cursor), (std::vector<int32_t>{2, 3, 4}));
  EXPECT_EQ(cursor, 1);
  EXPECT_EQ(from_prediction(prediction, {1, 2, 3, 4}, &cursor), (std::vector<int32_t>{5, 1, 2}));
  EXPECT_EQ(cursor, 4);
  // "1 2" occurs at 0 and at 5: from the cursor on, the second.
  EXPECT_EQ(from_prediction(prediction, {6, 1, 2}, &cursor), (std::vector<int32_t>{7, 8, 9}));
  EXPECT_EQ(cursor, 7);
  // The longer match wins over the cursor: "5 1 2" only at 4..7.
  cursor = 9;
  EXPECT_EQ(from_prediction(prediction, {5, 1, 2}, &cursor), (std::vector<int32_t>{7, 8, 9}));
  // Behind the cursor when nothing matches after it; the draft stops at the prediction's end.
  cursor = 8;
  EXPECT_EQ(from_prediction(prediction, {3}, &cursor), (std::vector<int32_t>{4, 5, 1}));
  EXPECT_EQ(cursor, 3);
  EXPECT_EQ(from_prediction(prediction, {8}, &cursor), (std::vector<int32_t>{9}));
  // No token of the output's end in the prediction, no room, or no output yet: no draft.
  EXPECT_TRUE(from_prediction(prediction, {42}, &cursor).empty());
  EXPECT_TRUE(from_prediction(prediction, {1}, &cursor, 3, 0).empty());
  EXPECT_TRUE(from_prediction(prediction, {}, &cursor).empty());
  EXPECT_EQ(from_prediction(prediction, {1}, &cursor, 5, 2).size(), 2u);
}

TEST(SpeculativeConfigTest, ParsesVllmsFieldsAndRefusesWhatItDoesNotDo) {
  auto off = parse_speculative_config("");
  ASSERT_TRUE(off.has_value());
  EXPECT_FALSE(off->enabled);
  auto on = parse_speculative_config(
      R"({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 5,
          "disable_by_batch_size": 8})");
  ASSERT_TRUE(on.has_value()) << on.status().message();
  EXPECT_TRUE(on->enabled);
  EXPECT_EQ(on->ngram.num_speculative_tokens, 3);
  EXPECT_EQ(on->ngram.prompt_lookup_min, 1);
  EXPECT_EQ(on->ngram.prompt_lookup_max, 5);
  EXPECT_EQ(on->disable_by_batch_size, 8);
  auto defaults = parse_speculative_config(R"({"method": "ngram"})");
  ASSERT_TRUE(defaults.has_value());
  EXPECT_EQ(defaults->ngram.num_speculative_tokens, SpeculativeOptions{}.ngram.num_speculative_tokens);
  auto only_max = parse_speculative_config(R"({"method": "ngram", "prompt_lookup_max": 1})");
  ASSERT_TRUE(only_max.has_value()) << only_max.status().message();
  EXPECT_EQ(only_max->ngram.prompt_lookup_min, 1);
  const std::pair<const char*, const char*> bad[] = {
      {R"({"method": "eagle", "model": "x.gguf"})", "eagle"},
      {R"({"method": "draft_model"})", "model"},
      {R"({"method": "draft_model", "model": 3})", "model"},
      {R"({"method": "draft_model", "model": "x.gguf", "prompt_lookup_max": 3})", "prompt_lookup_max"},
      {R"({"method": "ngram", "model": "x.gguf"})", "model"},
      {R"({"num_speculative_tokens": 3})", "method"},
      {R"({"method": "ngram", "num_speculative_tokens": 0})", "num_speculative_tokens"},
      {R"({"method": "ngram", "num_speculative_tokens": "5"})", "num_speculative_tokens"},
      {R"({"method": "ngram", "prompt_lookup_min": 4, "prompt_lookup_max": 2})", "prompt_lookup_max"},
      {R"({"method": "ngram", "lookahead": 2})", "lookahead"},
      {R"({"method": "ngram", "disable_by_batch_size": -1})", "disable_by_batch_size"},
      {R"({"method": "ngram", "num_speculative_tokens": 99999999999})", "num_speculative_tokens"},
      {"{\"method\": ", "JSON"},
      {"[1, 2]", "JSON"},
  };
  auto draft = parse_speculative_config(
      R"({"method": "draft_model", "model": "small.gguf", "num_speculative_tokens": 3, "disable_by_batch_size": 2})");
  ASSERT_TRUE(draft.has_value()) << draft.status().message();
  EXPECT_TRUE(draft->enabled);
  EXPECT_EQ(draft->method, SpeculativeMethod::kDraftModel);
  EXPECT_EQ(draft->draft_model, "small.gguf");
  EXPECT_EQ(draft->ngram.num_speculative_tokens, 3);
  EXPECT_EQ(draft->disable_by_batch_size, 2);
  EXPECT_EQ(on->method, SpeculativeMethod::kNgram);
  for (const auto& [json, needle] : bad) {
    auto r = parse_speculative_config(json);
    ASSERT_FALSE(r.has_value()) << json;
    EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().message();
  }
}

struct Outcome {
  std::vector<std::vector<int32_t>> tokens;
  std::vector<std::vector<float>> logprobs;
  EngineStats stats;
  int64_t preemptions = 0;
  int64_t predicted = 0, accepted_predicted = 0;  // drafts from predictions, and those kept
};

// Runs the specs all at once (or one after another) and collects each one's tokens.
// `inspect` sees the engine after the run (the draft proposer's counters).
Outcome run(Transformer& model, const EngineOptions& o, const std::vector<RequestSpec>& specs,
            bool together = true, const std::function<void(const Engine&)>& inspect = {}) {
  Engine engine(model, o);
  Outcome r;
  r.tokens.resize(specs.size());
  r.logprobs.resize(specs.size());
  std::map<RequestId, size_t> index;
  auto drain = [&] {
    while (engine.has_work()) {
      for (const StepOutput& s : engine.step()) {
        const size_t i = index.at(s.id);
        r.tokens[i].insert(r.tokens[i].end(), s.new_tokens.begin(), s.new_tokens.end());
        r.logprobs[i].insert(r.logprobs[i].end(), s.logprobs.begin(), s.logprobs.end());
        r.predicted += s.predicted_tokens;
        r.accepted_predicted += s.accepted_predicted_tokens;
        EXPECT_TRUE(s.error.empty()) << s.error;
      }
    }
  };
  for (size_t i = 0; i < specs.size(); ++i) {
    index[engine.add(specs[i])] = i;
    if (!together) drain();
  }
  drain();
  EXPECT_EQ(engine.block_pool().num_free_blocks(), engine.block_pool().num_blocks());
  r.stats = engine.stats();
  r.preemptions = engine.scheduler().num_preemptions();
  if (inspect) inspect(engine);
  return r;
}

EngineOptions options(bool speculate, int64_t blocks = 256) {
  EngineOptions o;
  o.num_kv_blocks = blocks;
  o.block_size = 16;
  o.scheduler.max_num_batched_tokens = 256;
  o.scheduler.max_prefill_tokens = 256;
  o.scheduler.max_model_len = 512;
  o.scheduler.speculative.enabled = speculate;
  o.scheduler.speculative.ngram = {5, 1, 4};
  o.scheduler.speculative.disable_by_batch_size = 64;
  return o;
}

// Prompts that repeat themselves (a document and its copy begun), as summaries and edits do, and
// random ones.
std::vector<RequestSpec> workload(int n, uint32_t seed, int64_t max_tokens) {
  std::mt19937 rng(seed);
  std::vector<RequestSpec> specs;
  for (int i = 0; i < n; ++i) {
    RequestSpec s;
    const int64_t len = 8 + static_cast<int64_t>(rng() % 40);
    for (int64_t k = 0; k < len; ++k) s.prompt.push_back(static_cast<int32_t>(rng() % 256));
    if (i % 2 == 0) {
      const std::vector<int32_t> doc = s.prompt;
      s.prompt.insert(s.prompt.end(), doc.begin(), doc.begin() + static_cast<int64_t>(doc.size()) / 2);
    }
    s.limits.max_tokens = max_tokens - static_cast<int64_t>(rng() % 8);
    specs.push_back(s);
  }
  return specs;
}

class SpeculativeEngineTest : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    weights_ = load_model(test::fixture_path(std::string("tiny/") + GetParam()));
    ASSERT_TRUE(weights_.has_value()) << weights_.status().message();
    model_ = std::make_unique<Transformer>(**weights_, pool_);
  }
  // Speculation on gives exactly the run without it, and drafts were proposed, accepted and
  // rejected (so both the kept and the rolled-back KV paths ran).
  Outcome expect_same_as_without(const std::vector<RequestSpec>& specs, EngineOptions on,
                                 bool together = true) {
    EngineOptions off = on;
    off.scheduler.speculative.enabled = false;
    const Outcome plain = run(*model_, off, specs, together);
    const Outcome spec = run(*model_, on, specs, together);
    EXPECT_EQ(spec.tokens, plain.tokens);
    EXPECT_EQ(spec.logprobs, plain.logprobs);
    EXPECT_EQ(plain.stats.spec_drafts, 0);
    EXPECT_GT(spec.stats.spec_accepted_tokens, 0);
    EXPECT_GT(spec.stats.spec_draft_tokens, spec.stats.spec_accepted_tokens);
    if (!together) {
      EXPECT_LT(spec.stats.steps, plain.stats.steps);  // accepted drafts save steps
    }
    return spec;
  }
  ThreadPool pool_{2};
  Expected<std::unique_ptr<ModelWeights>> weights_ = invalid_argument("not loaded");
  std::unique_ptr<Transformer> model_;
};

TEST_P(SpeculativeEngineTest, GreedyTokensAreThoseOfDecodingWithoutDrafts) {
  expect_same_as_without(workload(8, 1, 40), options(true), /*together=*/false);
  expect_same_as_without(workload(12, 2, 40), options(true));
}

TEST_P(SpeculativeEngineTest, SeededSamplingWithPenaltiesAndLogprobsIsUnchanged) {
  auto specs = workload(8, 3, 40);
  for (size_t i = 0; i < specs.size(); ++i) {
    SamplingParams& p = specs[i].sampling;
    p.temperature = 0.1f;  // the tiny random models' logits are flat: a low one keeps some drafts
    p.top_p = 0.95f;
    p.seed = 100 + i;
    p.logprobs = 2;
    if (i % 2 == 1) {
      p.repetition_penalty = 1.1f;
      p.frequency_penalty = 0.2f;
    }
  }
  expect_same_as_without(specs, options(true));
}

TEST_P(SpeculativeEngineTest, AStopTokenInsideADraftEndsTheRequestThere) {
  auto specs = workload(8, 4, 40);
  const Outcome plain = run(*model_, options(false), specs);
  // Each request stops at a token it would emit in its second half.
  for (size_t i = 0; i < specs.size(); ++i) {
    const auto& t = plain.tokens[i];
    specs[i].limits.stop_token_ids = {t[t.size() / 2 + i % 3]};
  }
  const Outcome spec = expect_same_as_without(specs, options(true));
  for (size_t i = 0; i < specs.size(); ++i)
    EXPECT_EQ(spec.tokens[i].back(), specs[i].limits.stop_token_ids[0]);
}

TEST_P(SpeculativeEngineTest, PreemptionAndThePrefixCacheKeepTheTokens) {
  // A pool too small for every request at once: drafts' blocks are taken back on preemption.
  const Outcome r = expect_same_as_without(workload(12, 5, 48), options(true, /*blocks=*/12));
  EXPECT_GT(r.preemptions, 0);
  // The same prompts again: blocks the first ones cached (never a rejected draft's content)
  // serve the second ones.
  auto specs = workload(6, 6, 40);
  const auto twice = [&] {
    auto both = specs;
    both.insert(both.end(), specs.begin(), specs.end());
    return both;
  }();
  const Outcome spec = expect_same_as_without(twice, options(true), /*together=*/false);
  for (size_t i = 0; i < specs.size(); ++i) EXPECT_EQ(spec.tokens[i], spec.tokens[i + specs.size()]);
}

TEST_P(SpeculativeEngineTest, NoDraftsAboveTheBatchSizeLimit) {
  // Eight requests admitted in one step, all running to the same length: eight run at every step.
  std::vector<RequestSpec> specs = workload(8, 7, 24);
  for (RequestSpec& s : specs) {
    s.prompt.resize(8);
    s.prompt.insert(s.prompt.end(), s.prompt.begin(), s.prompt.end());
    s.limits.max_tokens = 24;
  }
  EngineOptions o = options(true);
  o.scheduler.speculative.disable_by_batch_size = 7;
  const Outcome above = run(*model_, o, specs);
  EXPECT_EQ(above.stats.spec_drafts, 0);
  o.scheduler.speculative.disable_by_batch_size = 8;
  const Outcome at = expect_same_as_without(specs, o);
  EXPECT_EQ(above.tokens, at.tokens);
}

// OpenAI's predicted outputs: a prediction drafts with or without a speculative config, and the
// tokens (and logprobs) are those of decoding without it: a right prediction has its drafts kept
// (fewer steps), a wrong one rejected; greedy and seeded sampling.
TEST_P(SpeculativeEngineTest, PredictionsDraftAndLeaveTheTokensAsTheyWere) {
  for (bool seeded : {false, true}) {
    auto specs = workload(6, 8, 32);
    for (size_t i = 0; i < specs.size(); ++i) {
      if (!seeded) continue;
      specs[i].sampling.temperature = 0.1f;
      specs[i].sampling.seed = 7 + i;
      specs[i].sampling.logprobs = 1;
    }
    const Outcome plain = run(*model_, options(false), specs, /*together=*/false);
    EXPECT_EQ(plain.predicted, 0);
    auto predicted = specs;
    for (size_t i = 0; i < predicted.size(); ++i) {
      std::vector<int32_t> p = plain.tokens[i];
      if (i % 2 == 1) {  // half of them wrong from the middle on
        for (size_t k = p.size() / 2; k < p.size(); ++k) p[k] = (p[k] + 1) % 256;
      }
      predicted[i].prediction = std::make_shared<const std::vector<int32_t>>(std::move(p));
    }
    for (bool speculate : {false, true}) {  // without a speculative config, and beside prompt lookup
      const Outcome with = run(*model_, options(speculate), predicted, /*together=*/false);
      EXPECT_EQ(with.tokens, plain.tokens);
      EXPECT_EQ(with.logprobs, plain.logprobs);
      EXPECT_GT(with.accepted_predicted, 0);
      EXPECT_GT(with.predicted, with.accepted_predicted);  // the wrong halves' drafts were rejected
      EXPECT_LT(with.stats.steps, plain.stats.steps);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Tiny, SpeculativeEngineTest, ::testing::Values("llama_untied", "qwen2", "qwen3"));

// Speculative decoding with a draft model: the target's tokens (and logprobs) are those of
// decoding without drafts whatever the draft proposes; a draft that is the target itself has
// every draft accepted (its KV, rolled back and caught up, is right); a draft of the same weights
// in bfloat16 agrees mostly; an unrelated one rarely.
struct DraftPair {
  const char* target;
  const char* draft;
};

class DraftModelEngineTest : public ::testing::TestWithParam<DraftPair> {
 protected:
  void SetUp() override {
    target_weights_ = load_model(test::fixture_path(std::string("tiny/") + GetParam().target));
    ASSERT_TRUE(target_weights_.has_value()) << target_weights_.status().message();
    draft_weights_ = load_model(test::fixture_path(std::string("tiny/") + GetParam().draft));
    ASSERT_TRUE(draft_weights_.has_value()) << draft_weights_.status().message();
    target_ = std::make_unique<Transformer>(**target_weights_, pool_);
    draft_ = std::make_unique<Transformer>(**draft_weights_, pool_);
  }
  EngineOptions drafting(Transformer* draft, int32_t k = 4, int64_t blocks = 256) const {
    EngineOptions o = options(true, blocks);
    o.scheduler.speculative.method = SpeculativeMethod::kDraftModel;
    o.scheduler.speculative.draft_model = "draft";
    o.scheduler.speculative.ngram.num_speculative_tokens = k;
    o.draft_model = draft;
    return o;
  }
  // The run with drafts gives the run without, and the draft's blocks all come back.
  Outcome expect_same_as_without(const std::vector<RequestSpec>& specs, const EngineOptions& on,
                                 bool together = true) {
    EngineOptions off = options(false, on.num_kv_blocks);
    const Outcome plain = run(*target_, off, specs, together);
    const Outcome spec = run(*target_, on, specs, together, [&](const Engine& engine) {
      draft_evictions_ = engine.drafter()->evictions();
      EXPECT_EQ(engine.drafter()->num_sequences(), 0);
      EXPECT_EQ(engine.drafter()->num_free_blocks(), on.num_kv_blocks);
    });
    EXPECT_EQ(spec.tokens, plain.tokens);
    EXPECT_EQ(spec.logprobs, plain.logprobs);
    EXPECT_GT(spec.stats.spec_draft_tokens, 0);
    EXPECT_GT(spec.stats.spec_draft_passes, 0);
    if (!together && spec.stats.spec_accepted_tokens > 0) {
      EXPECT_LT(spec.stats.steps, plain.stats.steps);
    }
    return spec;
  }
  ThreadPool pool_{2};
  Expected<std::unique_ptr<ModelWeights>> target_weights_ = invalid_argument("not loaded");
  Expected<std::unique_ptr<ModelWeights>> draft_weights_ = invalid_argument("not loaded");
  std::unique_ptr<Transformer> target_, draft_;
  int64_t draft_evictions_ = 0;  // of the last expect_same_as_without
};

TEST_P(DraftModelEngineTest, GreedyTokensAreThoseOfDecodingWithoutDrafts) {
  const Outcome alone =
      expect_same_as_without(workload(6, 11, 40), drafting(draft_.get()), /*together=*/false);
  const Outcome together = expect_same_as_without(workload(10, 12, 40), drafting(draft_.get(), 3));
  std::printf("[ draft %s for %s ] accepted %lld of %lld drafts (alone), %lld of %lld (together)\n",
              GetParam().draft, GetParam().target, static_cast<long long>(alone.stats.spec_accepted_tokens),
              static_cast<long long>(alone.stats.spec_draft_tokens),
              static_cast<long long>(together.stats.spec_accepted_tokens),
              static_cast<long long>(together.stats.spec_draft_tokens));
}

TEST_P(DraftModelEngineTest, SeededSamplingWithPenaltiesAndLogprobsIsUnchanged) {
  auto specs = workload(8, 13, 40);
  for (size_t i = 0; i < specs.size(); ++i) {
    SamplingParams& p = specs[i].sampling;
    p.temperature = 0.1f;
    p.top_p = 0.95f;
    p.seed = 200 + i;
    p.logprobs = 2;
    if (i % 2 == 1) p.repetition_penalty = 1.1f;
  }
  expect_same_as_without(specs, drafting(draft_.get()));
}

TEST_P(DraftModelEngineTest, TheTargetAsItsOwnDraftHasEveryDraftAccepted) {
  // Greedy drafts of the target itself are its own next tokens: all accepted, which only holds
  // when the draft's KV was kept, rolled back and caught up right step after step (and the
  // engine's batch invariance makes the draft's rows those of the verification).
  for (const bool together : {false, true}) {
    const Outcome r = expect_same_as_without(workload(6, 14, 48), drafting(target_.get(), 5), together);
    EXPECT_EQ(r.stats.spec_accepted_tokens, r.stats.spec_draft_tokens) << "together " << together;
  }
}

TEST_P(DraftModelEngineTest, SmallPoolsPreemptAndTheDraftGivesBlocksBack) {
  // 12 blocks of 16 tokens for 12 requests: the target preempts and the draft's pool (as many
  // blocks) runs out, so idle sequences give theirs back and some steps draft nothing.
  const Outcome r = expect_same_as_without(workload(12, 15, 48), drafting(draft_.get(), 4, /*blocks=*/12));
  EXPECT_GT(r.preemptions, 0);
  EXPECT_GT(draft_evictions_, 0);
}

TEST_P(DraftModelEngineTest, AStopTokenInsideADraftEndsTheRequestThere) {
  auto specs = workload(6, 16, 40);
  const Outcome plain = run(*target_, options(false), specs);
  for (size_t i = 0; i < specs.size(); ++i) {
    const auto& t = plain.tokens[i];
    specs[i].limits.stop_token_ids = {t[t.size() / 2 + i % 3]};
  }
  const Outcome spec = expect_same_as_without(specs, drafting(target_.get()));
  for (size_t i = 0; i < specs.size(); ++i)
    EXPECT_EQ(spec.tokens[i].back(), specs[i].limits.stop_token_ids[0]);
}

TEST(DraftModelOptionsTest, TheDraftModelAndTheMethodGoTogether) {
  EngineOptions o;
  o.scheduler.speculative.enabled = true;
  o.scheduler.speculative.method = SpeculativeMethod::kDraftModel;
  o.scheduler.speculative.draft_model = "x";
  EXPECT_TRUE(o.validate().is_ok());  // the caller loads it next
  o.scheduler.speculative.draft_model.clear();
  EXPECT_NE(o.validate().message().find("needs a model"), std::string::npos);
  // A draft model given while speculation is off, or by prompt lookup.
  ThreadPool pool(1);
  auto weights = load_model(test::fixture_path("tiny/qwen2"));
  ASSERT_TRUE(weights.has_value());
  Transformer draft(**weights, pool);
  EngineOptions n;
  n.draft_model = &draft;
  EXPECT_NE(n.validate().message().find("draft model is off"), std::string::npos);
  n.scheduler.speculative.enabled = true;
  EXPECT_NE(n.validate().message().find("draft model is off"), std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(Tiny, DraftModelEngineTest,
                         ::testing::Values(DraftPair{"qwen2", "qwen2_bf16"}, DraftPair{"qwen3", "qwen3_bf16"},
                                           DraftPair{"llama_tied", "llama_bf16"},
                                           DraftPair{"qwen2", "llama_untied"}),
                         [](const ::testing::TestParamInfo<DraftPair>& info) {
                           return std::string(info.param.target) + "_by_" + info.param.draft;
                         });

}  // namespace
}  // namespace inferd
