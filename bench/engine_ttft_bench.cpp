// Google Benchmark: the in-process cost of one request through AsyncEngine (submit -> finished
// callback) on the default model, the baseline the server's HTTP + JSON + SSE overhead is
// measured against (scripts/bench/server_bench.py overhead).
#include <benchmark/benchmark.h>

#include <condition_variable>
#include <cstdio>
#include <mutex>

#include "engine/async_engine.h"
#include "model/default_model.h"
#include "model/model_loader.h"
#include "model/transformer.h"

namespace {

using namespace inferd;

void BM_OneTokenRequest(benchmark::State& state) {
  auto path = default_model_path();
  if (!path) {
    state.SkipWithError("default model not installed");
    return;
  }
  auto weights = load_model(*path);
  if (!weights) {
    state.SkipWithError(weights.status().message().c_str());
    return;
  }
  ThreadPool pool(2);
  Transformer model(**weights, pool);
  EngineOptions options;
  options.num_kv_blocks = 256;
  AsyncEngine engine(model, options);
  std::mutex mutex;
  std::condition_variable cv;
  for (auto _ : state) {
    bool done = false;
    RequestSpec spec;
    spec.prompt = {504};
    spec.limits.max_tokens = 1;
    engine.submit(spec, [&](const StepOutput& out) {
      if (!out.finished) return;
      std::lock_guard<std::mutex> lock(mutex);
      done = true;
      cv.notify_one();
    });
    std::unique_lock<std::mutex> lock(mutex);
    cv.wait(lock, [&] { return done; });
  }
}
BENCHMARK(BM_OneTokenRequest)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(3.0);

}  // namespace

BENCHMARK_MAIN();
