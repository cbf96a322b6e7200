// The serving benchmark's statistics on synthetic timings with known answers, its arrival
// process, and its datasets (real token text of the default model's vocabulary).
#include "bench/bench_stats.h"

#include <gtest/gtest.h>

#include <fstream>
#include <numeric>

#include "bench/bench_dataset.h"
#include "bench/serve_benchmark.h"
#include "model/default_model.h"
#include "model/model_loader.h"
#include "test_support.h"
#include "tokenizer/tokenizer_loader.h"

namespace inferd {
namespace {

TEST(BenchStatsTest, PercentilesInterpolateLikeNumpy) {
  std::vector<double> v(100);
  std::iota(v.begin(), v.end(), 1.0);  // 1..100
  EXPECT_DOUBLE_EQ(percentile(v, 0), 1);
  EXPECT_DOUBLE_EQ(percentile(v, 50), 50.5);
  EXPECT_NEAR(percentile(v, 90), 90.1, 1e-12);
  EXPECT_NEAR(percentile(v, 99), 99.01, 1e-12);
  EXPECT_DOUBLE_EQ(percentile(v, 100), 100);
  EXPECT_DOUBLE_EQ(percentile({7.0}, 99), 7);
  EXPECT_DOUBLE_EQ(percentile({}, 50), 0);
  const Distribution d = summarize({4, 1, 3, 2});  // unsorted in, sorted inside
  EXPECT_DOUBLE_EQ(d.mean, 2.5);
  EXPECT_DOUBLE_EQ(d.p50, 2.5);
  EXPECT_DOUBLE_EQ(d.max, 4);
  EXPECT_NEAR(d.stddev, std::sqrt(1.25), 1e-12);  // population deviation
  EXPECT_EQ(d.count, 4);
}

RequestRecord record(double start, double ttft, double latency, int64_t out, std::vector<double> itl) {
  RequestRecord r;
  r.success = true;
  r.start = start;
  r.ttft = ttft;
  r.latency = latency;
  r.prompt_tokens = 10;
  r.output_tokens = out;
  r.itl = std::move(itl);
  return r;
}

TEST(BenchStatsTest, RunSummaryUsesVllmDefinitions) {
  std::vector<RequestRecord> rs = {
      record(0.0, 0.2, 1.2, 11, {0.1, 0.1}),  // TPOT (1.2 - 0.2) / 10 = 0.1
      record(0.5, 0.4, 2.4, 5, {0.5, 0.5}),   // TPOT 2.0 / 4 = 0.5
      record(1.0, 0.3, 0.3, 1, {}),           // one token: no TPOT
  };
  RequestRecord failed;
  failed.start = 2.0;
  failed.latency = 1.0;
  failed.error = "HTTP 500";
  rs.push_back(failed);
  Slo slo;
  slo.ttft = 0.35;
  slo.tpot = 0.2;
  const BenchSummary s = summarize_run(rs, 4.0, slo);
  EXPECT_EQ(s.completed, 3);
  EXPECT_EQ(s.failed, 1);
  EXPECT_EQ(s.total_input_tokens, 30);
  EXPECT_EQ(s.total_output_tokens, 17);
  EXPECT_DOUBLE_EQ(s.request_throughput, 0.75);
  EXPECT_DOUBLE_EQ(s.output_throughput, 17 / 4.0);
  EXPECT_DOUBLE_EQ(s.total_token_throughput, 47 / 4.0);
  EXPECT_EQ(s.tpot.count, 2);
  EXPECT_NEAR(s.tpot.mean, 0.3, 1e-12);
  EXPECT_EQ(s.itl.count, 4);
  EXPECT_NEAR(s.itl.p50, 0.3, 1e-12);
  EXPECT_NEAR(s.ttft.p50, 0.3, 1e-12);
  EXPECT_NEAR(s.e2el.max, 2.4, 1e-12);
  EXPECT_EQ(s.good_requests, 2);  // the first (ttft 0.2, tpot 0.1) and the third (ttft 0.3, no tpot)
  EXPECT_DOUBLE_EQ(s.goodput, 0.5);
  EXPECT_EQ(s.max_concurrency, 3);  // at t = 1.0..1.2: the first, the second, and the third
}

TEST(BenchStatsTest, MaxConcurrencyCountsOverlapsOnly) {
  std::vector<RequestRecord> rs = {record(0, 0, 1, 1, {}), record(1, 0, 1, 1, {}), record(2, 0, 1, 1, {})};
  EXPECT_EQ(max_concurrency(rs), 1);  // back to back: each ends as the next starts
  rs.push_back(record(0.5, 0, 2, 1, {}));
  EXPECT_EQ(max_concurrency(rs), 2);
}

TEST(BenchStatsTest, SloParsingAndErrors) {
  auto slo = parse_slo("ttft=500ms,tpot=100ms,e2el=2s");
  ASSERT_TRUE(slo.has_value());
  EXPECT_DOUBLE_EQ(*slo->ttft, 0.5);
  EXPECT_DOUBLE_EQ(*slo->tpot, 0.1);
  EXPECT_DOUBLE_EQ(*slo->e2el, 2.0);
  auto bare = parse_slo("ttft=300");
  ASSERT_TRUE(bare.has_value());
  EXPECT_DOUBLE_EQ(*bare->ttft, 0.3);
  EXPECT_FALSE(bare->tpot.has_value());
  for (const char* bad : {"ttft", "foo=1ms", "ttft=-1ms", "ttft=abc", "ttft=1ms,,"}) {
    auto r = parse_slo(bad);
    EXPECT_FALSE(r.has_value()) << bad;
    if (!r) {
      EXPECT_NE(r.status().message().find("--slo"), std::string::npos);
    }
  }
}

TEST(BenchStatsTest, ArrivalsArePoissonWithTheAskedRate) {
  const auto at = arrival_times(20001, 4.0, 1.0, 3);
  EXPECT_DOUBLE_EQ(at[0], 0);
  EXPECT_NEAR(at.back() / 20000.0, 0.25, 0.01);  // mean gap 1 / rate
  for (size_t i = 1; i < at.size(); ++i) ASSERT_GE(at[i], at[i - 1]);
  // Burstiness < 1: same mean, more spread (coefficient of variation 1/sqrt(shape)).
  const auto bursty = arrival_times(20001, 4.0, 0.25, 3);
  EXPECT_NEAR(bursty.back() / 20000.0, 0.25, 0.02);
  double var = 0;
  for (size_t i = 1; i < bursty.size(); ++i) var += std::pow(bursty[i] - bursty[i - 1] - 0.25, 2);
  EXPECT_NEAR(std::sqrt(var / 20000.0) / 0.25, 2.0, 0.2);
  for (double t : arrival_times(5, std::numeric_limits<double>::infinity(), 1.0, 1)) EXPECT_EQ(t, 0);
}

class BenchDatasetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto path = default_model_path();
    INFERD_REQUIRE_OR_SKIP(path.has_value(), path.status().message());
    auto w = load_model(*path);
    ASSERT_TRUE(w.has_value());
    weights_ = std::move(*w);
    auto t = load_tokenizer(weights_->gguf.get(), weights_->source_path, weights_->config.vocab_size);
    ASSERT_TRUE(t.has_value());
    tokenizer_ = std::move(*t);
  }
  int64_t count(const std::string& text) const {
    return static_cast<int64_t>(tokenizer_->encode(text, false).size());
  }
  std::unique_ptr<ModelWeights> weights_;
  std::unique_ptr<Tokenizer> tokenizer_;
};

