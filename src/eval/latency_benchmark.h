// LatencyBenchmark: `inferd bench latency`, in-process (no HTTP): prompt processing and text
// generation tokens/s for given lengths, as llama-bench's pp512 / tg128 measure them: pp = one
// prompt of p tokens computed in one step; tg = n single-token decode steps from a 1-token context.
#pragma once

#include <cstdint>
#include <vector>

#include "common/status.h"
#include "model/transformer.h"

namespace inferd {

struct LatencyBenchOptions {
  int64_t prompt_tokens = 512;  // -p (0 = skip pp)
  int64_t gen_tokens = 128;     // -n (0 = skip tg)
  int32_t repetitions = 5;      // -r
  uint64_t seed = 0;
  Status validate() const;
};

struct LatencyBenchResult {
  std::vector<double> prompt_tokens_per_second;      // one per repetition
  std::vector<double> generation_tokens_per_second;  // one per repetition
};

// Runs a warm-up, then the repetitions. model: not owned.
Expected<LatencyBenchResult> run_latency_benchmark(Transformer& model, const LatencyBenchOptions& options);

}  // namespace inferd
