// Beam search over a fake engine whose "model" gives each prefix a fixed distribution: width 1
// is greedy decoding; a width that holds every sequence is exhaustive search, checked against
// enumerating all of them; each step's requests are what the engine should run; errors and
// cancellation end the search once.
#include "engine/beam_search.h"

#include <gtest/gtest.h>

#include <cmath>
#include <deque>
#include <map>
#include <random>

namespace inferd {
namespace {

constexpr int32_t kVocab = 3;

// log-softmax of pseudo-random logits seeded by the prefix.
std::vector<float> distribution(const std::vector<int32_t>& prefix) {
  uint64_t h = 1469598103934665603ull;
  for (int32_t t : prefix) h = (h ^ static_cast<uint64_t>(t + 7)) * 1099511628211ull;
  std::mt19937_64 rng(h);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> logits(kVocab);
  float max = -1e30f;
  for (float& l : logits) max = std::max(max, l = normal(rng));
  double sum = 0;
  for (float l : logits) sum += std::exp(l - max);
  for (float& l : logits) l = l - max - static_cast<float>(std::log(sum));
  return logits;
}

// Queues submissions; pump() answers them as the engine would (one token, the top k).
struct FakeEngine {
  struct Job {
    RequestId id;
    RequestSpec spec;
    BeamSearch::OutputCallback callback;
  };
  std::deque<Job> queue;
  std::vector<RequestSpec> submitted;
  std::vector<RequestId> aborted;
  RequestId next = 1;
  std::string fail_with;  // non-empty: the next answer is this error

  BeamSearch::Submit submit() {
    return [this](RequestSpec spec, BeamSearch::OutputCallback cb) {
      submitted.push_back(spec);
      queue.push_back({next, std::move(spec), std::move(cb)});
      return next++;
    };
  }
  BeamSearch::Abort abort() {
    return [this](RequestId id) { aborted.push_back(id); };
  }
  // Answers one queued request; false when none is queued.
  bool answer_one() {
    if (queue.empty()) return false;
    Job job = std::move(queue.front());
    queue.pop_front();
    StepOutput out;
    out.id = job.id;
    out.finished = true;
    if (!fail_with.empty()) {
      out.error = fail_with;
      out.internal = true;
      fail_with.clear();
      job.callback(out);
      return true;
    }
    const std::vector<float> lp = distribution(job.spec.prompt);
    std::vector<std::pair<int32_t, float>> top;
    for (int32_t t = 0; t < kVocab; ++t) top.emplace_back(t, lp[static_cast<size_t>(t)]);
    std::stable_sort(top.begin(), top.end(),
                     [](const auto& a, const auto& b) { return a.second > b.second; });
    top.resize(std::min<size_t>(top.size(), static_cast<size_t>(*job.spec.sampling.logprobs)));
    out.new_tokens = {top[0].first};
    out.logprobs = {top[0].second};
    out.top_logprobs = {top};
    out.finish_reason = FinishReason::kLength;
    job.callback(out);
    return true;
  }
  void pump() {
    while (answer_one()) {
    }
  }
};

struct Result {
  bool done = false;
  std::vector<Beam> beams;
  std::string error;
};

std::shared_ptr<BeamSearch> run(FakeEngine& engine, const BeamSearchParams& params, Result* result,
                                std::vector<int32_t> prompt = {1, 2}) {
  RequestSpec spec;
  spec.prompt = std::move(prompt);
  spec.sampling.temperature = 0.7f;  // replaced: beam search does not sample
  spec.priority = 3;
  return BeamSearch::start(spec, params, engine.submit(), engine.abort(),
                           [result](std::vector<Beam> beams, const std::string& error, bool) {
                             EXPECT_FALSE(result->done) << "done is called once";
                             result->done = true;
                             result->beams = std::move(beams);
                             result->error = error;
                           });
}

// Every sequence beam search can end with: those ending at their first stop token, and those of
// max_tokens without one.
void enumerate(const std::vector<int32_t>& prompt, const BeamSearchParams& p, Beam b,
               std::vector<Beam>* out) {
  if (b.complete || static_cast<int64_t>(b.tokens.size()) == p.max_tokens) {
    out->push_back(b);
    return;
  }
  std::vector<int32_t> prefix = prompt;
  prefix.insert(prefix.end(), b.tokens.begin(), b.tokens.end());
  const std::vector<float> lp = distribution(prefix);
  for (int32_t t = 0; t < kVocab; ++t) {
    Beam next = b;
    next.tokens.push_back(t);
    next.logprob += lp[static_cast<size_t>(t)];
    next.complete = std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), t) != p.stop_token_ids.end();
    enumerate(prompt, p, next, out);
  }
}