TEST_F(BenchDatasetTest, PromptsHaveTheAskedTokenCounts) {
  std::mt19937_64 rng(1);
  for (int64_t len : {1, 7, 128, 513}) {
    const std::string text = random_token_text(*tokenizer_, len, rng);
    EXPECT_NEAR(static_cast<double>(count(text)), static_cast<double>(len), 1.0) << len;
  }
  DatasetOptions o;
  o.num_prompts = 6;
  o.input_len = 64;
  o.output_len = 9;
  auto items = make_dataset(o, *tokenizer_);
  ASSERT_TRUE(items.has_value());
  ASSERT_EQ(items->size(), 6u);
  for (const BenchItem& item : *items) {
    EXPECT_NEAR(static_cast<double>(item.prompt_tokens), 64.0, 1.0);
    EXPECT_EQ(item.output_len, 9);
  }
  o.name = "scenario:summarize";
  o.num_prompts = 2;
  auto summarize = make_dataset(o, *tokenizer_);
  ASSERT_TRUE(summarize.has_value());
  EXPECT_EQ((*summarize)[0].output_len, 256);
  EXPECT_NEAR(static_cast<double>((*summarize)[0].prompt_tokens), 2048.0, 1.0);
}

TEST_F(BenchDatasetTest, SharedPrefixMultiTurnAndJsonl) {
  DatasetOptions o;
  o.name = "shared-prefix";
  o.num_prompts = 6;
  o.prefix_len = 100;
  o.num_prefixes = 2;
  o.suffix_len = 10;
  auto sp = make_dataset(o, *tokenizer_);
  ASSERT_TRUE(sp.has_value());
  EXPECT_EQ((*sp)[0].system, (*sp)[2].system);
  EXPECT_NE((*sp)[0].system, (*sp)[1].system);
  EXPECT_NE((*sp)[0].turns[0], (*sp)[2].turns[0]);

  o.name = "multi-turn";
  o.num_prompts = 8;
  o.turns = 4;
  auto mt = make_dataset(o, *tokenizer_);
  ASSERT_TRUE(mt.has_value());
  ASSERT_EQ(mt->size(), 2u);
  EXPECT_EQ((*mt)[0].turns.size(), 4u);

  const std::string dir = test::temp_dir();
  std::ofstream(dir + "/ok.jsonl") << R"({"prompt": "Hello there", "output_len": 5})"
                                   << "\n\n"
                                   << R"({"messages": [{"role": "user", "content": "Hi"}]})"
                                   << "\n";
  o.name = "jsonl:" + dir + "/ok.jsonl";
  auto jl = make_dataset(o, *tokenizer_);
  ASSERT_TRUE(jl.has_value()) << jl.status().message();
  ASSERT_EQ(jl->size(), 2u);
  EXPECT_EQ((*jl)[0].output_len, 5);
  EXPECT_FALSE((*jl)[1].messages_json.empty());
  std::ofstream(dir + "/bad.jsonl") << R"({"prompt": 3})"
                                    << "\n";
  o.name = "jsonl:" + dir + "/bad.jsonl";
  auto bad = make_dataset(o, *tokenizer_);
  ASSERT_FALSE(bad.has_value());
  EXPECT_NE(bad.status().message().find("line 1"), std::string::npos) << bad.status().message();
  o.name = "nonsense";
  EXPECT_FALSE(make_dataset(o, *tokenizer_).has_value());
}

}  // namespace
}  // namespace inferd
