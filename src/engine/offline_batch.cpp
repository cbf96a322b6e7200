#include "engine/offline_batch.h"

#include <algorithm>
#include <chrono>
#include <optional>
#include <unordered_map>

#include "engine/output_processor.h"

namespace inferd {

namespace {

using json = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

template <typename T>
Status read_number(const json& j, const char* key, T* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return Status::ok();
  if (!it->is_number()) return invalid_argument(std::string("field '") + key + "' must be a number");
  *out = it->get<T>();
  return Status::ok();
}

Status read_ids(const json& j, const char* key, std::vector<int32_t>* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return Status::ok();
  if (!it->is_array())
    return invalid_argument(std::string("field '") + key + "' must be an array of token ids");
  for (const auto& v : *it) {
    if (!v.is_number_integer())
      return invalid_argument(std::string("field '") + key + "' must be an array of token ids");
    out->push_back(v.get<int32_t>());
  }
  return Status::ok();
}

Status read_prompt(const json& j, GenerationRequest* r) {
  if (auto p = j.find("prompt"); p != j.end()) {
    if (!p->is_string()) return invalid_argument("field 'prompt' must be a string");
    r->prompts.push_back({p->get<std::string>(), {}, false});
  } else if (j.contains("prompt_ids")) {
    PromptInput in;
    in.is_ids = true;
    INFERD_RETURN_IF_ERROR(read_ids(j, "prompt_ids", &in.ids));
    r->prompts.push_back(std::move(in));
  } else if (auto m = j.find("messages"); m != j.end()) {
    if (!m->is_array() || m->empty()) return invalid_argument("field 'messages' must be a non-empty array");
    r->messages = *m;
  } else {
    return invalid_argument("a line needs 'prompt', 'prompt_ids' or 'messages'");
  }
  return Status::ok();
}

// Every field a line may have: any other is an error naming it, never silently ignored.
Status check_field_names(const json& j) {
  static constexpr std::string_view kFields[] = {"prompt",
                                                 "prompt_ids",
                                                 "messages",
                                                 "max_tokens",
                                                 "temperature",
                                                 "top_p",
                                                 "top_k",
                                                 "priority",
                                                 "min_p",
                                                 "repetition_penalty",
                                                 "presence_penalty",
                                                 "frequency_penalty",
                                                 "logprobs",
                                                 "n",
                                                 "stop_token_ids",
                                                 "seed",
                                                 "ignore_eos",
                                                 "stop",
                                                 "min_tokens"};
  for (const auto& [key, value] : j.items()) {
    if (std::find(std::begin(kFields), std::end(kFields), key) == std::end(kFields))
      return invalid_argument("unknown field '" + key + "'");
  }
  return Status::ok();
}

}  // namespace

Expected<GenerationRequest> parse_batch_item(const json& j, int64_t default_max_tokens) {
  if (!j.is_object()) return invalid_argument("each line must be a JSON object");
  INFERD_RETURN_IF_ERROR(check_field_names(j));
  GenerationRequest r;
  INFERD_RETURN_IF_ERROR(read_prompt(j, &r));
  int64_t max_tokens = default_max_tokens;
  INFERD_RETURN_IF_ERROR(read_number(j, "max_tokens", &max_tokens));
  r.max_tokens = max_tokens;
  SamplingParams& s = r.sampling;
  INFERD_RETURN_IF_ERROR(read_number(j, "temperature", &s.temperature));
  INFERD_RETURN_IF_ERROR(read_number(j, "top_p", &s.top_p));
  INFERD_RETURN_IF_ERROR(read_number(j, "top_k", &s.top_k));
  INFERD_RETURN_IF_ERROR(read_number(j, "priority", &r.priority));
  INFERD_RETURN_IF_ERROR(read_number(j, "min_p", &s.min_p));
  INFERD_RETURN_IF_ERROR(read_number(j, "repetition_penalty", &s.repetition_penalty));
  INFERD_RETURN_IF_ERROR(read_number(j, "presence_penalty", &s.presence_penalty));
  INFERD_RETURN_IF_ERROR(read_number(j, "frequency_penalty", &s.frequency_penalty));
  if (j.contains("logprobs") && !j["logprobs"].is_null()) {
    int32_t k = 0;
    INFERD_RETURN_IF_ERROR(read_number(j, "logprobs", &k));
    s.logprobs = k;
  }
  INFERD_RETURN_IF_ERROR(read_number(j, "n", &r.n));
  INFERD_RETURN_IF_ERROR(read_number(j, "min_tokens", &s.min_tokens));
  INFERD_RETURN_IF_ERROR(read_ids(j, "stop_token_ids", &r.stop_token_ids));
  if (auto seed = j.find("seed"); seed != j.end() && !seed->is_null()) {
    if (!seed->is_number_integer()) return invalid_argument("field 'seed' must be an integer");
    s.seed = seed->get<uint64_t>();
  }
  if (auto e = j.find("ignore_eos"); e != j.end() && !e->is_null()) {
    if (!e->is_boolean()) return invalid_argument("field 'ignore_eos' must be a boolean");
    r.ignore_eos = e->get<bool>();
  }
  if (auto stop = j.find("stop"); stop != j.end() && !stop->is_null()) {
    const bool ok = stop->is_string() || stop->is_array();
    if (!ok) return invalid_argument("field 'stop' must be a string or a list of strings");
    for (const auto& v : stop->is_string() ? json::array({*stop}) : *stop) {
      if (!v.is_string()) return invalid_argument("field 'stop' must be a string or a list of strings");
      r.stop.push_back(v.get<std::string>());
    }
  }
  return r;
}

nlohmann::json batch_result_json(const BatchResult& r, size_t index) {
  auto sample_json = [&](const BatchSample& s, size_t i) {
    nlohmann::json j = {{"index", i},
                        {"text", s.text},
                        {"prompt_tokens", r.prompt_tokens},
                        {"completion_tokens", s.token_ids.size()},
                        {"token_ids", s.token_ids},
                        {"finish_reason", finish_reason_name(s.finish_reason)},
                        {"ttft_s", s.ttft_seconds},
                        {"e2e_s", s.e2e_seconds}};
    if (!s.error.empty()) j["error"] = s.error;
    if (!s.logprobs.empty()) j["logprobs"] = s.logprobs;
    return j;
  };
  nlohmann::json j = sample_json(r.samples.at(0), index);
  if (r.samples.size() > 1) {
    j["choices"] = nlohmann::json::array();
    for (size_t i = 0; i < r.samples.size(); ++i) j["choices"].push_back(sample_json(r.samples[i], i));
  }
  return j;
}

std::vector<BatchResult> run_offline_batch(Engine& engine, const InputProcessor& inputs,
                                           const Tokenizer* tokenizer,
                                           const std::vector<GenerationRequest>& requests,
                                           const std::function<void(size_t, size_t)>& progress) {
  std::vector<BatchResult> results(requests.size());
  std::vector<std::vector<OutputProcessor>> choices(requests.size());  // per request, per sample
  std::vector<int32_t> unfinished(requests.size());
  std::unordered_map<RequestId, size_t> index;
  const auto start = Clock::now();
  auto since_start = [&](Clock::time_point t) { return std::chrono::duration<double>(t - start).count(); };
  size_t done = 0;
  auto complete = [&](size_t i) {
    if (--unfinished[i] == 0 && progress) progress(++done, requests.size());
  };
  for (size_t i = 0; i < requests.size(); ++i) {
    InputProcessed in = inputs.process(requests[i]);
    if (!in.input) {  // refused before it ran: one failed sample naming the field
      results[i].samples.resize(1);
      results[i].samples[0].error = in.error.message;  // which names the field
      unfinished[i] = 1;
      complete(i);
      continue;
    }
    RequestSpec& spec = in.input->requests.at(0);  // a JSONL line holds one prompt
    results[i].prompt_tokens = in.input->num_prompt_tokens;
    results[i].samples.resize(static_cast<size_t>(spec.n));
    OutputOptions options;
    options.stop = in.input->stop;
    options.skip_special_tokens = in.input->skip_special_tokens;
    options.min_tokens = in.input->min_tokens;
    for (int32_t k = 0; k < spec.n; ++k) choices[i].emplace_back(tokenizer, options);
    unfinished[i] = spec.n;
    index[engine.add(std::move(spec))] = i;
  }
  while (engine.has_work()) {
    for (const StepOutput& out : engine.step()) {
      const auto now = Clock::now();
      const size_t i = index.at(out.id);
      OutputProcessor& c = choices[i].at(static_cast<size_t>(out.index));
      if (c.finished()) continue;
      const ChoiceDelta d = c.apply(out, now);
      if (d.stop_string) engine.abort(out.id, out.index);  // its blocks are freed now
      if (!d.finished) continue;
      BatchSample& s = results[i].samples[static_cast<size_t>(out.index)];
      s.text = c.text();
      s.token_ids = c.token_ids();
      for (const auto& lp : c.logprobs()) s.logprobs.push_back(lp.logprob);
      s.finish_reason = *c.finish_reason();
      s.error = c.error();
      if (c.first_token_at()) s.ttft_seconds = since_start(*c.first_token_at());
      s.e2e_seconds = since_start(now);
      complete(i);
    }
  }
  return results;
}

}  // namespace inferd
