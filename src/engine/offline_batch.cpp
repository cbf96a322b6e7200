#include "engine/offline_batch.h"

#include <chrono>
#include <optional>
#include <unordered_map>

#include "tokenizer/chat_encoder.h"
#include "tokenizer/incremental_detokenizer.h"

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

}  // namespace

Expected<BatchItem> parse_batch_item(const json& j, int64_t default_max_tokens) {
  if (!j.is_object()) return invalid_argument("each line must be a JSON object");
  BatchItem item;
  item.limits.max_tokens = default_max_tokens;
  if (auto p = j.find("prompt"); p != j.end()) {
    if (!p->is_string()) return invalid_argument("field 'prompt' must be a string");
    item.prompt = p->get<std::string>();
  } else if (auto ids = j.find("prompt_ids"); ids != j.end()) {
    if (!ids->is_array()) return invalid_argument("field 'prompt_ids' must be an array of token ids");
    for (const auto& v : *ids) {
      if (!v.is_number_integer()) return invalid_argument("field 'prompt_ids' must be an array of token ids");
      item.prompt_ids.push_back(v.get<int32_t>());
    }
  } else if (auto m = j.find("messages"); m != j.end()) {
    if (!m->is_array() || m->empty()) return invalid_argument("field 'messages' must be a non-empty array");
    item.messages = *m;
  } else {
    return invalid_argument("a line needs 'prompt', 'prompt_ids' or 'messages'");
  }
  INFERD_RETURN_IF_ERROR(read_number(j, "max_tokens", &item.limits.max_tokens));
  if (item.limits.max_tokens < 1) return invalid_argument("field 'max_tokens' must be >= 1");
  INFERD_RETURN_IF_ERROR(read_number(j, "temperature", &item.sampling.temperature));
  INFERD_RETURN_IF_ERROR(read_number(j, "top_p", &item.sampling.top_p));
  INFERD_RETURN_IF_ERROR(read_number(j, "top_k", &item.sampling.top_k));
  INFERD_RETURN_IF_ERROR(read_number(j, "priority", &item.priority));
  INFERD_RETURN_IF_ERROR(read_number(j, "min_p", &item.sampling.min_p));
  INFERD_RETURN_IF_ERROR(read_number(j, "repetition_penalty", &item.sampling.repetition_penalty));
  INFERD_RETURN_IF_ERROR(read_number(j, "presence_penalty", &item.sampling.presence_penalty));
  INFERD_RETURN_IF_ERROR(read_number(j, "frequency_penalty", &item.sampling.frequency_penalty));
  INFERD_RETURN_IF_ERROR(read_number(j, "logprobs", &item.sampling.logprobs));
  INFERD_RETURN_IF_ERROR(read_number(j, "n", &item.n));
  if (item.n < 1 || item.n > kMaxSamples)
    return invalid_argument("field 'n' must be in [1, " + std::to_string(kMaxSamples) + "]");
  if (auto s = j.find("seed"); s != j.end() && !s->is_null()) {
    if (!s->is_number_integer()) return invalid_argument("field 'seed' must be an integer");
    item.sampling.seed = s->get<uint64_t>();
  }
  if (auto e = j.find("ignore_eos"); e != j.end() && !e->is_null()) {
    if (!e->is_boolean()) return invalid_argument("field 'ignore_eos' must be a boolean");
    item.limits.ignore_eos = e->get<bool>();
  }
  if (auto s = j.find("stop"); s != j.end() && !s->is_null()) {
    if (s->is_string()) {
      item.stop.push_back(s->get<std::string>());
    } else if (s->is_array()) {
      for (const auto& v : *s) {
        if (!v.is_string()) return invalid_argument("field 'stop' must be a string or a list of strings");
        item.stop.push_back(v.get<std::string>());
      }
    } else {
      return invalid_argument("field 'stop' must be a string or a list of strings");
    }
  }
  INFERD_RETURN_IF_ERROR(item.sampling.validate());
  return item;
}

