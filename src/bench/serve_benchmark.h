// ServeBenchmark: `inferd bench serve`, a load generator for any OpenAI-compatible server
// (inferd, llama.cpp's llama-server, vLLM). Requests of a BenchDataset are sent streamed at
// Poisson (gamma) arrival times, at most max_concurrency at once, each with a deadline; every
// chunk's arrival is timed and the run is summarised by BenchStats. One thread, Boost.Asio
// coroutines: thousands of requests in flight cost no threads.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "bench/bench_dataset.h"
#include "bench/bench_stats.h"
#include "common/status.h"

namespace inferd {

struct ServeBenchOptions {
  std::string base_url = "http://127.0.0.1:8000";
  std::string endpoint = "/v1/completions";  // or /v1/chat/completions
  std::string model;                         // "model" field; empty = ask /v1/models
  std::string api_key;
  double request_rate = std::numeric_limits<double>::infinity();  // requests/s; inf = all at once
  double burstiness = 1.0;      // gamma shape: 1 = Poisson, < 1 burstier, > 1 steadier
  int64_t max_concurrency = 0;  // 0 = no limit
  uint64_t seed = 0;
  double request_timeout = 600;  // seconds per request (stalls included)
  bool ignore_eos = true;
  // Each conversation's turns carry one "session_id" (the server's session context pool pins a
  // turn's KV for the next): "bench-<seed>-<conversation>".
  bool session_ids = false;
  bool progress = true;  // a live progress line on stderr

  Status validate() const;
};

// Where the server is: from --base-url http://host:port[/prefix].
struct HttpTarget {
  std::string host;
  std::string port;
  std::string path_prefix;  // "" or "/prefix" (no trailing slash)
  static Expected<HttpTarget> parse(const std::string& url);
};

struct ServeRun {
  std::vector<RequestRecord> records;  // one per request sent, in sending order
  double duration = 0;
};

// Runs the items against the server; never hangs (each request has its deadline) and never
// throws: failures are records with an error.
Expected<ServeRun> run_serve_benchmark(const ServeBenchOptions& options, const std::vector<BenchItem>& items);

// Send times (seconds from the start) of n conversations: gamma gaps of mean 1 / rate with shape
// `burstiness` (1 = Poisson), the first at 0, as vLLM's benchmark draws them; all 0 for rate inf.
std::vector<double> arrival_times(size_t n, double rate, double burstiness, uint64_t seed);

// Asks GET /v1/models for the first model id (when --model is not given).
Expected<std::string> first_served_model(const ServeBenchOptions& options);

}  // namespace inferd
