#include "server/metrics.h"

#include <algorithm>

#include <prometheus/text_serializer.h>

namespace inferd {

namespace {

using prometheus::Histogram;

// vLLM's buckets (vllm/v1/metrics/loggers.py), so the series compare one to one.
const Histogram::BucketBoundaries kTtftBuckets = {0.001, 0.005, 0.01, 0.02,  0.04,  0.06,  0.08, 0.1,
                                                  0.25,  0.5,   0.75, 1.0,   2.5,   5.0,   7.5,  10.0,
                                                  20.0,  40.0,  80.0, 160.0, 640.0, 2560.0};
const Histogram::BucketBoundaries kTokenLatencyBuckets = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,
                                                          0.3,  0.4,   0.5,  0.75,  1.0, 2.5,  5.0,
                                                          7.5,  10.0,  20.0, 40.0,  80.0};
const Histogram::BucketBoundaries kRequestLatencyBuckets = {0.3,  0.5,   0.8,   1.0,   1.5,   2.0,    2.5,
                                                            5.0,  10.0,  15.0,  20.0,  30.0,  40.0,   50.0,
                                                            60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};

// 1, 2, 5, 10, 20, 50, ... up to `max` (vLLM's build_1_2_5_buckets).
Histogram::BucketBoundaries buckets_1_2_5(int64_t max) {
  Histogram::BucketBoundaries b;
  for (int64_t scale = 1;; scale *= 10) {
    for (int64_t m : {1, 2, 5}) {
      if (m * scale > max) return b;
      b.push_back(static_cast<double>(m * scale));
    }
  }
}

}  // namespace