nlohmann::json batch_result_json(const BatchResult& r, size_t index) {
  auto sample_json = [&](const BatchSample& s, size_t i) {
    nlohmann::json j = {{"index", i},
                        {"text", s.text},
                        {"prompt_tokens", r.prompt_tokens},
                        {"completion_tokens", s.token_ids.size()},
                        {"finish_reason", s.finish_reason},
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

std::vector<BatchResult> run_offline_batch(Engine& engine, const Tokenizer* tokenizer,
                                           const ChatTemplate* chat_template,
                                           const std::vector<BatchItem>& items,
                                           const std::function<void(size_t, size_t)>& progress) {
  std::vector<BatchResult> results(items.size());
  // Per item and sample: its detokenizer (with the item's stop strings), when there is a tokenizer.
  std::vector<std::vector<std::optional<IncrementalDetokenizer>>> detok(items.size());
  std::vector<int32_t> unfinished(items.size());
  std::unordered_map<RequestId, size_t> index;
  const auto start = Clock::now();
  auto since_start = [&] { return std::chrono::duration<double>(Clock::now() - start).count(); };
  size_t done = 0;
  auto complete = [&](size_t i, size_t k, const std::string& reason) {
    BatchSample& s = results[i].samples[k];
    s.finish_reason = reason;
    s.e2e_seconds = since_start();
    if (detok[i][k] && reason != "stop") s.text += detok[i][k]->finish().text;
    if (--unfinished[i] == 0 && progress) progress(++done, items.size());
  };
  auto fail = [&](size_t i, const std::string& error) {
    results[i].samples[0].error = error;
    unfinished[i] = 1;
    complete(i, 0, "error");
  };
  for (size_t i = 0; i < items.size(); ++i) {
    const BatchItem& it = items[i];
    results[i].samples.resize(static_cast<size_t>(it.n));
    detok[i].resize(static_cast<size_t>(it.n));
    unfinished[i] = it.n;
    RequestSpec spec;
    bool text = tokenizer != nullptr;
    if (!it.messages.is_null()) {
      if (tokenizer == nullptr || chat_template == nullptr) {
        results[i].samples.resize(1);
        fail(i, "the model has no chat template: give prompt or prompt_ids");
        continue;
      }
      auto chat = encode_chat(*tokenizer, *chat_template, it.messages, ChatOptions{});
      if (!chat) {
        results[i].samples.resize(1);
        fail(i, chat.status().message());
        continue;
      }
      spec.prompt = std::move(chat->ids);
    } else if (!it.prompt.empty() || it.prompt_ids.empty()) {
      if (tokenizer == nullptr) {
        results[i].samples.resize(1);
        fail(i, "the model has no tokenizer: give prompt_ids");
        continue;
      }
      spec.prompt = tokenizer->encode_prompt(it.prompt, /*allow_special=*/true);
    } else {
      spec.prompt = it.prompt_ids;
    }
    if (text) {
      for (auto& d : detok[i]) d.emplace(*tokenizer, it.stop);
    }
    spec.sampling = it.sampling;
    spec.limits = it.limits;
    if (tokenizer != nullptr) spec.limits.stop_token_ids = tokenizer->vocab().stop_ids;
    spec.priority = it.priority;
    spec.n = it.n;
    results[i].prompt_tokens = static_cast<int64_t>(spec.prompt.size());
    index[engine.add(std::move(spec))] = i;
  }
  while (engine.has_work()) {
    for (const StepOutput& out : engine.step()) {
      const size_t i = index.at(out.id);
      const auto k = static_cast<size_t>(out.index);
      BatchSample& s = results[i].samples.at(k);
      s.logprobs.insert(s.logprobs.end(), out.logprobs.begin(), out.logprobs.end());
      for (int32_t t : out.new_tokens) {
        if (s.token_ids.empty()) s.ttft_seconds = since_start();
        s.token_ids.push_back(t);
        if (!detok[i][k]) continue;
        auto piece = detok[i][k]->push(t);
        s.text += piece.text;
        if (piece.stopped) {
          engine.abort(out.id, out.index);  // a stop string ends it: its blocks are freed now
          complete(i, k, "stop");
        }
      }
      if (out.finished && s.finish_reason.empty()) {
        s.error = out.error;
        complete(i, k, finish_reason_name(out.finish_reason));
      }
    }
  }
  return results;
}

}  // namespace inferd
