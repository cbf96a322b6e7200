#include "engine/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <random>

#include "engine/mask_prefetcher.h"
#include "grammar/grammar_test_util.h"

namespace inferd {
namespace {

TEST(SamplerTest, GreedyPicksArgmaxLowestOnTies) {
  Sampler s(SamplingParams{});
  const std::vector<float> logits{0.1f, 3.0f, -1.0f, 3.0f};
  EXPECT_EQ(s.sample(logits), 1);
}

TEST(SamplerTest, SameSeedSameSequence) {
  SamplingParams p{1.0f, 0, 1.0f, 42};
  const std::vector<float> logits{0.0f, 0.5f, 1.0f, 0.2f, -0.3f};
  Sampler a(p), b(p);
  std::vector<int32_t> xa, xb;
  for (int i = 0; i < 50; ++i) {
    xa.push_back(a.sample(logits));
    xb.push_back(b.sample(logits));
  }
  EXPECT_EQ(xa, xb);
  p.seed = 43;
  Sampler c(p);
  std::vector<int32_t> xc;
  for (int i = 0; i < 50; ++i) xc.push_back(c.sample(logits));
  EXPECT_NE(xa, xc);
}

TEST(SamplerTest, FrequenciesFollowSoftmax) {
  Sampler s(SamplingParams{1.0f, 0, 1.0f, 7});
  const std::vector<float> logits{0.0f, std::log(3.0f)};  // p = 1/4, 3/4
  int ones = 0;
  const int n = 20000;
  for (int i = 0; i < n; ++i) ones += s.sample(logits);
  EXPECT_NEAR(static_cast<double>(ones) / n, 0.75, 0.02);
}

TEST(SamplerTest, WholeDistributionFrequenciesFollowSoftmaxAcrossBlocks) {
  // 2,500 tokens: the draw finds a block of the weights' sums, then the token inside it. Five
  // tokens hold the mass, in three blocks and on both sides of a block boundary (2047 / 2048);
  // every third other token is ruled out (-inf) and must never come.
  const std::vector<int32_t> heavy{10, 1030, 2047, 2048, 2499};
  std::vector<float> logits(2500, -30.0f);
  for (size_t i = 0; i < logits.size(); i += 3) logits[i] = -std::numeric_limits<float>::infinity();
  for (size_t j = 0; j < heavy.size(); ++j) logits[static_cast<size_t>(heavy[j])] = std::log(1.0f + j);
  for (float temperature : {1.0f, 0.5f}) {
    Sampler s(SamplingParams{temperature, 0, 1.0f, 5});
    std::map<int32_t, int> count;
    const int n = 30000;
    for (int i = 0; i < n; ++i) ++count[s.sample(logits)];
    double total = 0;
    for (size_t j = 0; j < heavy.size(); ++j) total += std::pow(1.0 + j, 1.0 / temperature);
    for (size_t j = 0; j < heavy.size(); ++j)
      EXPECT_NEAR(static_cast<double>(count[heavy[j]]) / n, std::pow(1.0 + j, 1.0 / temperature) / total,
                  0.015)
          << "token " << heavy[j] << " temperature " << temperature;
    for (const auto& [token, c] : count)
      EXPECT_NE(logits[static_cast<size_t>(token)], -std::numeric_limits<float>::infinity()) << token;
  }
}

TEST(SamplerTest, TopKAndTopPRestrictSupport) {
  const std::vector<float> logits{1.0f, 0.9f, 0.8f, -5.0f, 0.7f};
  Sampler k2(SamplingParams{1.0f, 2, 1.0f, 1});
  std::map<int32_t, int> seen;
  for (int i = 0; i < 2000; ++i) seen[k2.sample(logits)]++;
  EXPECT_EQ(seen.size(), 2u);
  EXPECT_TRUE(seen.count(0) && seen.count(1));
  Sampler p(SamplingParams{1.0f, 0, 0.01f, 1});  // only the top token carries 1% mass
  for (int i = 0; i < 100; ++i) EXPECT_EQ(p.sample(logits), 0);
}

// The sampling rule written the plain way: every candidate sorted (logit descending, id
// ascending on ties), softmax over top_k (all when 0), the nucleus whose running share reaches
// top_p, then min_p, then one uniform draw over the kept weights. top_p's share divides by the
// sum of all kept weights in vocabulary order when there is no top_k, in sorted order with one.
int32_t reference_draw(std::vector<float> logits, const SamplingParams& p, std::mt19937_64& rng) {
  std::vector<std::pair<float, int32_t>> c;
  for (size_t i = 0; i < logits.size(); ++i)
    if (logits[i] != -std::numeric_limits<float>::infinity())
      c.emplace_back(logits[i] / p.temperature, static_cast<int32_t>(i));
  std::vector<std::pair<float, int32_t>> by_id = c;
  std::sort(c.begin(), c.end(), [](const auto& a, const auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  });
  size_t keep = p.top_k > 0 ? std::min(c.size(), static_cast<size_t>(p.top_k)) : c.size();
  const float max_logit = c[0].first;
  double total = 0;
  if (keep < c.size()) {
    for (size_t i = 0; i < keep; ++i) total += std::exp(c[i].first - max_logit);
  } else {
    for (const auto& x : by_id) total += std::exp(x.first - max_logit);
  }
  for (auto& x : c) x.first = std::exp(x.first - max_logit);
  if (p.top_p < 1.0f) {
    double cumulative = 0;
    for (size_t i = 0; i < keep; ++i) {
      cumulative += c[i].first / total;
      if (cumulative >= p.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  if (p.min_p > 0.0f) {
    size_t k = 1;
    while (k < keep && c[k].first >= p.min_p) ++k;
    keep = k;
  }
  total = 0;
  for (size_t i = 0; i < keep; ++i) total += c[i].first;
  const double r = std::uniform_real_distribution<double>(0.0, total)(rng);
  double acc = 0;
  for (size_t i = 0; i < keep; ++i) {
    acc += c[i].first;
    if (r < acc) return c[i].second;
  }
  return c[keep - 1].second;
}

TEST(SamplerTest, TopPTopKAndMinPDrawWhatTheFullSortDraws) {
  // Random vocabularies of odd sizes (one past the prefix sizes the sampler sorts in), spread
  // or peaked logits, ties (logits on a coarse grid), masked tokens (-inf), every combination of
  // the three filters: the same token as the plain rule, draw after draw, for the same seed.
  std::mt19937 gen(2026);
  int cases = 0;
  for (size_t n : {1, 2, 7, 255, 256, 257, 2049, 2050, 16385, 49153}) {
    for (int shape = 0; shape < 4; ++shape) {
      std::vector<float> logits(n);
      std::normal_distribution<float> normal(0.0f, shape == 1 ? 8.0f : 2.0f);
      for (auto& l : logits) {
        l = normal(gen);
        if (shape == 2) l = std::round(l * 2.0f) / 2.0f;  // many ties
      }
      if (shape == 3) {
        std::bernoulli_distribution masked(0.4);
        for (size_t i = 1; i < n; ++i)
          if (masked(gen)) logits[i] = -std::numeric_limits<float>::infinity();
      }
      for (float top_p : {1.0f, 0.999f, 0.95f, 0.5f, 0.1f}) {
        for (float min_p : {0.0f, 0.02f, 0.3f}) {
          for (int32_t top_k : {0, 40}) {
            if (top_p == 1.0f && min_p == 0.0f && top_k == 0) continue;  // the unsorted path
            SamplingParams p{shape == 1 ? 1.5f : 0.8f, top_k, top_p, 99};
            p.min_p = min_p;
            Sampler s(p);
            std::mt19937_64 rng(99);
            for (int draw = 0; draw < 5; ++draw) {
              ASSERT_EQ(s.sample(logits), reference_draw(logits, p, rng))
                  << "n=" << n << " shape=" << shape << " top_p=" << top_p << " min_p=" << min_p
                  << " top_k=" << top_k << " draw " << draw;
            }
            ++cases;
          }
        }
      }
    }
  }
  EXPECT_EQ(cases, 10 * 4 * (5 * 3 * 2 - 1));
}

TEST(SamplerTest, ValidateRanges) {
  EXPECT_FALSE((SamplingParams{-1.0f, 0, 1.0f, {}}).validate().is_ok());
  EXPECT_FALSE((SamplingParams{1.0f, -1, 1.0f, {}}).validate().is_ok());
  EXPECT_FALSE((SamplingParams{1.0f, 0, 0.0f, {}}).validate().is_ok());
  EXPECT_TRUE((SamplingParams{0.7f, 40, 0.9f, {}}).validate().is_ok());
}

TEST(SamplerTest, RepetitionPenaltyAsInHuggingFace) {
  SamplingParams p;
  p.repetition_penalty = 2.0f;
  Sampler s(p);
  // Token 0 leads but was in the prompt: 3.0 / 2 = 1.5 < 2.0. Token 2 is negative and seen:
  // -1 * 2 = -2. Greedy then picks token 1.
  const std::vector<float> logits{3.0f, 2.0f, -1.0f};
  const std::vector<int32_t> prompt{0, 2};
  EXPECT_EQ(s.sample(logits, prompt, {}).token, 1);
  EXPECT_EQ(Sampler(SamplingParams{}).sample(logits, prompt, {}).token, 0);  // off: untouched
}

TEST(SamplerTest, PresenceAndFrequencyPenaltiesCountOutputOnly) {
  const std::vector<float> logits{2.0f, 1.5f};
  SamplingParams p;
  p.frequency_penalty = 0.3f;
  const std::vector<int32_t> out_once{0}, out_twice{0, 0};
  EXPECT_EQ(Sampler(p).sample(logits, {}, out_once).token, 0);   // 2.0 - 0.3 > 1.5
  EXPECT_EQ(Sampler(p).sample(logits, {}, out_twice).token, 1);  // 2.0 - 0.6 < 1.5
  p.frequency_penalty = 0;
  p.presence_penalty = 0.6f;
  EXPECT_EQ(Sampler(p).sample(logits, {}, out_once).token, 1);   // 1.4 < 1.5
  EXPECT_EQ(Sampler(p).sample(logits, out_twice, {}).token, 0);  // prompt tokens are not penalised
}

// One sampler over many calls, each with another history (as a request's steps and a speculative
// verification's rollbacks give it): the greedy token is the argmax of the logits penalised as the
// formulas say, computed afresh here, so no call sees a count of an earlier one. Out-of-range ids
// in the history are ignored.
TEST(SamplerTest, PenaltiesOverManyCallsMatchAFreshComputation) {
  const size_t vocab = 1001;
  std::mt19937 gen(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int32_t> token(-2, 40), length(0, 30);
  SamplingParams p;
  p.repetition_penalty = 1.3f;
  p.presence_penalty = 0.4f;
  p.frequency_penalty = 0.25f;
  Sampler sampler(p);
  int changed = 0;
  for (int round = 0; round < 400; ++round) {
    std::vector<float> logits(vocab);
    for (size_t i = 0; i < vocab; ++i) logits[i] = normal(gen) + (i <= 40 ? 2.5f : 0.0f);
    std::vector<int32_t> prompt(static_cast<size_t>(length(gen))), output(static_cast<size_t>(length(gen)));
    for (auto& t : prompt) t = token(gen);
    for (auto& t : output) t = token(gen);
    if (round % 7 == 0) output.push_back(static_cast<int32_t>(vocab) + 3);
    std::vector<int32_t> counts(vocab, 0);
    std::vector<bool> seen(vocab, false);
    for (int32_t t : prompt) {
      if (t >= 0) seen[static_cast<size_t>(t)] = true;
    }
    for (int32_t t : output) {
      if (t >= 0 && static_cast<size_t>(t) < vocab) {
        seen[static_cast<size_t>(t)] = true;
        ++counts[static_cast<size_t>(t)];
      }
    }
    std::vector<float> expected = logits;
    for (size_t i = 0; i < vocab; ++i) {
      if (seen[i]) expected[i] = expected[i] > 0 ? expected[i] / 1.3f : expected[i] * 1.3f;
      if (counts[i] > 0) expected[i] -= 0.4f + 0.25f * static_cast<float>(counts[i]);
    }
    const auto best =
        static_cast<int32_t>(std::max_element(expected.begin(), expected.end()) - expected.begin());
    const auto raw = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    ASSERT_EQ(sampler.sample(logits, prompt, output).token, best) << "round " << round;
    changed += best != raw;
  }
  EXPECT_GT(changed, 100);  // the penalties decided the token in many rounds
}

// Every token ruled out (a row of -inf) at a temperature: the first token, as greedy picks it.
TEST(SamplerTest, WholeDistributionOfRuledOutTokensGivesTheFirst) {
  SamplingParams p{1.0f, 0, 1.0f, 5};
  Sampler s(p);
  for (size_t n : {3u, 1500u}) {
    const std::vector<float> logits(n, -std::numeric_limits<float>::infinity());
    EXPECT_EQ(s.sample(logits), 0) << n;
  }
}

TEST(SamplerTest, MinPDropsUnlikelyTokens) {
  SamplingParams p{1.0f, 0, 1.0f, 3};
  p.min_p = 0.5f;
  Sampler s(p);
  // Probabilities proportional to 1, 0.6, 0.1: min_p 0.5 keeps tokens 0 and 1 only.
  const std::vector<float> logits{0.0f, std::log(0.6f), std::log(0.1f)};
  std::map<int32_t, int> seen;
  for (int i = 0; i < 3000; ++i) seen[s.sample(logits)]++;
  EXPECT_EQ(seen.count(2), 0u);
  EXPECT_NEAR(seen[1] / 3000.0, 0.6 / 1.6, 0.03);
}

TEST(SamplerTest, LogprobsOfRawDistribution) {
  SamplingParams p;
  p.logprobs = 2;
  const std::vector<float> logits{1.0f, 3.0f, 2.0f};
  const auto r = Sampler(p).sample(logits, {}, {});
  const double z = std::log(std::exp(1.0) + std::exp(3.0) + std::exp(2.0));
  EXPECT_EQ(r.token, 1);
  EXPECT_NEAR(r.logprob, 3.0 - z, 1e-5);
  ASSERT_EQ(r.top_logprobs.size(), 2u);
  EXPECT_EQ(r.top_logprobs[0].first, 1);
  EXPECT_EQ(r.top_logprobs[1].first, 2);
  EXPECT_NEAR(r.top_logprobs[1].second, 2.0 - z, 1e-5);
  SamplingParams bad;
  bad.logprobs = 21;
  EXPECT_FALSE(bad.validate().is_ok());
  bad.logprobs = -1;
  EXPECT_FALSE(bad.validate().is_ok());
  bad.logprobs.reset();
  bad.min_p = 1.5f;
  EXPECT_FALSE(bad.validate().is_ok());
}

TEST(SamplerTest, TopLogprobsAreTheSortedBestAndLogZIsTheSoftmaxs) {
  // Vocabularies up to Qwen's size, with ties (a coarse grid) and ascending runs (each token
  // better than the last: every one enters the list): the k best by logit, ties by id, as a
  // full sort gives them, and log-probabilities as the double softmax gives them.
  std::mt19937 gen(17);
  for (size_t n : {1, 3, 20, 21, 1025, 49153, 151936}) {
    for (int shape = 0; shape < 3; ++shape) {
      std::vector<float> logits(n);
      std::normal_distribution<float> normal(0.0f, 3.0f);
      for (size_t i = 0; i < n; ++i) {
        logits[i] = shape == 2 ? static_cast<float>(i % 4096) * 0.01f : normal(gen);
        if (shape == 1) logits[i] = std::round(logits[i]);
      }
      const float top = *std::max_element(logits.begin(), logits.end());
      double sum = 0;
      for (float x : logits) sum += std::exp(static_cast<double>(x) - top);
      const double log_z = top + std::log(sum);
      std::vector<int32_t> ids(n);
      for (size_t i = 0; i < n; ++i) ids[i] = static_cast<int32_t>(i);
      std::sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) {
        const float la = logits[static_cast<size_t>(a)], lb = logits[static_cast<size_t>(b)];
        return la > lb || (la == lb && a < b);
      });
      for (int32_t k : {0, 1, 5, 20}) {
        SamplingParams p;
        p.logprobs = k;
        const SampleResult r = Sampler(p).sample(logits, {}, {});
        EXPECT_EQ(r.token, ids[0]);
        EXPECT_NEAR(r.logprob, logits[static_cast<size_t>(ids[0])] - log_z, 1e-5) << "n=" << n;
        ASSERT_EQ(r.top_logprobs.size(), std::min(n, static_cast<size_t>(k))) << "n=" << n;
        for (size_t j = 0; j < r.top_logprobs.size(); ++j) {
          EXPECT_EQ(r.top_logprobs[j].first, ids[j])
              << "n=" << n << " shape=" << shape << " k=" << k << " j=" << j;
          EXPECT_NEAR(r.top_logprobs[j].second, logits[static_cast<size_t>(ids[j])] - log_z, 1e-5);
        }
      }
    }
  }
}

TEST(SamplerTest, LogitBiasShiftsTheDistributionNotTheLogprobs) {
  const std::vector<float> logits{2.0f, 1.0f, 0.0f};
  SamplingParams greedy;
  greedy.logprobs = 0;
  greedy.logit_bias = {{0, -100.0f}, {2, 1.5f}};
  const auto r = Sampler(greedy).sample(logits, {}, {});
  EXPECT_EQ(r.token, 2);  // 0 banned; 0 + 1.5 beats 1
  const double z = std::log(std::exp(2.0) + std::exp(1.0) + 1.0);
  EXPECT_NEAR(r.logprob, 0.0 - z, 1e-5);  // the model's own distribution
  // Sampled: a bias of ln 3 on token 1 of two equal logits makes it 3/4 likely.
  SamplingParams random;
  random.temperature = 1.0f;
  random.seed = 5;
  random.logit_bias = {{1, std::log(3.0f)}};
  Sampler s(random);
  int ones = 0;
  for (int i = 0; i < 4000; ++i) ones += s.sample(std::vector<float>{0.0f, 0.0f}, {}, {}).token;
  EXPECT_NEAR(ones / 4000.0, 0.75, 0.03);
  SamplingParams bad;
  bad.logit_bias = {{1, -101.0f}};
  EXPECT_FALSE(bad.validate().is_ok());
}

// Masks filled ahead by MaskPrefetcher (on its thread, as the engine does during the forward
// pass) give the same tokens as masks computed at sampling time, including rows that are
// prefetched in a step that does not sample them (a prefill chunk) and rows never prefetched.
TEST(SamplerTest, PrefetchedGrammarMasksSampleTheSameTokens) {
  std::mt19937 rng(5);
  auto vocab = test::byte_vocab(test::random_tokens(rng, 200, "{}[]\",: abcxyz019.-truefalsn", 5));
  auto grammar = any_json_grammar();
  const size_t num_logits = static_cast<size_t>(vocab->size()) + 7;  // a padded row, as models have
  SamplingParams p;
  p.temperature = 1.0f;
  p.grammar = GrammarConstraint{grammar, vocab};
  constexpr int kRows = 6;
  std::vector<Sampler> ahead, inline_;
  for (int i = 0; i < kRows; ++i) {
    p.seed = 100 + static_cast<uint64_t>(i);
    ahead.emplace_back(p);
    inline_.emplace_back(p);
  }
  MaskPrefetcher prefetcher;
  std::vector<Sampler*> rows;
  std::vector<std::vector<int32_t>> out_ahead(kRows), out_inline(kRows);
  std::vector<float> logits(num_logits);
  std::normal_distribution<float> noise(0.0f, 2.0f);
  for (int step = 0; step < 40; ++step) {
    rows.clear();
    for (int i = 0; i < kRows; ++i) {
      if (i != step % kRows) rows.push_back(&ahead[static_cast<size_t>(i)]);  // one row is not prefetched
    }
    prefetcher.start(&rows, num_logits);
    prefetcher.wait();
    for (int i = 0; i < kRows; ++i) {
      if (step % 5 == 0 && i == 1) continue;  // prefetched, not sampled this step
      for (float& x : logits) x = noise(rng);
      const SampleResult a =
          ahead[static_cast<size_t>(i)].sample(logits, {}, out_ahead[static_cast<size_t>(i)]);
      const SampleResult b =
          inline_[static_cast<size_t>(i)].sample(logits, {}, out_inline[static_cast<size_t>(i)]);
      ASSERT_EQ(a.token, b.token) << "row " << i << " step " << step;
      ASSERT_FALSE(a.dead_end);
      out_ahead[static_cast<size_t>(i)].push_back(a.token);
      out_inline[static_cast<size_t>(i)].push_back(b.token);
    }
  }
  EXPECT_EQ(out_ahead, out_inline);
}

// min_tokens: the end tokens are masked while the output is shorter, on every sampling path.
TEST(SamplerTest, MinTokensHoldsBackTheEndTokensUntilTheOutputIsLongEnough) {
  std::vector<float> logits(300, 0.0f);
  logits[5] = 9.0f;  // an end token, the model's favourite
  logits[7] = 8.0f;  // another end token
  logits[11] = 4.0f;
  for (const float temperature : {0.0f, 0.7f}) {
    for (const int32_t top_k : {0, 3}) {
      SamplingParams p;
      p.temperature = temperature;
      p.top_k = top_k;
      p.seed = 3;
      p.min_tokens = 3;
      p.end_token_ids = {5, 7};
      Sampler s(p);
      std::vector<int32_t> output;
      for (int i = 0; i < 3; ++i) {
        const auto r = s.sample(logits, {}, output);
        EXPECT_FALSE(r.dead_end);
        EXPECT_NE(r.token, 5) << "temperature " << temperature << " output " << output.size();
        EXPECT_NE(r.token, 7) << "temperature " << temperature << " output " << output.size();
        output.push_back(r.token);
      }
      if (temperature == 0.0f) {
        EXPECT_EQ(output, (std::vector<int32_t>{11, 11, 11}));
        // Long enough: the end tokens are back (greedy takes 5 at once).
        EXPECT_EQ(s.sample(logits, {}, output).token, 5);
      }
    }
  }
  SamplingParams bad;
  bad.min_tokens = -1;
  EXPECT_FALSE(bad.validate().is_ok());
}

TEST(SamplerTest, AllowedTokenIdsAreTheOnlyCandidates) {
  std::mt19937 rng(11);
  std::normal_distribution<float> dist(0.0f, 2.0f);
  std::vector<float> logits(1001);
  for (auto& x : logits) x = dist(rng);
  const std::vector<int32_t> allowed{3, 17, 500, 1000};
  int32_t best = allowed[0];
  for (int32_t id : allowed) {
    if (logits[static_cast<size_t>(id)] > logits[static_cast<size_t>(best)]) best = id;
  }
  SamplingParams greedy;
  greedy.allowed_token_ids = allowed;
  EXPECT_EQ(Sampler(greedy).sample(logits, {}, {}).token, best);
  for (const float top_p : {1.0f, 0.9f}) {
    SamplingParams p;
    p.temperature = 1.0f;
    p.top_p = top_p;
    p.seed = 9;
    p.allowed_token_ids = allowed;
    Sampler s(p);
    std::map<int32_t, int> seen;
    for (int i = 0; i < 400; ++i) ++seen[s.sample(logits, {}, {}).token];
    for (const auto& [token, count] : seen)
      EXPECT_NE(std::find(allowed.begin(), allowed.end(), token), allowed.end()) << token;
    if (top_p == 1.0f) {
      EXPECT_GE(seen.size(), 2u);  // a draw among them, not one token
    }
  }
}

// bad_words: a one-token word is always masked, a longer word's last token only right after the
// rest of it in the output.
TEST(SamplerTest, BadWordsMaskTheirLastTokenAfterTheirPrefix) {
  std::vector<float> logits(50, 0.0f);
  logits[7] = 6.0f;
  logits[9] = 5.0f;
  logits[4] = 1.0f;
  SamplingParams p;
  p.bad_words = {{7}, {1, 2, 9}};
  Sampler s(p);
  EXPECT_EQ(s.sample(logits, {}, {}).token, 9);  // 7 banned; 9 only after 1, 2
  EXPECT_EQ(s.sample(logits, {}, std::vector<int32_t>{2}).token, 9);
  EXPECT_EQ(s.sample(logits, {}, std::vector<int32_t>{1, 2}).token, 4);
  EXPECT_EQ(s.sample(logits, {}, std::vector<int32_t>{5, 1, 2}).token, 4);
  EXPECT_EQ(s.sample(logits, {}, std::vector<int32_t>{1, 2, 3}).token, 9);
  // The prompt is not the output: a prefix there does not count.
  EXPECT_EQ(s.sample(logits, std::vector<int32_t>{1, 2}, {}).token, 9);
  SamplingParams empty;
  empty.bad_words = {{}};
  EXPECT_FALSE(empty.validate().is_ok());
}

TEST(SamplerTest, MasksThatRuleOutEveryTokenAreADeadEnd) {
  const std::vector<float> logits{1.0f, 3.0f, 2.0f, 0.5f};
  for (const float temperature : {0.0f, 1.0f}) {
    SamplingParams p;
    p.temperature = temperature;
    p.seed = 1;
    p.allowed_token_ids = {2};
    p.min_tokens = 1;
    p.end_token_ids = {2};
    Sampler s(p);
    const auto r = s.sample(logits, {}, {});
    EXPECT_TRUE(r.dead_end);
    EXPECT_NE(s.dead_end_error().find("allowed_token_ids"), std::string::npos);
    // One token later the end token is allowed again: no dead end.
    const auto next = s.sample(logits, {}, std::vector<int32_t>{0});
    EXPECT_FALSE(next.dead_end);
    EXPECT_EQ(next.token, 2);
    EXPECT_TRUE(s.dead_end_error().empty());
  }
}

}  // namespace
}  // namespace inferd
