// StreamingLLM requests in the engine: they run past the KV pool and the context, give back the
// blocks between sink and window, and produce exactly the tokens of one windowed pass over their
// whole text, alone or batched with others, preempted or not, forked, through the prefix cache.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <optional>
#include <random>
#include <set>

#include "engine/engine.h"
#include "model/model_loader.h"
#include "test_support.h"

namespace inferd {
namespace {

EngineOptions options(int64_t blocks, int64_t budget, bool prefix_caching = true) {
  EngineOptions o;
  o.num_kv_blocks = blocks;
  o.block_size = 16;
  o.prefix_caching = prefix_caching;
  o.scheduler.max_num_batched_tokens = budget;
  o.scheduler.max_prefill_tokens = budget;
  o.scheduler.max_num_seqs = 16;
  o.scheduler.max_model_len = 256;
  return o;
}

RequestSpec spec(std::mt19937& rng, int64_t prompt_len, int64_t max_tokens, StreamingWindow w) {
  RequestSpec s;
  for (int64_t i = 0; i < prompt_len; ++i) s.prompt.push_back(static_cast<int32_t>(rng() % 256));
  s.limits.max_tokens = max_tokens;
  s.streaming = w;
  return s;
}

struct Outcome {
  std::vector<std::vector<int32_t>> tokens;
  std::vector<std::string> errors;
  int64_t preemptions = 0;
  int64_t max_used_blocks = 0;
};

Outcome run(Transformer& model, const EngineOptions& o, const std::vector<RequestSpec>& specs,
            bool together) {
  Engine engine(model, o);
  Outcome r;
  r.tokens.resize(specs.size());
  r.errors.resize(specs.size());
  std::map<RequestId, size_t> index;
  auto drain = [&] {
    do {  // once more after the last: a request refused on arrival reports at the next step
      for (const StepOutput& s : engine.step()) {
        auto& t = r.tokens[index.at(s.id)];
        t.insert(t.end(), s.new_tokens.begin(), s.new_tokens.end());
        if (!s.error.empty()) r.errors[index.at(s.id)] = s.error;
      }
      r.max_used_blocks =
          std::max<int64_t>(r.max_used_blocks, engine.block_pool().num_used_blocks() -
                                                   engine.kv_cache_manager().num_pinned_blocks());
    } while (engine.has_work());
  };
  for (size_t i = 0; i < specs.size(); ++i) {
    index[engine.add(specs[i])] = i;
    if (!together) drain();
  }
  drain();
  EXPECT_EQ(engine.block_pool().num_free_blocks() + engine.kv_cache_manager().num_pinned_blocks(),
            engine.block_pool().num_blocks());
  r.preemptions = engine.scheduler().num_preemptions();
  return r;
}

// The greedy tokens of one forward pass over prompt + output (a cache holding every position,
// nothing given back) with the request's window: what the engine must have produced.
std::vector<int32_t> one_pass_greedy(Transformer& model, const RequestSpec& s,
                                     const std::vector<int32_t>& out) {
  const ModelConfig& c = model.config();
  std::vector<int32_t> ids = s.prompt;
  ids.insert(ids.end(), out.begin(), out.end() - 1);
  const auto n = static_cast<int64_t>(ids.size());
  const int64_t block = 16;
  KvCache cache(c.num_layers, (n + block - 1) / block, block, c.kv_dim(), KvDType::kF16, c.head_dim);
  std::vector<int32_t> table(static_cast<size_t>((n + block - 1) / block));
  std::iota(table.begin(), table.end(), 0);
  std::vector<int32_t> positions(static_cast<size_t>(n)), token_seq(static_cast<size_t>(n), 0), rows;
  std::vector<int64_t> slots(static_cast<size_t>(n));
  std::iota(positions.begin(), positions.end(), 0);
  std::iota(slots.begin(), slots.end(), 0);
  for (auto i = static_cast<int64_t>(s.prompt.size()) - 1; i < n; ++i)
    rows.push_back(static_cast<int32_t>(i));
  AttentionSequence seq{0, n, n, table};
  if (s.streaming.enabled()) {
    seq.window = s.streaming.window_tokens;
    seq.sink_len = streaming_sink_len(s.streaming, block);
  }
  std::vector<float> logits(rows.size() * static_cast<size_t>(c.vocab_size));
  const ForwardBatch batch{ids, positions, slots, token_seq, {&seq, 1}, rows, {}};
  EXPECT_TRUE(model.forward(batch, cache, logits).is_ok());
  std::vector<int32_t> greedy;
  for (size_t r = 0; r < rows.size(); ++r) {
    const float* row = logits.data() + r * static_cast<size_t>(c.vocab_size);
    greedy.push_back(static_cast<int32_t>(std::max_element(row, row + c.vocab_size) - row));
  }
  return greedy;
}

// A tiny fixture model on two threads.
struct Tiny {
  explicit Tiny(const std::string& variant) : weights(load_model(test::fixture_path("tiny/" + variant))) {
    EXPECT_TRUE(weights.has_value()) << weights.status().message();
    if (weights.has_value()) model.emplace(**weights, pool);
  }
  Expected<std::unique_ptr<ModelWeights>> weights;
  ThreadPool pool{2};
  std::optional<Transformer> model;
};

// Streaming requests whose prompt + output exceed both the KV pool (12 blocks of 16) and the
// context (256), mixed with ordinary ones: each completes, holds no more than its sink and
// window need, and its tokens are those of one windowed pass over its text; batched equals alone.
TEST(StreamingWindowTest, RequestsRunPastThePoolAndEqualOneWindowedPass) {
  for (const char* variant : {"qwen2", "qwen3", "llama_untied", "qwen2_rope_yarn"}) {
    SCOPED_TRACE(variant);
    Tiny tiny(variant);
    ASSERT_TRUE(tiny.model.has_value());
    Transformer& model = *tiny.model;
    std::mt19937 rng(5);
    std::vector<RequestSpec> specs;
    specs.push_back(spec(rng, 150, 250, {4, 48}));
    specs.push_back(spec(rng, 20, 40, {}));
    specs.push_back(spec(rng, 70, 200, {0, 32}));
    specs.push_back(spec(rng, 300, 30, {20, 40}));
    specs.push_back(spec(rng, 33, 60, {}));
    specs.push_back(specs[0]);  // the same text again: its blocks come from the prefix cache
    specs.back().limits.max_tokens = 100;
    const EngineOptions o = options(30, 64);
    const Outcome alone = run(model, o, specs, false);
    const Outcome together = run(model, o, specs, true);
    EXPECT_EQ(together.tokens, alone.tokens);
    for (size_t i = 0; i < specs.size(); ++i) {
      SCOPED_TRACE(i);
      EXPECT_EQ(alone.errors[i], "");
      ASSERT_EQ(static_cast<int64_t>(alone.tokens[i].size()), specs[i].limits.max_tokens);
      EXPECT_EQ(alone.tokens[i], one_pass_greedy(model, specs[i], alone.tokens[i]));
    }
    // The window changes what the model computes: full attention over request 0's 400 tokens
    // would have chosen other tokens.
    RequestSpec unwindowed = specs[0];
    unwindowed.streaming = {};
    EXPECT_NE(one_pass_greedy(model, unwindowed, alone.tokens[0]), alone.tokens[0]);
    // Alone, request 0 held at most its sink (16), two windows (96) and rounding: not its 400.
    const Outcome first = run(model, options(12, 64), {specs[0]}, true);
    EXPECT_EQ(first.tokens[0], alone.tokens[0]);
    EXPECT_LE(first.max_used_blocks, 10);
    // Without the window it is refused: it needs more KV cache and context than exist.
    RequestSpec full = specs[0];
    full.streaming = {};
    const Outcome refused = run(model, options(12, 64), {full}, true);
    EXPECT_NE(refused.errors[0], "");
  }
}

// A pool so small that streaming requests preempt each other: the same tokens as alone.
TEST(StreamingWindowTest, PreemptionKeepsTheTokens) {
  Tiny tiny("qwen3");
  ASSERT_TRUE(tiny.model.has_value());
  Transformer& model = *tiny.model;
  std::mt19937 rng(9);
  std::vector<RequestSpec> specs;
  for (int i = 0; i < 6; ++i)
    specs.push_back(spec(rng, 40 + 30 * i, 120, {static_cast<int64_t>(i % 2) * 4, 32 + 16 * (i % 3)}));
  const Outcome alone = run(model, options(14, 48, false), specs, false);
  const Outcome together = run(model, options(14, 48, false), specs, true);
  EXPECT_GT(together.preemptions, 0);
  EXPECT_EQ(together.tokens, alone.tokens);
  for (size_t i = 0; i < specs.size(); ++i)
    EXPECT_EQ(alone.tokens[i], one_pass_greedy(model, specs[i], alone.tokens[i]));
}

// n = 3 seeded samples of a prompt longer than the window (forked across the table's hole):
// each equals the single request with seed + index.
TEST(StreamingWindowTest, SamplesForkAcrossTheHole) {
  Tiny tiny("llama_untied");
  ASSERT_TRUE(tiny.model.has_value());
  Transformer& model = *tiny.model;
  std::mt19937 rng(13);
  RequestSpec s = spec(rng, 190, 50, {4, 64});
  s.sampling.temperature = 1.0f;
  s.sampling.seed = 3;
  s.n = 3;
  Engine engine(model, options(40, 64));
  const RequestId id = engine.add(s);
  std::vector<std::vector<int32_t>> samples(3);
  while (engine.has_work()) {
    for (const StepOutput& out : engine.step()) {
      EXPECT_EQ(out.id, id);
      EXPECT_EQ(out.error, "");
      auto& t = samples.at(static_cast<size_t>(out.index));
      t.insert(t.end(), out.new_tokens.begin(), out.new_tokens.end());
    }
  }
  EXPECT_EQ(engine.block_pool().num_free_blocks(), engine.block_pool().num_blocks());
  EXPECT_GT(std::set<std::vector<int32_t>>(samples.begin(), samples.end()).size(), 1u);
  for (int32_t i = 0; i < 3; ++i) {
    RequestSpec single = s;
    single.n = 1;
    single.sampling.seed = 3u + static_cast<uint64_t>(i);
    EXPECT_EQ(run(model, options(40, 64), {single}, true).tokens[0], samples[static_cast<size_t>(i)]) << i;
  }
}

// Bad windows are refused per request, with a message; the others run.
TEST(StreamingWindowTest, BadWindowsAreRefusedAlone) {
  Tiny tiny("qwen2");
  ASSERT_TRUE(tiny.model.has_value());
  Transformer& model = *tiny.model;
  std::mt19937 rng(1);
  std::vector<RequestSpec> specs{spec(rng, 10, 5, {4, 8}), spec(rng, 10, 5, {-1, 32}),
                                 spec(rng, 10, 5, {100, 200}), spec(rng, 10, 5, {4, 32})};
  specs[1].streaming.sink_tokens = -1;
  const Outcome r = run(model, options(30, 64), specs, true);
  EXPECT_NE(r.errors[0].find("at least 16"), std::string::npos) << r.errors[0];
  EXPECT_NE(r.errors[1].find("negative"), std::string::npos) << r.errors[1];
  EXPECT_NE(r.errors[2].find("context window"), std::string::npos) << r.errors[2];
  EXPECT_EQ(r.errors[3], "");
  EXPECT_EQ(r.tokens[3].size(), 5u);
}

}  // namespace
}  // namespace inferd
