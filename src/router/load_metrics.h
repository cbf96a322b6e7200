// InstanceLoad: what an instance's GET /metrics says about its load, read from vLLM-named
// gauges (inferd exports `<prefix>:num_requests_running`, `:num_requests_waiting` and
// `:kv_cache_usage_perc`; older vLLM `:gpu_cache_usage_perc`). The router's health loop scrapes
// it for the least-load and cache-aware policies.
#pragma once

#include <string_view>

namespace inferd {

struct InstanceLoad {
  double running = 0;  // sum over the series (one per model_name)
  double waiting = 0;
  double kv_usage = 0;  // 0..1; the largest series
  bool found_running = false;
  bool found_waiting = false;
  bool found_kv_usage = false;
};

// Parses Prometheus text exposition: comment lines skipped, a sample's metric name matched by
// suffix (so any prefix: inferd:, vllm:), labels ignored, bad lines skipped.
InstanceLoad parse_load_metrics(std::string_view text);

}  // namespace inferd
