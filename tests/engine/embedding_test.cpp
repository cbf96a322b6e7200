// Embeddings: the final hidden states the transformer returns are what its logits are computed
// from (checked against transformers' logits), and the engine pools them exactly so whatever the
// chunking, batching, preemption or prefix cache.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "engine/engine.h"
#include "model/model_loader.h"
#include "model/transformer.h"
#include "tensor/dequantize.h"
#include "test_support.h"

namespace inferd {
namespace {

std::unique_ptr<ModelWeights> load(const std::string& variant, const std::string& file = "") {
  std::string path = test::fixture_path("tiny/" + variant);
  if (!file.empty()) path += "/" + file;
  auto w = load_model(path);
  EXPECT_TRUE(w.has_value()) << w.status().message();
  return w.has_value() ? std::move(*w) : nullptr;
}

// Every position's final hidden state and logits of one prompt, computed in one forward pass.
void forward_all(Transformer& model, const std::vector<int32_t>& prompt, std::vector<float>* hidden,
                 std::vector<float>* logits) {
  const ModelConfig& c = model.config();
  const auto n = static_cast<int64_t>(prompt.size());
  const int64_t bs = 16;
  KvCache cache(c.num_layers, (n + bs - 1) / bs, bs, c.kv_dim(), KvDType::kF32, c.head_dim);
  std::vector<int32_t> table, positions, token_seq, rows;
  std::vector<int64_t> slots;
  for (int64_t b = 0; b < (n + bs - 1) / bs; ++b) table.push_back(static_cast<int32_t>(b));
  for (int64_t p = 0; p < n; ++p) {
    positions.push_back(static_cast<int32_t>(p));
    token_seq.push_back(0);
    rows.push_back(static_cast<int32_t>(p));
    slots.push_back(p);
  }
  const AttentionSequence seq{0, n, n, table};
  hidden->assign(static_cast<size_t>(n * c.hidden_size), 0.0f);
  logits->assign(static_cast<size_t>(n * c.vocab_size), 0.0f);
  ForwardBatch batch{prompt, positions, slots, token_seq, {&seq, 1}, rows, {}, rows};
  const Status s = model.forward(batch, cache, *logits, *hidden);
  ASSERT_TRUE(s.is_ok()) << s.message();
}

TEST(EmbeddingTest, HiddenStatesGiveTheLogitsOfTransformers) {
  for (const char* variant : {"qwen3", "qwen2", "llama_untied", "llama_tied"}) {
    auto weights = load(variant);
    ASSERT_NE(weights, nullptr);
    ThreadPool pool(2);
    Transformer model(*weights, pool, {.backend = BackendKind::kF32});
    const ModelConfig& c = model.config();
    const std::string dir = test::fixture_path(std::string("tiny/") + variant);
    const auto ref = nlohmann::json::parse(test::read_text(dir + "/reference.json"));
    const std::vector<float> ref_logits = test::read_f32(dir + "/" + ref["logits_file"].get<std::string>());
    const auto prompt = ref["prompts"][0].get<std::vector<int32_t>>();
    std::vector<float> hidden, logits;
    forward_all(model, prompt, &hidden, &logits);
    // logits = hidden . lm_head^T, row by row, in double.
    std::vector<float> head_row(static_cast<size_t>(c.hidden_size));
    std::vector<float> projected(logits.size());
    for (int64_t v = 0; v < c.vocab_size; ++v) {
      dequantize_tensor_row(weights->lm_head, v, head_row.data());
      for (size_t t = 0; t < prompt.size(); ++t) {
        double dot = 0;
        for (int64_t d = 0; d < c.hidden_size; ++d)
          dot +=
              static_cast<double>(hidden[t * static_cast<size_t>(c.hidden_size) + static_cast<size_t>(d)]) *
              head_row[static_cast<size_t>(d)];
        projected[t * static_cast<size_t>(c.vocab_size) + static_cast<size_t>(v)] = static_cast<float>(dot);
      }
    }
    EXPECT_LT(test::relative_max_error(projected.data(), logits.data(), logits.size()), 1e-5) << variant;
    // The reference's first prompt's rows come first in its logits file.
    EXPECT_LT(test::relative_max_error(projected.data(), ref_logits.data(), logits.size()), 1e-4) << variant;
    EXPECT_GT(c.vocab_size, c.hidden_size);  // so the logits determine the hidden state
  }
}

EngineOptions options(int64_t blocks, int32_t block_size, int64_t budget) {
  EngineOptions o;
  o.num_kv_blocks = blocks;
  o.block_size = block_size;
  o.scheduler.max_num_batched_tokens = budget;
  o.scheduler.max_prefill_tokens = budget;
  o.scheduler.max_num_seqs = 64;
  o.scheduler.max_model_len = 256;
  o.kv_dtype = KvDType::kF32;  // as forward_all's cache
  return o;
}

// The pooling of hidden rows [n, dim] as the engine's definition says, normalized when asked.
std::vector<float> pool_rows(const std::vector<float>& hidden, int64_t n, int64_t dim, Pooling pooling,
                             bool normalize) {
  std::vector<double> acc(static_cast<size_t>(dim), 0.0);
  const int64_t from = pooling == Pooling::kLast ? n - 1 : 0;
  const int64_t to = pooling == Pooling::kCls ? 1 : n;
  for (int64_t t = from; t < to; ++t)
    for (int64_t d = 0; d < dim; ++d) acc[static_cast<size_t>(d)] += hidden[static_cast<size_t>(t * dim + d)];
  double norm = 0;
  for (double& v : acc) {
    v /= static_cast<double>(to - from);
    norm += v * v;
  }
  const double scale = normalize ? 1.0 / std::sqrt(norm) : 1.0;
  std::vector<float> out;
  for (double v : acc) out.push_back(static_cast<float>(v * scale));
  return out;
}

struct Job {
  RequestSpec spec;
  std::vector<float> embedding;
  std::vector<int32_t> tokens;
  std::string error;
  int outputs = 0;
  bool finished = false;
};

// Runs the jobs (all submitted at once) to the end.
void run(Transformer& model, const EngineOptions& o, std::vector<Job>* jobs, int64_t* preemptions = nullptr) {
  Engine engine(model, o);
  std::map<RequestId, size_t> index;
  for (size_t i = 0; i < jobs->size(); ++i) index[engine.add((*jobs)[i].spec)] = i;
  while (engine.has_work()) {
    for (const StepOutput& s : engine.step()) {
      Job& j = (*jobs)[index.at(s.id)];
      if (!s.embedding.empty()) {
        EXPECT_TRUE(j.embedding.empty());
        j.embedding = s.embedding;
        EXPECT_TRUE(s.finished);
      }
      j.tokens.insert(j.tokens.end(), s.new_tokens.begin(), s.new_tokens.end());
      if (s.finished) {
        j.finished = true;
        j.error = s.error;
      }
      ++j.outputs;
    }
  }
  EXPECT_EQ(engine.block_pool().num_free_blocks(), engine.block_pool().num_blocks());
  if (preemptions != nullptr) *preemptions = engine.scheduler().num_preemptions();
}

std::vector<int32_t> random_prompt(std::mt19937& rng, int64_t len, int64_t vocab) {
  std::vector<int32_t> p;
  for (int64_t k = 0; k < len; ++k) p.push_back(static_cast<int32_t>(rng() % static_cast<uint32_t>(vocab)));
  return p;
}

TEST(EmbeddingTest, EnginePoolsExactlyUnderChunkingBatchingAndPreemption) {
  auto weights = load("qwen3");
  ASSERT_NE(weights, nullptr);
  ThreadPool pool(2);
  Transformer model(*weights, pool);  // the default (packed) backend: batch-invariant
  const ModelConfig& c = model.config();
  std::mt19937 rng(11);
  std::vector<Job> jobs;
  for (int i = 0; i < 24; ++i) {
    Job j;
    j.spec.prompt = random_prompt(rng, 1 + static_cast<int64_t>(rng() % 50), c.vocab_size);
    if (i % 4 == 3) {  // generations among the embeddings
      j.spec.limits.max_tokens = 8;
    } else {
      j.spec.pooling = std::array{Pooling::kLast, Pooling::kMean, Pooling::kCls}[static_cast<size_t>(i % 4)];
      j.spec.normalize_embedding = i % 5 != 0;
    }
    jobs.push_back(j);
  }
  // Each alone, one forward pass over the whole prompt: the expected embedding.
  std::vector<std::vector<float>> want;
  for (const Job& j : jobs) {
    std::vector<float> hidden, logits;
    forward_all(model, j.spec.prompt, &hidden, &logits);
    want.push_back(j.spec.pooling == Pooling::kNone
                       ? std::vector<float>{}
                       : pool_rows(hidden, static_cast<int64_t>(j.spec.prompt.size()), c.hidden_size,
                                   j.spec.pooling, j.spec.normalize_embedding));
  }
  auto roomy_jobs = jobs, chunked_jobs = jobs, tight_jobs = jobs;
  run(model, options(512, 16, 512), &roomy_jobs);
  run(model, options(512, 16, 7), &chunked_jobs);  // prompts in chunks of up to 7 tokens
  int64_t preemptions = 0;
  run(model, options(16, 4, 32), &tight_jobs, &preemptions);  // 64 slots: requests give way
  EXPECT_GT(preemptions, 0);
  for (size_t i = 0; i < jobs.size(); ++i) {
    for (const auto* got : {&roomy_jobs, &chunked_jobs, &tight_jobs}) {
      const Job& j = (*got)[i];
      EXPECT_TRUE(j.finished);
      EXPECT_TRUE(j.error.empty()) << j.error;
      if (jobs[i].spec.pooling == Pooling::kNone) {
        EXPECT_TRUE(j.embedding.empty());
        EXPECT_EQ(j.tokens, roomy_jobs[i].tokens);
        EXPECT_EQ(static_cast<int64_t>(j.tokens.size()), 8);
        continue;
      }
      EXPECT_TRUE(j.tokens.empty());
      EXPECT_EQ(j.outputs, 1);  // the embedding and the end, in one output
      ASSERT_EQ(j.embedding.size(), want[i].size());
      // The same rows, summed in a different order at most: f32 rounding.
      EXPECT_LT(test::relative_max_error(j.embedding.data(), want[i].data(), want[i].size()), 1e-5)
          << "job " << i << " pooling " << pooling_name(jobs[i].spec.pooling);
      double norm = 0;
      for (float v : j.embedding) norm += static_cast<double>(v) * v;
      if (jobs[i].spec.normalize_embedding) {
        EXPECT_NEAR(std::sqrt(norm), 1.0, 1e-5);
      }
    }
  }
  std::printf("[ figures  ] %lld preemptions with 16 blocks of 4\n", static_cast<long long>(preemptions));
}

// A request whose prompt is cached already (a generation ran it) must still pool every row:
// mean and first-token pooling read rows a cached prefix would skip.
TEST(EmbeddingTest, CachedPrefixDoesNotChangeTheEmbedding) {
  auto weights = load("qwen2");
  ASSERT_NE(weights, nullptr);
  ThreadPool pool(2);
  Transformer model(*weights, pool);
  std::mt19937 rng(5);
  const std::vector<int32_t> prompt = random_prompt(rng, 50, model.config().vocab_size);
  for (Pooling p : {Pooling::kMean, Pooling::kCls, Pooling::kLast}) {
    Engine engine(model, options(512, 16, 512));
    std::vector<std::vector<float>> got;
    for (int round = 0; round < 3; ++round) {
      RequestSpec spec;
      spec.prompt = prompt;
      if (round == 0) {
        spec.limits.max_tokens = 2;  // a generation first: its blocks stay cached
      } else {
        spec.pooling = p;
      }
      engine.add(spec);
      while (engine.has_work()) {
        for (const StepOutput& s : engine.step()) {
          if (!s.embedding.empty()) got.push_back(s.embedding);
        }
      }
    }
    ASSERT_EQ(got.size(), 2u);
    std::vector<float> hidden, logits;
    forward_all(model, prompt, &hidden, &logits);
    const auto want = pool_rows(hidden, 50, model.config().hidden_size, p, true);
    for (const auto& e : got) EXPECT_LT(test::relative_max_error(e.data(), want.data(), want.size()), 1e-5);
  }
}

TEST(EmbeddingTest, RefusesWhatAnEmbeddingCannotHave) {
  auto weights = load("llama_tied");
  ASSERT_NE(weights, nullptr);
  ThreadPool pool(1);
  Transformer model(*weights, pool);
  Engine engine(model, options(64, 16, 64));
  RequestSpec two;
  two.prompt = {1, 2, 3};
  two.pooling = Pooling::kLast;
  two.n = 2;
  RequestSpec logprobs = two;
  logprobs.n = 1;
  logprobs.sampling.prompt_logprobs = 1;
  std::map<RequestId, std::string> errors;
  engine.add(two);
  engine.add(logprobs);
  do {  // refused requests end at the next step
    for (const StepOutput& s : engine.step()) {
      EXPECT_TRUE(s.embedding.empty());
      if (s.finished) errors[s.id] = s.error;
    }
  } while (engine.has_work());
  ASSERT_EQ(errors.size(), 2u);
  for (const auto& [id, error] : errors)
    EXPECT_NE(error.find("an embedding request needs n = 1"), std::string::npos);
}

}  // namespace
}  // namespace inferd
