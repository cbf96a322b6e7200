#include "engine/async_engine.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <map>
#include <random>

#include "engine/step_mirror.h"
#include "model/model_loader.h"
#include "test_support.h"

namespace inferd {
namespace {

EngineOptions small_options() {
  EngineOptions o;
  o.num_kv_blocks = 128;
  o.block_size = 8;
  o.scheduler.max_num_batched_tokens = 32;
  o.scheduler.max_model_len = 256;
  return o;
}

struct Collector {
  std::mutex mutex;
  std::condition_variable cv;
  std::map<RequestId, std::vector<int32_t>> tokens;
  std::map<RequestId, FinishReason> finished;

  AsyncEngine::OutputCallback callback() {
    return [this](const StepOutput& out) {
      std::lock_guard<std::mutex> lock(mutex);
      auto& t = tokens[out.id];
      t.insert(t.end(), out.new_tokens.begin(), out.new_tokens.end());
      if (out.finished) finished[out.id] = out.finish_reason.value_or(FinishReason::kError);
      cv.notify_all();
    };
  }
  bool wait(size_t n) {
    std::unique_lock<std::mutex> lock(mutex);
    return cv.wait_for(lock, std::chrono::seconds(60), [&] { return finished.size() >= n; });
  }
};

TEST(AsyncEngineTest, ConcurrentSubmittersGetTheSameTokensAsTheSyncEngine) {
  auto weights = load_model(test::fixture_path("tiny/llama_untied"));
  ASSERT_TRUE(weights.has_value());
  ThreadPool pool(2);
  Transformer model(**weights, pool);
  std::vector<RequestSpec> specs;
  std::mt19937 rng(8);
  for (int i = 0; i < 24; ++i) {
    RequestSpec s;
    for (int k = 0, n = 1 + static_cast<int>(rng() % 20); k < n; ++k)
      s.prompt.push_back(static_cast<int32_t>(rng() % 256));
    s.limits.max_tokens = 1 + static_cast<int64_t>(rng() % 12);
    specs.push_back(s);
  }
  // Reference: the synchronous engine, one request at a time.
  std::vector<std::vector<int32_t>> expected;
  for (const auto& s : specs) {
    Engine e(model, small_options());
    e.add(s);
    std::vector<int32_t> t;
    while (e.has_work()) {
      for (const auto& o : e.step()) t.insert(t.end(), o.new_tokens.begin(), o.new_tokens.end());
    }
    expected.push_back(t);
  }
  Collector c;
  std::map<RequestId, size_t> index;
  std::mutex index_mutex;
  {
    AsyncEngine engine(model, small_options());
    std::vector<std::thread> submitters;
    for (int th = 0; th < 3; ++th) {
      submitters.emplace_back([&, th] {
        for (size_t i = static_cast<size_t>(th); i < specs.size(); i += 3) {
          std::lock_guard<std::mutex> lock(index_mutex);  // id and index recorded together
          index[engine.submit(specs[i], c.callback())] = i;
        }
      });
    }
    for (auto& t : submitters) t.join();
    ASSERT_TRUE(c.wait(specs.size()));
    for (int spin = 0; spin < 1000 && engine.num_free_blocks() != engine.num_blocks(); ++spin) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    EXPECT_EQ(engine.num_free_blocks(), engine.num_blocks());
  }
  for (const auto& [id, i] : index) {
    EXPECT_EQ(c.tokens[id], expected[i]) << "request " << i;
    EXPECT_EQ(c.finished[id], FinishReason::kLength);
  }
}

TEST(AsyncEngineTest, AbortMidDecodeFreesBlocks) {
  auto weights = load_model(test::fixture_path("tiny/qwen2"));
  ASSERT_TRUE(weights.has_value());
  ThreadPool pool(1);
  Transformer model(**weights, pool);
  AsyncEngine engine(model, small_options());
  Collector c;
  // The tiny model writes 200 tokens in a few milliseconds: hold the engine thread in the
  // callback once 3 tokens are out, so the request is surely still running when it is aborted.
  std::mutex gate_mutex;
  std::condition_variable gate_cv;
  bool released = false;
  auto collect = c.callback();
  size_t seen = 0;  // engine thread only
  auto gated = [&](const StepOutput& out) {
    collect(out);
    seen += out.new_tokens.size();
    if (seen < 3) return;
    std::unique_lock<std::mutex> lock(gate_mutex);
    gate_cv.wait(lock, [&] { return released || out.finished; });
  };
  RequestSpec long_one{{1, 2, 3, 4}, {}, {200, {}, true}, 0};
  const RequestId id = engine.submit(long_one, gated);
  {
    std::unique_lock<std::mutex> lock(c.mutex);
    ASSERT_TRUE(c.cv.wait_for(lock, std::chrono::seconds(30), [&] { return c.tokens[id].size() >= 3; }));
  }
  EXPECT_LT(engine.num_free_blocks(), engine.num_blocks());
  engine.abort(id);
  {
    std::lock_guard<std::mutex> lock(gate_mutex);
    released = true;
  }
  gate_cv.notify_all();
  ASSERT_TRUE(c.wait(1));
  EXPECT_EQ(c.finished[id], FinishReason::kAborted);
  EXPECT_LT(c.tokens[id].size(), 200u);
  for (int spin = 0; spin < 1000 && engine.num_free_blocks() != engine.num_blocks(); ++spin) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(engine.num_free_blocks(), engine.num_blocks());
}

// A step mirror that, on its 3rd forward pass, finds the group gone: it calls fail_all on the engine
// thread, as MpiRuntime's before-abort hook does in a tensor-parallel server. Its first pass waits
// until the test opens it, after both submissions, so that no request can finish (the tiny model
// runs 200 steps in a few ms) or arrive after the failure.
class FailingMirror final : public StepMirror {
 public:
  void open(AsyncEngine* engine) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      engine_ = engine;
    }
    cv_.notify_all();
  }
  Status forward(const ForwardBatch&) override {
    AsyncEngine* engine = nullptr;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait(lock, [&] { return engine_ != nullptr; });
      engine = engine_;
    }
    if (++calls_ == 3) engine->fail_all("rank 1 stopped answering");
    return Status::ok();
  }
  Status copy_block(int32_t, int32_t) override { return Status::ok(); }
  // No offload tiers in this test: the engine never calls these.
  Status stage_block(int32_t, const BlockHash&) override { return Status(StatusCode::kInternal, "unused"); }
  Status start_load(uint64_t, std::span<const BlockHash>, std::span<const int32_t>) override {
    return Status(StatusCode::kInternal, "unused");
  }
  Status cancel_load(uint64_t) override { return Status(StatusCode::kInternal, "unused"); }
  Expected<int64_t> finish_load(uint64_t, int64_t) override {
    return Status(StatusCode::kInternal, "unused");
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  AsyncEngine* engine_ = nullptr;
  int calls_ = 0;
};

