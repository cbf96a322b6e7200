// `inferd bench serve` (load generator for any OpenAI-compatible server) and `inferd bench
// latency` (in-process pp / tg tokens/s): flags and wiring; the work is in src/bench/.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "bench/bench_dataset.h"
#include "bench/serve_benchmark.h"
#include "eval/latency_benchmark.h"

namespace inferd {

class Parallel;

struct BenchServeFlags {
  ServeBenchOptions options;
  DatasetOptions dataset;
  std::string request_rate = "inf";
  std::string tokenizer;  // model whose vocabulary makes the prompts (default: the default model)
  std::string slo;
  std::string result_json;
  std::string plot_dir;
  std::string sweep_concurrency;
  bool no_progress = false;
};

struct BenchLatencyFlags {
  LatencyBenchOptions options;
  std::string model;  // default: the default model
  int threads = 2;
  bool json = false;
  BackendKind matmul = BackendKind::kPacked;
};

struct BenchCommands {
  CLI::App* serve;
  CLI::App* latency;
};

BenchCommands add_bench_commands(CLI::App* bench, BenchServeFlags* serve, BenchLatencyFlags* latency);

int run_bench_serve(const BenchServeFlags& flags);
int run_bench_latency(const BenchLatencyFlags& flags, Parallel* parallel);

}  // namespace inferd