TEST(BeamSearchTest, WidthOneIsGreedyDecoding) {
  FakeEngine engine;
  BeamSearchParams p;
  p.width = 1;
  p.max_tokens = 6;
  Result r;
  auto search = run(engine, p, &r);
  engine.pump();
  ASSERT_TRUE(r.done);
  ASSERT_EQ(r.beams.size(), 1u);
  std::vector<int32_t> prefix = {1, 2}, greedy;
  double logprob = 0;
  for (int i = 0; i < 6; ++i) {
    const auto lp = distribution(prefix);
    const auto t = static_cast<int32_t>(std::max_element(lp.begin(), lp.end()) - lp.begin());
    greedy.push_back(t);
    prefix.push_back(t);
    logprob += lp[static_cast<size_t>(t)];
  }
  EXPECT_EQ(r.beams[0].tokens, greedy);
  EXPECT_NEAR(r.beams[0].logprob, logprob, 1e-5);
  EXPECT_FALSE(r.beams[0].complete);
  // Each step one request: the prompt and the beam so far, one token, the top 2 log-probabilities,
  // the prompt's own fields kept.
  ASSERT_EQ(engine.submitted.size(), 6u);
  for (size_t i = 0; i < 6; ++i) {
    const RequestSpec& s = engine.submitted[i];
    std::vector<int32_t> want = {1, 2};
    want.insert(want.end(), greedy.begin(), greedy.begin() + static_cast<std::ptrdiff_t>(i));
    EXPECT_EQ(s.prompt, want);
    EXPECT_EQ(s.limits.max_tokens, 1);
    EXPECT_TRUE(s.limits.ignore_eos);
    EXPECT_EQ(s.sampling.logprobs, 2);
    EXPECT_EQ(s.sampling.temperature, 0.0f);
    EXPECT_EQ(s.priority, 3);
  }
}

// With a width as large as the number of sequences nothing is pruned: the answer is the best
// sequences of all, by the length-penalised score, whatever the stop tokens and the penalty.
TEST(BeamSearchTest, AWidthThatHoldsEverySequenceIsExhaustiveSearch) {
  for (const auto& stops : {std::vector<int32_t>{}, std::vector<int32_t>{0}, std::vector<int32_t>{1, 2}}) {
    for (float penalty : {0.0f, 1.0f, 2.5f}) {
      for (int64_t max_tokens : {1, 2, 4}) {
        BeamSearchParams p;
        p.width = 81;  // 3^4
        p.max_tokens = max_tokens;
        p.length_penalty = penalty;
        p.stop_token_ids = stops;
        FakeEngine engine;
        Result r;
        auto search = run(engine, p, &r, {2, 0, 1});
        engine.pump();
        ASSERT_TRUE(r.done);
        std::vector<Beam> all;
        enumerate({2, 0, 1}, p, Beam{}, &all);
        std::stable_sort(all.begin(), all.end(),
                         [&](const Beam& a, const Beam& b) { return a.score(penalty) > b.score(penalty); });
        ASSERT_EQ(r.beams.size(), all.size());
        for (size_t i = 0; i < all.size(); ++i) {
          EXPECT_NEAR(r.beams[i].score(penalty), all[i].score(penalty), 1e-4) << i;
          EXPECT_EQ(r.beams[i].complete,
                    r.beams[i].tokens.size() < static_cast<size_t>(max_tokens) ||
                        std::find(stops.begin(), stops.end(), r.beams[i].tokens.back()) != stops.end());
        }
        EXPECT_EQ(r.beams[0].tokens, all[0].tokens);
      }
    }
  }
}

