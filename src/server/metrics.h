// Prometheus metrics of the server, named and bucketed as vLLM's (so vLLM dashboards work with
// --metrics-prefix vllm), labelled by model_name. Kept in a prometheus-cpp registry (Debian's
// prometheus-cpp-dev); /metrics serves its text exposition. Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include "engine/slo.h"

namespace inferd {

// What one finished request (one sample) contributes.
struct RequestTimings {
  double queue_seconds = 0;    // arrival -> first scheduled
  double prefill_seconds = 0;  // first scheduled -> first token
  double decode_seconds = 0;   // first token -> last token
  double ttft_seconds = 0;     // arrival -> first token
  double e2e_seconds = 0;      // arrival -> finished
  int64_t prompt_tokens = 0;
  int64_t generation_tokens = 0;
  std::string finished_reason;  // stop, length, abort, error
  bool has_first_token = false;
  int32_t slo_class = -1;  // its SLO class (index into the classes given to set_slo_classes), or -1
};

// Cumulative figures of one KV offload tier (disk, redis), as the engine counts them.
struct OffloadTierFigures {
  std::string tier;
  int64_t writes = 0, write_bytes = 0, reads = 0, read_bytes = 0, failures = 0, corrupt = 0;
  bool up = true;
};

// Cumulative figures of KV transfers between instances (docs/disaggregation.md), per side.
struct TransferFigures {
  std::string side;  // "prefill" (pulls served) or "decode" (pulls made)
  int64_t pulls = 0, blocks = 0, bytes = 0, failures = 0, corrupt = 0, micros = 0;
};

class ServerMetrics final {
 public:
  // prefix: "inferd" or "vllm"; max_model_len bounds the token-count buckets (1-2-5 series).
  ServerMetrics(const std::string& prefix, const std::string& model_name, int64_t max_model_len);

  void observe_finished(const RequestTimings& t);
  void observe_inter_token(double seconds);
  void add_prompt_tokens(int64_t n);
  void add_generation_tokens(int64_t n);
  // One request answered with an error (HTTP status >= 400, or an error event in a stream with the
  // status it would have had), by status. Thread-safe.
  void add_error_response(int status);
  void set_scheduler_state(int64_t running, int64_t waiting, double kv_usage);
  // The batch window in force (seconds) and the measured arrival rate (requests per second).
  void set_batch_window(double seconds, double arrival_rate);
  // The engine's cumulative counts; call from one thread.
  void set_preemptions(int64_t total);
  void set_prefix_cache(int64_t query_tokens, int64_t hit_tokens);
  void set_sessions(int64_t active, int64_t pinned_blocks);
  void set_revived_blocks(int64_t total);
  void set_offload(std::span<const OffloadTierFigures> tiers, int64_t dropped_writes);
  void set_transfer(const TransferFigures& t);
  // KV loads (tiers and pulls) that failed / timed out; prefill: the export buffer's state.
  void set_kv_loads(int64_t failures, int64_t timeouts);
  // Speculative decoding: verifications, draft tokens proposed, draft tokens accepted (totals).
  void set_spec_decode(int64_t drafts, int64_t draft_tokens, int64_t accepted_tokens);
  void set_kv_export(int64_t entries, int64_t bytes, int64_t expired, int64_t refused);

  // LoRA: one finished request (sample) of adapter `name`; the resident adapters; one adapter
  // load from disk. Thread-safe.
  void observe_lora_finished(const std::string& name, int64_t prompt_tokens, int64_t generation_tokens);
  void set_lora_residency(int64_t resident, int64_t max_loras);
  void observe_lora_load(double seconds);

  // SLO classes: one series per class (label slo_class) of TTFT, TPOT, and requests by outcome:
  // met (goodput: its first token within the class's TTFT and its time per output token within
  // its TPOT), ttft_missed, tpot_missed, refused (429 at arrival), failed (error or abort).
  // Call once, before requests finish.
  void set_slo_classes(const SloClasses& classes);
  void observe_slo_refused(size_t slo_class);

  // The text exposition format (version 0.0.4).
  std::string render() const;

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Histogram *ttft_, *tpot_, *itl_, *e2e_, *queue_, *prefill_, *decode_, *prompt_tokens_,
      *generation_tokens_;
  prometheus::Gauge *batch_window_ = nullptr, *arrival_rate_ = nullptr;
  prometheus::Gauge *running_, *waiting_, *kv_usage_, *sessions_, *pinned_blocks_, *prefix_hit_rate_;
  prometheus::Counter *prompt_total_, *generation_total_, *preemptions_, *prefix_queries_, *prefix_hits_;
  prometheus::Family<prometheus::Counter>* success_;
  prometheus::Family<prometheus::Counter>* errors_;  // label status
  prometheus::Counter *revived_, *offload_dropped_;
  // Offload families, one series per tier (label tier), added when a tier is first reported.
  prometheus::Family<prometheus::Counter>*offload_writes_, *offload_write_bytes_, *offload_reads_,
      *offload_read_bytes_, *offload_failures_, *offload_corrupt_;
  prometheus::Family<prometheus::Gauge>* offload_up_;
  std::string model_name_, prefix_;
  SloClasses slo_;
  std::vector<prometheus::Histogram*> slo_ttft_, slo_tpot_;
  std::vector<std::map<std::string, prometheus::Counter*>> slo_outcomes_;  // per class, by outcome
  int64_t preemptions_seen_ = 0, prefix_queries_seen_ = 0, prefix_hits_seen_ = 0, revived_seen_ = 0,
          offload_dropped_seen_ = 0;
  std::map<std::string, OffloadTierFigures> offload_seen_;  // by tier
  prometheus::Family<prometheus::Counter>*transfer_pulls_, *transfer_blocks_, *transfer_bytes_,
      *transfer_failures_, *transfer_corrupt_, *transfer_seconds_;
  std::map<std::string, TransferFigures> transfer_seen_;  // by side
  prometheus::Counter *kv_load_failures_, *kv_load_timeouts_, *export_expired_, *export_refused_;
  prometheus::Counter *spec_drafts_, *spec_draft_tokens_, *spec_accepted_;
  prometheus::Gauge *export_entries_, *export_bytes_;
  prometheus::Family<prometheus::Counter>*lora_requests_, *lora_prompt_tokens_, *lora_generation_tokens_;
  prometheus::Gauge *lora_resident_, *lora_max_;
  prometheus::Histogram* lora_load_;
  int64_t spec_drafts_seen_ = 0, spec_draft_tokens_seen_ = 0, spec_accepted_seen_ = 0;
  int64_t kv_load_failures_seen_ = 0, kv_load_timeouts_seen_ = 0, export_expired_seen_ = 0,
          export_refused_seen_ = 0;
};

}  // namespace inferd
