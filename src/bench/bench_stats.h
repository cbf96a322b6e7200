// BenchStats: the figures of a serving benchmark, computed from per-request records with the
// definitions of vLLM's `vllm bench serve` so that figures compare one to one:
//   TTFT  request sent -> first streamed chunk with a non-empty choice;
//   ITL   every gap between successive such chunks (per chunk, not per token);
//   TPOT  (E2E - TTFT) / (output tokens - 1), per request with more than one output token;
//   E2E   request sent -> last byte; output tokens from the usage chunk.
// Percentiles interpolate linearly between order statistics (numpy's default).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"

namespace inferd {

// One request of a run. Times in seconds; `start` from the beginning of the run.
struct RequestRecord {
  bool success = false;
  std::string error;  // why it failed (HTTP status and message, timeout, connection refused)
  int64_t prompt_tokens = 0;
  int64_t output_tokens = 0;
  int64_t expected_output_tokens = 0;  // what the dataset asked for
  double start = 0;
  double ttft = 0;
  double latency = 0;
  std::vector<double> itl;  // gaps between chunks after the first
};

struct Distribution {
  int64_t count = 0;
  double mean = 0, stddev = 0, p50 = 0, p90 = 0, p95 = 0, p99 = 0, max = 0;
};

// q-th percentile (0..100) of ascending `sorted` values (numpy "linear"); 0 when empty.
double percentile(const std::vector<double>& sorted, double q);
Distribution summarize(std::vector<double> values);

// Service-level objectives for goodput (seconds); unset ones do not constrain.
struct Slo {
  std::optional<double> ttft, tpot, e2el;
};
// "ttft=500ms,tpot=100ms,e2el=2s" (units ms or s; a bare number is ms, as vLLM's --goodput).
Expected<Slo> parse_slo(const std::string& text);

struct BenchSummary {
  int64_t num_requests = 0, completed = 0, failed = 0;
  double duration = 0;  // seconds, first request sent -> last one done
  int64_t total_input_tokens = 0, total_output_tokens = 0;
  double request_throughput = 0, output_throughput = 0, total_token_throughput = 0;
  double goodput = 0;  // completed requests meeting every SLO, per second
  int64_t good_requests = 0;
  int64_t max_concurrency = 0;  // most requests in flight at one time
  Distribution ttft, tpot, itl, e2el;
};

// `duration`: the run's wall time in seconds.
BenchSummary summarize_run(const std::vector<RequestRecord>& records, double duration, const Slo& slo);

// Most records whose [start, start + latency) intervals overlap at one instant.
int64_t max_concurrency(const std::vector<RequestRecord>& records);

}  // namespace inferd
