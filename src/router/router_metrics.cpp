#include "router/router_metrics.h"

#include <prometheus/text_serializer.h>

namespace inferd {

namespace {

using prometheus::Histogram;

const Histogram::BucketBoundaries kRoundTripBuckets = {0.005, 0.01, 0.02, 0.05, 0.1,  0.2,  0.5,  1.0,
                                                       2.0,   5.0,  10.0, 20.0, 40.0, 80.0, 160.0};
const Histogram::BucketBoundaries kOverheadBuckets = {0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025,
                                                      0.005,   0.01,   0.025,   0.05,   0.1,   0.25};

}  // namespace

RouterMetrics::RouterMetrics() : registry_(std::make_shared<prometheus::Registry>()) {
  const std::string p = "inferd_router:";
  auto counters = [&](const char* name, const char* help) {
    return &prometheus::BuildCounter().Name(p + name).Help(help).Register(*registry_);
  };
  auto gauges = [&](const char* name, const char* help) {
    return &prometheus::BuildGauge().Name(p + name).Help(help).Register(*registry_);
  };
  auto histogram = [&](const char* name, const char* help, const Histogram::BucketBoundaries& b) {
    return &prometheus::BuildHistogram().Name(p + name).Help(help).Register(*registry_).Add({}, b);
  };
  requests_ = counters("requests_total", "Requests (and prefill legs) sent to an instance.");
  errors_ = counters("errors_total", "Failures the router saw or answered, by kind.");
  ejections_ = counters("ejections_total", "Times an instance was taken out of rotation.");
  decisions_ = counters("disagg_decisions_total", "Routing decisions: disaggregated or direct, and why.");
  up_ = gauges("instance_up", "1 while an instance passes its health checks, 0 while it is ejected.");
  in_flight_ = gauges("instance_in_flight", "The router's requests in flight at an instance.");
  retries_ = &counters("retries_total", "Requests resent to another instance after a failure.")->Add({});
  responses_located_ =
      &counters("responses_located_total",
                "Stored responses the router did not know of, found by asking the instances.")
           ->Add({});
  prefix_matched_ = &counters("prefix_matched_chars_total",
                              "Prompt bytes the chosen instance's prefix index already held (hit estimate).")
                         ->Add({});
  prefix_prompt_ = &counters("prefix_prompt_chars_total", "Prompt bytes routed.")->Add({});
  transfer_bytes_ =
      &counters("kv_transfer_bytes_total", "KV bytes prefill instances reported (kv_transfer_params.bytes).")
           ->Add({});
  prefill_seconds_ =
      histogram("prefill_round_trip_seconds", "Prefill request sent -> its reply read.", kRoundTripBuckets);
  overhead_seconds_ = histogram(
      "overhead_seconds", "Time in the router before the upstream request was written.", kOverheadBuckets);
  for (const char* kind : {"connect", "timeout", "upstream_5xx", "mid_stream", "no_instance", "bad_request"})
    errors_->Add({{"kind", kind}});
}

prometheus::Labels RouterMetrics::labels(const InstanceSpec& instance) {
  return {{"instance", instance.url}, {"role", role_name(instance.role)}};
}

void RouterMetrics::routed(const InstanceSpec& instance) {
  requests_->Add(labels(instance)).Increment();
}
void RouterMetrics::response_located() {
  responses_located_->Increment();
}

void RouterMetrics::retried() {
  retries_->Increment();
}
void RouterMetrics::error(const std::string& kind) {
  errors_->Add({{"kind", kind}}).Increment();
}
void RouterMetrics::ejected(const InstanceSpec& instance) {
  ejections_->Add(labels(instance)).Increment();
}
void RouterMetrics::set_up(const InstanceSpec& instance, bool up) {
  up_->Add(labels(instance)).Set(up ? 1.0 : 0.0);
}
void RouterMetrics::set_in_flight(const InstanceSpec& instance, int64_t in_flight) {
  in_flight_->Add(labels(instance)).Set(static_cast<double>(in_flight));
}
void RouterMetrics::prefix(size_t matched_bytes, size_t prompt_bytes) {
  prefix_matched_->Increment(static_cast<double>(matched_bytes));
  prefix_prompt_->Increment(static_cast<double>(prompt_bytes));
}
void RouterMetrics::decision(bool disaggregated, const std::string& reason) {
  decisions_->Add({{"decision", disaggregated ? "disaggregated" : "direct"}, {"reason", reason}}).Increment();
}
void RouterMetrics::prefill_round_trip(double seconds) {
  prefill_seconds_->Observe(seconds);
}
void RouterMetrics::transfer_bytes(double bytes) {
  transfer_bytes_->Increment(bytes);
}
void RouterMetrics::overhead(double seconds) {
  overhead_seconds_->Observe(seconds);
}

std::string RouterMetrics::render() const {
  return prometheus::TextSerializer().Serialize(registry_->Collect());
}

}  // namespace inferd
