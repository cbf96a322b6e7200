// Request: one generation request as the engine thread tracks it: its tokens, how many of them
// are computed (their K/V in the cache), its sampling settings and its state. Owned by the
// Scheduler; the engine thread alone reads and writes it.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/sampler.h"
#include "kernels/attention.h"
#include "kv/kv_cache_manager.h"
#include "model/lora_adapter.h"

namespace inferd {

// kWaitingForKv: its KV is coming from elsewhere (an offload tier, a prefill instance) into blocks
// it holds; it rejoins the waiting queue's front when they have landed (vLLM's WAITING_FOR_REMOTE_KVS).
enum class RequestState { kWaiting, kWaitingForKv, kRunning, kFinished };

enum class FinishReason { kStop, kLength, kAborted, kError };

// OpenAI's finish_reason spelling ("stop", "length", "abort", "error").
inline const char* finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kAborted: return "abort";
    case FinishReason::kError: break;
  }
  return "error";
}

// Pooling: what an embedding request (RequestSpec::pooling) makes of its prompt's final hidden
// states (after the model's last norm): the last token's (decoder embedding models: Qwen3-Embedding,
// gte-Qwen2, E5-Mistral), the mean over every token, or the first token's. kNone: a generation.
enum class Pooling { kNone, kLast, kMean, kCls };

// "last", "mean", "cls" (and "none"): vLLM's and llama.cpp's spellings, lower case.
inline const char* pooling_name(Pooling p) {
  switch (p) {
    case Pooling::kLast: return "last";
    case Pooling::kMean: return "mean";
    case Pooling::kCls: return "cls";
    case Pooling::kNone: break;
  }
  return "none";
}

struct GenerationLimits {
  int64_t max_tokens = 16;
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
};

struct Request {
  RequestId id = 0;
  std::vector<int32_t> prompt;
  std::vector<int32_t> output;
  SamplingParams sampling;
  GenerationLimits limits;
  int32_t priority = 0;                     // lower runs earlier (as in vLLM)
  std::string session_id;                   // non-empty: pin this turn's blocks for the session's next turn
  std::shared_ptr<const LoraAdapter> lora;  // null: the base model alone
  StreamingWindow streaming;                // off: full attention
  uint64_t arrival_order = 0;               // ties in priority go to the earlier arrival
  // SLO class (SchedulerOptions::slo; -1: none): its rank is the priority; among equal priorities
  // the earlier deadline (arrival + the class's TTFT) runs first.
  int32_t slo_class = -1;
  std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();

  RequestState state = RequestState::kWaiting;
  std::optional<FinishReason> finish_reason;  // set when it finished
  std::string error;                          // set with kError
  int64_t num_computed_tokens = 0;            // tokens whose K/V are in the cache
  // sampling.prompt_logprobs: the prompt token whose log-probability is due next (the first has
  // none); rows before it were emitted, so a recomputation after preemption does not repeat them.
  int64_t prompt_logprobs_next = 1;
  bool wants_prompt_logprobs() const {
    return sampling.prompt_logprobs.has_value() && prompt_logprobs_next < static_cast<int64_t>(prompt.size());
  }
  uint64_t kv_load_ticket = 0;  // kWaitingForKv: its load (KvBlockSource ticket)
  // Decode side of disaggregation: the prompt's KV is pulled from a prefill instance (the first
  // output token came with it); reset once a pull ended, so a later admission computes instead.
  std::optional<RemoteKvRef> remote_kv;
  uint64_t kv_export_id = 0;  // prefill side: non-zero = keep the prompt's KV for a pull under this id
  bool kv_load_done = false;  // a load ran for this admission: what did not arrive is computed
  int64_t num_preemptions = 0;
  std::optional<int64_t> scheduled_in_step;  // the scheduler's step counter when last scheduled
  std::optional<std::chrono::steady_clock::time_point> first_scheduled;  // when it first ran
  int64_t cached_tokens = 0;  // prompt tokens the prefix cache held when it first ran

  // n > 1: the caller sees one request (`group`, its id) with samples 0..num_samples-1. Sample 0
  // is this request; after its prompt is computed the engine forks samples 1..n-1 from it, each
  // its own Request sharing the prompt's KV blocks.
  RequestId group = 0;
  int32_t sample_index = 0;
  int32_t num_samples = 1;
  bool forked = false;

  // Speculative decoding: this step's proposed next tokens after the last output token (set by
  // the scheduler, verified by the engine with the step's logits, cleared by update()). Not part
  // of num_tokens(); their K/V is computed this step and kept only for the accepted ones.
  std::vector<int32_t> draft;
  // Back-off after drafts that were all rejected: the steps to skip drafting, and the skip the
  // next all-rejected draft sets (doubling, up to 32; reset by an accepted draft).
  int32_t spec_skip = 0;
  int32_t spec_backoff = 0;
  // Predicted outputs (RequestSpec::prediction): the tokens drafts are taken from, where the
  // last match ended in them, and whether this step's draft is theirs.
  std::shared_ptr<const std::vector<int32_t>> prediction;
  int64_t prediction_cursor = 0;
  BlockHash cache_salt;  // mixed into its blocks' hash-chain root (zero: none)
  bool draft_from_prediction = false;
  // An embedding request: it ends once its prompt is computed, with the pooled hidden state
  // (L2-normalized when asked) instead of a sampled token. `pooled` sums the rows seen so far.
  Pooling pooling = Pooling::kNone;
  bool normalize_embedding = true;
  std::vector<double> pooled;
  // Mean and first-token pooling need every prompt row computed here: no cached prefix.
  bool pools_every_row() const { return pooling == Pooling::kMean || pooling == Pooling::kCls; }

  // No phases: a request just has tokens, some computed. Prefill = many uncomputed tokens.
  int64_t num_tokens() const { return static_cast<int64_t>(prompt.size() + output.size()); }
  int64_t num_uncomputed_tokens() const { return num_tokens() - num_computed_tokens; }
  // The token at `pos` of prompt, output, then draft.
  int32_t token_at(int64_t pos) const {
    const auto p = static_cast<size_t>(pos);
    if (p < prompt.size()) return prompt[p];
    return p - prompt.size() < output.size() ? output[p - prompt.size()]
                                             : draft[p - prompt.size() - output.size()];
  }
};

// Whether `token` ends the request (one of its stop token ids, unless it ignores EOS).
inline bool is_stop_token(const Request& r, int32_t token) {
  if (r.limits.ignore_eos) return false;
  return std::find(r.limits.stop_token_ids.begin(), r.limits.stop_token_ids.end(), token) !=
         r.limits.stop_token_ids.end();
}

}  // namespace inferd
