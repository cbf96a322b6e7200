// LatencyBenchmark: `inferd bench latency`, in-process (no HTTP): prompt processing and text
// generation tokens/s for given lengths, as llama-bench's pp512 / tg128 measure them: pp = one
// prompt of p tokens computed in one step; tg = n single-token decode steps from a 1-token context,
// or (depth d, llama-bench's -d) after a d-token prompt computed untimed: tg128 @ d4096.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "common/status.h"
#include "kernels/attention.h"
#include "model/transformer.h"

namespace inferd {

struct EngineOptions;

struct LatencyBenchOptions {
  int64_t prompt_tokens = 512;  // -p (0 = skip pp)
  int64_t gen_tokens = 128;     // -n (0 = skip tg)
  int32_t repetitions = 5;      // -r
  int64_t depth = 0;            // -d: tokens in the KV cache before each tg run (pp runs at depth 0)
  KvDType kv_dtype = KvDType::kF16;
  // tg runs through a StreamingLLM window (off: full attention); the KV pool then holds the sink
  // and the window, not the depth.
  StreamingWindow streaming;
  uint64_t seed = 0;
  // Tensor parallelism (docs/parallelism.md): called on the engine's options before the engine is
  // made (the group attaches its step mirror there), and a clock of the seconds this rank has
  // spent in collectives, sampled around each timed run.
  std::function<Status(EngineOptions&)> prepare_engine;
  std::function<double()> collective_seconds;
  Status validate() const;
};

struct LatencyBenchResult {
  std::vector<double> prompt_tokens_per_second;      // one per repetition
  std::vector<double> generation_tokens_per_second;  // one per repetition
  int64_t generation_steps = 0;                      // steps timed per tg run (n: one token each)
  // With collective_seconds: the share of each phase's time spent in collectives (0..1, over
  // all repetitions).
  double prompt_collective_share = 0;
  double generation_collective_share = 0;
};

// Runs a warm-up, then the repetitions. model: not owned.
Expected<LatencyBenchResult> run_latency_benchmark(Transformer& model, const LatencyBenchOptions& options);

}  // namespace inferd