ServerMetrics::ServerMetrics(const std::string& prefix, const std::string& model_name, int64_t max_model_len)
    : registry_(std::make_shared<prometheus::Registry>()), model_name_(model_name), prefix_(prefix) {
  const prometheus::Labels labels = {{"model_name", model_name}};
  auto histogram = [&](const char* name, const char* help, const Histogram::BucketBoundaries& buckets) {
    return &prometheus::BuildHistogram()
                .Name(prefix + ":" + name)
                .Help(help)
                .Register(*registry_)
                .Add(labels, buckets);
  };
  auto gauge = [&](const char* name, const char* help) {
    return &prometheus::BuildGauge().Name(prefix + ":" + name).Help(help).Register(*registry_).Add(labels);
  };
  // prometheus-cpp writes counters under the name given: the _total suffix is part of it.
  auto counter = [&](const char* name, const char* help) {
    return &prometheus::BuildCounter().Name(prefix + ":" + name).Help(help).Register(*registry_).Add(labels);
  };
  ttft_ =
      histogram("time_to_first_token_seconds", "Histogram of time to first token in seconds.", kTtftBuckets);
  tpot_ = histogram("time_per_output_token_seconds", "Histogram of time per output token in seconds.",
                    kTokenLatencyBuckets);
  itl_ = histogram("inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                   kTokenLatencyBuckets);
  e2e_ = histogram("e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
                   kRequestLatencyBuckets);
  queue_ = histogram("request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.",
                     kRequestLatencyBuckets);
  prefill_ = histogram("request_prefill_time_seconds",
                       "Histogram of time spent in PREFILL phase for request.", kRequestLatencyBuckets);
  decode_ = histogram("request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.",
                      kRequestLatencyBuckets);
  const auto token_buckets = buckets_1_2_5(max_model_len);
  prompt_tokens_ = histogram("request_prompt_tokens", "Number of prefill tokens processed.", token_buckets);
  generation_tokens_ =
      histogram("request_generation_tokens", "Number of generation tokens processed.", token_buckets);
  running_ = gauge("num_requests_running", "Number of requests in model execution batches.");
  batch_window_ =
      gauge("batch_window_seconds",
            "How long a step that would only prefill new arrivals may wait for more (--batch-window).");
  arrival_rate_ =
      gauge("arrival_rate_requests_per_second", "Requests submitted per second (moving average).");
  waiting_ = gauge("num_requests_waiting", "Number of requests waiting to be processed.");
  kv_usage_ = gauge("kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.");
  sessions_ = gauge("active_sessions", "Sessions whose last turn's KV blocks are pinned.");
  pinned_blocks_ = gauge("session_pinned_blocks", "KV blocks pinned for sessions.");
  prompt_total_ = counter("prompt_tokens_total", "Number of prefill tokens processed.");
  generation_total_ = counter("generation_tokens_total", "Number of generation tokens processed.");
  preemptions_ = counter("num_preemptions_total", "Cumulative number of preemption from the engine.");
  prefix_queries_ =
      counter("prefix_cache_queries_total", "Prefix cache queries, in terms of number of queried tokens.");
  prefix_hits_ =
      counter("prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens.");
  prefix_hit_rate_ = gauge("prefix_cache_hit_rate",
                           "Share of queried prompt tokens found in the prefix cache since start (0..1).");
  revived_ = counter("kv_revived_blocks_total",
                     "Freed KV blocks taken back from the free queue by a prefix cache hit.");
  offload_dropped_ = counter("kv_offload_dropped_writes_total",
                             "Cold KV blocks not offloaded because every staging slot was busy.");
  auto counter_family = [&](const char* name, const char* help) {
    return &prometheus::BuildCounter().Name(prefix + ":" + name).Help(help).Register(*registry_);
  };
  offload_writes_ = counter_family("kv_offload_writes_total", "KV blocks written to an offload tier.");
  offload_write_bytes_ =
      counter_family("kv_offload_write_bytes_total", "Bytes of KV blocks written to an offload tier.");
  offload_reads_ =
      counter_family("kv_offload_reads_total", "KV blocks loaded back from an offload tier (prefix hits).");
  offload_read_bytes_ =
      counter_family("kv_offload_read_bytes_total", "Bytes of KV blocks loaded back from an offload tier.");
  offload_failures_ = counter_family(
      "kv_offload_failures_total", "Offload tier I/O errors, timeouts and writes skipped while it was down.");
  offload_corrupt_ = counter_family("kv_offload_corrupt_blocks_total",
                                    "Stored KV blocks that failed their check when read back (recomputed).");
  transfer_pulls_ = counter_family(
      "kv_transfer_pulls_total",
      "KV pulls between instances that moved every block (side: prefill served, decode made).");
  transfer_blocks_ = counter_family("kv_transfer_blocks_total", "KV blocks moved between instances.");
  transfer_bytes_ = counter_family("kv_transfer_bytes_total", "Bytes of KV records moved between instances.");
  transfer_failures_ = counter_family("kv_transfer_failures_total",
                                      "KV pulls that failed (peer gone, unknown transfer, bad record).");
  transfer_corrupt_ = counter_family("kv_transfer_corrupt_blocks_total",
                                     "Pulled KV blocks that failed their check (recomputed).");
  transfer_seconds_ =
      counter_family("kv_transfer_seconds_total", "Seconds from pull start to blocks imported.");
  kv_load_failures_ =
      counter("kv_load_failures_total", "KV loads (tiers, pulls) that failed; handled by --kv-load-failure.");
  kv_load_timeouts_ =
      counter("kv_load_timeouts_total", "KV loads (tiers, pulls) given up after --kv-load-timeout.");
  lora_requests_ =
      counter_family("lora_requests_total", "Finished requests (samples) per LoRA adapter (lora_name).");
  lora_prompt_tokens_ =
      counter_family("lora_prompt_tokens_total", "Prompt tokens per LoRA adapter (lora_name).");
  lora_generation_tokens_ =
      counter_family("lora_generation_tokens_total", "Generated tokens per LoRA adapter (lora_name).");
  spec_drafts_ =
      counter("spec_decode_num_drafts_total", "Speculative decoding: verifications of a request's drafts.");
  spec_draft_tokens_ =
      counter("spec_decode_num_draft_tokens_total", "Speculative decoding: draft tokens proposed.");
  spec_accepted_ =
      counter("spec_decode_num_accepted_tokens_total", "Speculative decoding: draft tokens accepted.");
  lora_resident_ = gauge("lora_resident_adapters", "LoRA adapters resident in memory.");
  lora_max_ =
      gauge("lora_max_resident_adapters", "LoRA adapters that may be resident at once (--max-loras).");
  lora_load_ = histogram("lora_load_seconds", "Histogram of LoRA adapter load time from disk in seconds.",
                         {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0});
  export_entries_ = gauge("kv_export_entries", "Prefill: prompts whose KV waits for a pull.");
  export_bytes_ = gauge("kv_export_bytes", "Prefill: bytes of KV waiting for pulls.");
  export_expired_ =
      counter("kv_export_expired_total", "Prefill: prompts' KV dropped unpulled at the end of the lease.");
  export_refused_ =
      counter("kv_export_refused_total", "Prefill: prompts' KV not kept: the export buffer was full.");
  offload_up_ = &prometheus::BuildGauge()
                     .Name(prefix + ":kv_offload_tier_up")
                     .Help("1 while an offload tier answers, 0 while inferd runs without it.")
                     .Register(*registry_);
  success_ = &prometheus::BuildCounter()
                  .Name(prefix + ":request_success_total")
                  .Help("Count of successfully processed requests.")
                  .Register(*registry_);
  for (const char* reason : {"stop", "length", "abort"})
    success_->Add({{"model_name", model_name}, {"finished_reason", reason}});
  errors_ = &prometheus::BuildCounter()
                 .Name(prefix + ":request_errors_total")
                 .Help("Requests answered with an error, by HTTP status (inferd's; vLLM has none).")
                 .Register(*registry_);
  for (const char* status : {"400", "429", "500"})
    errors_->Add({{"model_name", model_name}, {"status", status}});
}

void ServerMetrics::set_slo_classes(const SloClasses& classes) {
  slo_ = classes;
  if (slo_.empty()) return;
  const std::string prefix = prefix_;
  auto& ttft = prometheus::BuildHistogram()
                   .Name(prefix + ":slo_time_to_first_token_seconds")
                   .Help("Time to first token by SLO class.")
                   .Register(*registry_);
  auto& tpot = prometheus::BuildHistogram()
                   .Name(prefix + ":slo_time_per_output_token_seconds")
                   .Help("Time per output token by SLO class.")
                   .Register(*registry_);
  auto& outcomes =
      prometheus::BuildCounter()
          .Name(prefix + ":slo_requests_total")
          .Help(
              "Requests by SLO class and outcome (met = goodput; ttft_missed, tpot_missed, refused, "
              "failed).")
          .Register(*registry_);
  for (const SloClass& c : slo_.classes()) {
    const prometheus::Labels labels = {{"model_name", model_name_}, {"slo_class", c.name}};
    slo_ttft_.push_back(&ttft.Add(labels, kTtftBuckets));
    slo_tpot_.push_back(&tpot.Add(labels, kTokenLatencyBuckets));
    std::map<std::string, prometheus::Counter*> by_outcome;
    for (const char* outcome : {"met", "ttft_missed", "tpot_missed", "refused", "failed"}) {
      prometheus::Labels l = labels;
      l.emplace("outcome", outcome);
      by_outcome[outcome] = &outcomes.Add(l);
    }
    slo_outcomes_.push_back(std::move(by_outcome));
  }
}

void ServerMetrics::observe_slo_refused(size_t slo_class) {
  if (slo_class < slo_outcomes_.size()) slo_outcomes_[slo_class].at("refused")->Increment();
}

void ServerMetrics::observe_finished(const RequestTimings& t) {
  if (t.slo_class >= 0 && static_cast<size_t>(t.slo_class) < slo_outcomes_.size()) {
    const auto c = static_cast<size_t>(t.slo_class);
    const SloClass& cls = slo_.at(c);
    const bool ok = t.finished_reason == "stop" || t.finished_reason == "length";
    const double tpot =
        t.generation_tokens > 1 ? t.decode_seconds / static_cast<double>(t.generation_tokens - 1) : 0;
    if (t.has_first_token) slo_ttft_[c]->Observe(t.ttft_seconds);
    if (t.has_first_token && t.generation_tokens > 1) slo_tpot_[c]->Observe(tpot);
    const char* outcome = !ok || !t.has_first_token           ? "failed"
                          : t.ttft_seconds > cls.ttft_seconds ? "ttft_missed"
                          : tpot > cls.tpot_seconds           ? "tpot_missed"
                                                              : "met";
    slo_outcomes_[c].at(outcome)->Increment();
  }
  e2e_->Observe(t.e2e_seconds);
  queue_->Observe(t.queue_seconds);
  prompt_tokens_->Observe(static_cast<double>(t.prompt_tokens));
  generation_tokens_->Observe(static_cast<double>(t.generation_tokens));
  if (t.has_first_token) {
    ttft_->Observe(t.ttft_seconds);
    prefill_->Observe(t.prefill_seconds);
    decode_->Observe(t.decode_seconds);
    if (t.generation_tokens > 1)
      tpot_->Observe(t.decode_seconds / static_cast<double>(t.generation_tokens - 1));
  }
  if (t.finished_reason != "error")
    success_->Add({{"model_name", model_name_}, {"finished_reason", t.finished_reason}}).Increment();
}

void ServerMetrics::observe_inter_token(double seconds) {
  itl_->Observe(seconds);
}
void ServerMetrics::add_error_response(int status) {
  errors_->Add({{"model_name", model_name_}, {"status", std::to_string(status)}}).Increment();
}

void ServerMetrics::add_prompt_tokens(int64_t n) {
  prompt_total_->Increment(static_cast<double>(n));
}
void ServerMetrics::add_generation_tokens(int64_t n) {
  generation_total_->Increment(static_cast<double>(n));
}

void ServerMetrics::set_batch_window(double seconds, double arrival_rate) {
  batch_window_->Set(seconds);
  arrival_rate_->Set(arrival_rate);
}

void ServerMetrics::set_scheduler_state(int64_t running, int64_t waiting, double kv_usage) {
  running_->Set(static_cast<double>(running));
  waiting_->Set(static_cast<double>(waiting));
  kv_usage_->Set(kv_usage);
}

namespace {
// Adds to `counter` what a cumulative engine count gained since it was last seen.
void advance(prometheus::Counter* counter, int64_t total, int64_t* seen) {
  if (total > *seen) {
    counter->Increment(static_cast<double>(total - *seen));
    *seen = total;
  }
}
}  // namespace

void ServerMetrics::set_preemptions(int64_t total) {
  advance(preemptions_, total, &preemptions_seen_);
}

void ServerMetrics::set_prefix_cache(int64_t query_tokens, int64_t hit_tokens) {
  advance(prefix_queries_, query_tokens, &prefix_queries_seen_);
  advance(prefix_hits_, hit_tokens, &prefix_hits_seen_);
  prefix_hit_rate_->Set(query_tokens > 0 ? static_cast<double>(hit_tokens) / static_cast<double>(query_tokens)
                                         : 0.0);
}

void ServerMetrics::set_revived_blocks(int64_t total) {
  advance(revived_, total, &revived_seen_);
}

void ServerMetrics::set_offload(std::span<const OffloadTierFigures> tiers, int64_t dropped_writes) {
  advance(offload_dropped_, dropped_writes, &offload_dropped_seen_);
  for (const OffloadTierFigures& t : tiers) {
    const prometheus::Labels labels = {{"model_name", model_name_}, {"tier", t.tier}};
    OffloadTierFigures& seen = offload_seen_[t.tier];
    advance(&offload_writes_->Add(labels), t.writes, &seen.writes);
    advance(&offload_write_bytes_->Add(labels), t.write_bytes, &seen.write_bytes);
    advance(&offload_reads_->Add(labels), t.reads, &seen.reads);
    advance(&offload_read_bytes_->Add(labels), t.read_bytes, &seen.read_bytes);
    advance(&offload_failures_->Add(labels), t.failures, &seen.failures);
    advance(&offload_corrupt_->Add(labels), t.corrupt, &seen.corrupt);
    offload_up_->Add(labels).Set(t.up ? 1.0 : 0.0);
  }
}

void ServerMetrics::set_transfer(const TransferFigures& t) {
  const prometheus::Labels labels = {{"model_name", model_name_}, {"side", t.side}};
  TransferFigures& seen = transfer_seen_[t.side];
  advance(&transfer_pulls_->Add(labels), t.pulls, &seen.pulls);
  advance(&transfer_blocks_->Add(labels), t.blocks, &seen.blocks);
  advance(&transfer_bytes_->Add(labels), t.bytes, &seen.bytes);
  advance(&transfer_failures_->Add(labels), t.failures, &seen.failures);
  advance(&transfer_corrupt_->Add(labels), t.corrupt, &seen.corrupt);
  auto& seconds = transfer_seconds_->Add(labels);
  if (t.micros > seen.micros) seconds.Increment(static_cast<double>(t.micros - seen.micros) * 1e-6);
  seen.micros = std::max(seen.micros, t.micros);
}

void ServerMetrics::set_kv_loads(int64_t failures, int64_t timeouts) {
  advance(kv_load_failures_, failures, &kv_load_failures_seen_);
  advance(kv_load_timeouts_, timeouts, &kv_load_timeouts_seen_);
}

void ServerMetrics::set_spec_decode(int64_t drafts, int64_t draft_tokens, int64_t accepted_tokens) {
  advance(spec_drafts_, drafts, &spec_drafts_seen_);
  advance(spec_draft_tokens_, draft_tokens, &spec_draft_tokens_seen_);
  advance(spec_accepted_, accepted_tokens, &spec_accepted_seen_);
}

void ServerMetrics::set_kv_export(int64_t entries, int64_t bytes, int64_t expired, int64_t refused) {
  export_entries_->Set(static_cast<double>(entries));
  export_bytes_->Set(static_cast<double>(bytes));
  advance(export_expired_, expired, &export_expired_seen_);
  advance(export_refused_, refused, &export_refused_seen_);
}

void ServerMetrics::set_sessions(int64_t active, int64_t pinned_blocks) {
  sessions_->Set(static_cast<double>(active));
  pinned_blocks_->Set(static_cast<double>(pinned_blocks));
}

std::string ServerMetrics::render() const {
  return prometheus::TextSerializer().Serialize(registry_->Collect());
}

void ServerMetrics::observe_lora_finished(const std::string& name, int64_t prompt_tokens,
                                          int64_t generation_tokens) {
  const prometheus::Labels labels = {{"model_name", model_name_}, {"lora_name", name}};
  lora_requests_->Add(labels).Increment();
  lora_prompt_tokens_->Add(labels).Increment(static_cast<double>(prompt_tokens));
  lora_generation_tokens_->Add(labels).Increment(static_cast<double>(generation_tokens));
}

void ServerMetrics::set_lora_residency(int64_t resident, int64_t max_loras) {
  lora_resident_->Set(static_cast<double>(resident));
  lora_max_->Set(static_cast<double>(max_loras));
}

void ServerMetrics::observe_lora_load(double seconds) {
  lora_load_->Observe(seconds);
}

}  // namespace inferd