TEST(AsyncEngineTest, FailAllEndsEverySampleOfEveryRequestWithAServerError) {
  auto weights = load_model(test::fixture_path("tiny/qwen2"));
  ASSERT_TRUE(weights.has_value());
  ThreadPool pool(1);
  Transformer model(**weights, pool);
  FailingMirror mirror;
  EngineOptions options = small_options();
  options.step_mirror = &mirror;
  AsyncEngine engine(model, options);
  struct Seen {
    int finished = 0;
    std::string error;
    bool internal = false;
  };
  std::mutex mutex;
  std::condition_variable cv;
  std::map<std::pair<RequestId, int32_t>, Seen> seen;
  auto collect = [&](const StepOutput& out) {
    std::lock_guard<std::mutex> lock(mutex);
    Seen& s = seen[{out.id, out.index}];
    if (out.finished) {
      ++s.finished;
      s.error = out.error;
      s.internal = out.internal;
    }
    cv.notify_all();
  };
  engine.fail_all("off the engine thread");  // only logged: nothing is ended
  RequestSpec one{{1, 2, 3, 4}, {}, {200, {}, true}, 0};
  RequestSpec two = one;
  two.n = 2;
  const RequestId a = engine.submit(one, collect), b = engine.submit(two, collect);
  mirror.open(&engine);
  std::unique_lock<std::mutex> lock(mutex);
  ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(30), [&] {
    return seen[{a, 0}].finished + seen[{b, 0}].finished + seen[{b, 1}].finished >= 3;
  }));
  for (const auto& key : {std::pair{a, 0}, std::pair{b, 0}, std::pair{b, 1}}) {
    const Seen& s = seen[key];
    EXPECT_EQ(s.finished, 1) << key.first << "/" << key.second;
    EXPECT_EQ(s.error, "rank 1 stopped answering");
    EXPECT_TRUE(s.internal);
  }
}

}  // namespace
}  // namespace inferd

