// BenchReport: how a serving benchmark is shown and kept: the console table (laid out as vLLM's
// `vllm bench serve` prints it), the --result-json document (vLLM's keys plus per-request
// records), and --plot PNGs drawn by gnuplot (Debian gnuplot-nox).
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/bench_stats.h"
#include "bench/serve_benchmark.h"
#include "common/status.h"

namespace inferd {

struct BenchRunInfo {
  std::string dataset;
  std::string model;
  ServeBenchOptions options;
  Slo slo;
};

std::string format_report(const BenchSummary& s, const BenchRunInfo& info);
nlohmann::json report_json(const BenchSummary& s, const ServeRun& run, const BenchRunInfo& info);

// One point of a concurrency sweep.
struct SweepPoint {
  int64_t max_concurrency;
  BenchSummary summary;
};
std::string format_sweep(const std::vector<SweepPoint>& points);

// Writes ttft_cdf.png and latency_over_time.png for `run` (and, with two or more sweep points,
// throughput_vs_ttft_p99.png) into `dir`, through gnuplot. A missing gnuplot is an error
// naming the package.
Status write_plots(const std::string& dir, const ServeRun& run, const std::vector<SweepPoint>& sweep);

}  // namespace inferd