TEST(BeamSearchTest, AnswersTheWidthBestSortedAndDistinct) {
  FakeEngine engine;
  BeamSearchParams p;
  p.width = 4;
  p.max_tokens = 5;
  p.length_penalty = 1.0f;
  p.stop_token_ids = {2};
  Result r;
  auto search = run(engine, p, &r);
  engine.pump();
  ASSERT_TRUE(r.done);
  ASSERT_EQ(r.beams.size(), 4u);
  for (size_t i = 0; i < r.beams.size(); ++i) {
    // The cumulative log-probability is that of the beam's own tokens.
    std::vector<int32_t> prefix = {1, 2};
    double logprob = 0;
    for (int32_t t : r.beams[i].tokens) {
      logprob += distribution(prefix)[static_cast<size_t>(t)];
      prefix.push_back(t);
    }
    EXPECT_NEAR(r.beams[i].logprob, logprob, 1e-5);
    if (i > 0) {
      EXPECT_GE(r.beams[i - 1].score(1.0f), r.beams[i].score(1.0f));
    }
    for (size_t j = 0; j < i; ++j) EXPECT_NE(r.beams[i].tokens, r.beams[j].tokens);
    // A beam ends at its first stop token.
    for (size_t k = 0; k + 1 < r.beams[i].tokens.size(); ++k) EXPECT_NE(r.beams[i].tokens[k], 2);
  }
  // At most width requests per step, each asking for 2 x width alternatives.
  for (const RequestSpec& s : engine.submitted) EXPECT_EQ(s.sampling.logprobs, 8);

  // With logprobs: each token's own and the top k (more than 2 x width asks the engine for k).
  p.logprobs = 2;
  p.width = 1;
  FakeEngine with;
  Result l;
  auto logged = run(with, p, &l);
  with.pump();
  ASSERT_TRUE(l.done);
  const Beam& b = l.beams.at(0);
  ASSERT_EQ(b.token_logprobs.size(), b.tokens.size());
  ASSERT_EQ(b.top_logprobs.size(), b.tokens.size());
  double sum = 0;
  std::vector<int32_t> prefix = {1, 2};
  for (size_t k = 0; k < b.tokens.size(); ++k) {
    const auto lp = distribution(prefix);
    EXPECT_FLOAT_EQ(b.token_logprobs[k], lp[static_cast<size_t>(b.tokens[k])]);
    ASSERT_EQ(b.top_logprobs[k].size(), 2u);
    EXPECT_EQ(b.top_logprobs[k][0].first, b.tokens[k]);  // width 1: the likeliest
    EXPECT_GE(b.top_logprobs[k][0].second, b.top_logprobs[k][1].second);
    sum += b.token_logprobs[k];
    prefix.push_back(b.tokens[k]);
  }
  EXPECT_NEAR(sum, b.logprob, 1e-5);
  p.logprobs = 5;
  FakeEngine wide;
  Result w;
  auto more = run(wide, p, &w);
  wide.pump();
  EXPECT_EQ(wide.submitted.at(0).sampling.logprobs, 5);
}

TEST(BeamSearchTest, AnErrorOrACancelEndsTheSearchOnce) {
  FakeEngine engine;
  BeamSearchParams p;
  p.width = 3;
  p.max_tokens = 8;
  Result r;
  auto search = run(engine, p, &r);
  engine.answer_one();  // step 1 (one beam)
  ASSERT_EQ(engine.queue.size(), 3u);
  engine.fail_with = "out of KV blocks";
  engine.answer_one();
  ASSERT_TRUE(r.done);
  EXPECT_EQ(r.error, "out of KV blocks");
  EXPECT_TRUE(r.beams.empty());
  EXPECT_EQ(engine.aborted.size(), 2u);  // the step's other requests
  engine.pump();                         // late answers change nothing
  search->cancel();

  FakeEngine other;
  Result c;
  auto cancelled = run(other, p, &c);
  other.answer_one();
  cancelled->cancel();
  ASSERT_TRUE(c.done);
  EXPECT_EQ(c.error, "aborted");
  EXPECT_EQ(other.aborted.size(), 3u);
  const size_t submitted = other.submitted.size();
  other.pump();
  EXPECT_EQ(other.submitted.size(), submitted) << "no step after a cancel";
}

}  // namespace
}  // namespace inferd