namespace inferd {
namespace {

// Submits a prompt of 8 tokens; returns when it was submitted.
std::chrono::steady_clock::time_point submit_one(
    AsyncEngine& engine, Collector& c, int64_t max_tokens,
    std::map<RequestId, std::chrono::steady_clock::time_point>* first, std::mutex* m) {
  RequestSpec s;
  s.prompt = {1, 2, 3, 4, 5, 6, 7, 8};
  s.limits.max_tokens = max_tokens;
  s.limits.ignore_eos = true;
  const auto at = std::chrono::steady_clock::now();
  auto inner = c.callback();
  engine.submit(s, [inner, first, m](const StepOutput& out) {
    if (out.first_scheduled) {
      std::lock_guard<std::mutex> lock(*m);
      first->emplace(out.id, *out.first_scheduled);
    }
    inner(out);
  });
  return at;
}

double seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

// The tiny Llama on two threads, for the batch window tests.
struct TinyModel {
  std::unique_ptr<ModelWeights> weights = load_model(test::fixture_path("tiny/llama_untied")).value();
  ThreadPool pool{2};
  Transformer model{*weights, pool};
};

TEST(AsyncEngineBatchWindowTest, AFixedWindowGathersArrivalsIntoOneStepAndNeverHoldsDecodes) {
  TinyModel tiny;
  Transformer& model = tiny.model;
  EngineOptions o = small_options();
  o.batch_window = BatchWindowMode::kFixed;
  o.batch_window_seconds = 1.0;
  Collector c;
  std::map<RequestId, std::chrono::steady_clock::time_point> first;
  std::mutex m;
  AsyncEngine engine(model, o);
  EXPECT_DOUBLE_EQ(engine.batch_window_seconds(), 1.0);
  const auto a = submit_one(engine, c, 40, &first, &m);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  submit_one(engine, c, 2, &first, &m);
  ASSERT_TRUE(c.wait(1));  // the short one
  std::lock_guard<std::mutex> lock(m);
  ASSERT_EQ(first.size(), 2u);
  const auto ta = first.begin()->second, tb = std::next(first.begin())->second;
  EXPECT_GE(seconds(ta - a), 0.9);             // held for the window
  EXPECT_LT(std::abs(seconds(tb - ta)), 0.1);  // the later arrival joined the same step
  // With a request running, a new arrival is not held: it joins the next step.
  std::map<RequestId, std::chrono::steady_clock::time_point> later;
  std::mutex m2;
  Collector c2;
  o.scheduler.max_model_len = 2048;
  o.num_kv_blocks = 300;
  AsyncEngine busy(model, o);
  submit_one(busy, c2, 2000, &later, &m2);
  for (int i = 0; i < 4000; ++i) {  // until its first token: it runs
    {
      std::lock_guard<std::mutex> lock2(c2.mutex);
      if (!c2.tokens.empty()) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  const auto d = submit_one(busy, c2, 2, &later, &m2);
  ASSERT_TRUE(c2.wait(1));
  {
    std::lock_guard<std::mutex> lock2(c2.mutex);
    ASSERT_EQ(c2.finished.size(), 1u);  // the long one still runs: the short one ran beside it
  }
  std::lock_guard<std::mutex> lock2(m2);
  ASSERT_EQ(later.size(), 2u);
  EXPECT_LT(seconds(std::next(later.begin())->second - d), 0.9);
}

TEST(AsyncEngineBatchWindowTest, AutoStartsAtOnceUnderLightLoad) {
  TinyModel tiny;
  Transformer& model = tiny.model;
  EngineOptions o = small_options();
  o.batch_window = BatchWindowMode::kAuto;
  Collector c;
  std::map<RequestId, std::chrono::steady_clock::time_point> first;
  std::mutex m;
  AsyncEngine engine(model, o);
  for (int i = 0; i < 3; ++i) {
    const auto at = submit_one(engine, c, 4, &first, &m);
    ASSERT_TRUE(c.wait(static_cast<size_t>(i + 1)));
    std::lock_guard<std::mutex> lock(m);
    EXPECT_LT(seconds(first.rbegin()->second - at), 0.045);  // under auto's cap: it did not wait
  }
  EXPECT_EQ(engine.batch_window_seconds(), 0);
}

}  // namespace
}  // namespace inferd
