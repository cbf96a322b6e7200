// RouterMetrics: the router's own Prometheus metrics (GET /metrics of `inferd router`), named
// in the server's `prefix:name` style under `inferd_router:`. Kept in a prometheus-cpp
// registry. Thread-safe (prometheus-cpp's series are), though the router calls it from its
// I/O thread only.
#pragma once

#include <memory>
#include <string>

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include "router/instance_spec.h"

namespace inferd {

class RouterMetrics final {
 public:
  RouterMetrics();

  // A request (or a prefill leg) sent to an instance.
  void routed(const InstanceSpec& instance);
  void retried();
  // A stored response the router did not know of, found by asking the instances.
  void response_located();
  // kind: connect, timeout, upstream_5xx, mid_stream, no_instance, bad_request, unauthorized,
  // prefill_failed, client_gone.
  void error(const std::string& kind);
  void ejected(const InstanceSpec& instance);
  void set_up(const InstanceSpec& instance, bool up);
  void set_in_flight(const InstanceSpec& instance, int64_t in_flight);
  // The prompt bytes a request had and those its chosen instance's index already held.
  void prefix(size_t matched_bytes, size_t prompt_bytes);
  // decision: disaggregated or direct; reason: DisaggDecision::reason.
  void decision(bool disaggregated, const std::string& reason);
  void prefill_round_trip(double seconds);
  void transfer_bytes(double bytes);
  // Time in the router before the upstream request was written (parse, plan, connect).
  void overhead(double seconds);

  std::string render() const;

 private:
  static prometheus::Labels labels(const InstanceSpec& instance);

  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Counter>*requests_, *errors_, *ejections_, *decisions_;
  prometheus::Family<prometheus::Gauge>*up_, *in_flight_;
  prometheus::Counter *retries_, *responses_located_, *prefix_matched_, *prefix_prompt_, *transfer_bytes_;
  prometheus::Histogram *prefill_seconds_, *overhead_seconds_;
};

}  // namespace inferd
