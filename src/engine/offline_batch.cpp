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

const char* reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kAborted: return "abort";
    case FinishReason::kError: return "error";
    case FinishReason::kNone: break;
  }
  return "none";
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
  nlohmann::json j = {{"index", index},
                      {"text", r.text},
                      {"prompt_tokens", r.prompt_tokens},
                      {"completion_tokens", r.token_ids.size()},
                      {"finish_reason", r.finish_reason},
                      {"ttft_s", r.ttft_seconds},
                      {"e2e_s", r.e2e_seconds}};
  if (!r.error.empty()) j["error"] = r.error;
  if (!r.logprobs.empty()) j["logprobs"] = r.logprobs;
  return j;
}

std::vector<BatchResult> run_offline_batch(Engine& engine, const Tokenizer* tokenizer,
                                           const ChatTemplate* chat_template,
                                           const std::vector<BatchItem>& items,
                                           const std::function<void(size_t, size_t)>& progress) {
  std::vector<BatchResult> results(items.size());
  std::vector<std::optional<IncrementalDetokenizer>> detok(items.size());
  std::unordered_map<RequestId, size_t> index;
  const auto start = Clock::now();
  auto since_start = [&] { return std::chrono::duration<double>(Clock::now() - start).count(); };
  size_t done = 0;
  auto complete = [&](size_t i, const std::string& reason) {
    results[i].finish_reason = reason;
    results[i].e2e_seconds = since_start();
    if (detok[i] && reason != "stop") results[i].text += detok[i]->finish().text;
    if (progress) progress(++done, items.size());
  };
  for (size_t i = 0; i < items.size(); ++i) {
    const BatchItem& it = items[i];
    RequestSpec spec;
    if (!it.messages.is_null()) {
      if (tokenizer == nullptr || chat_template == nullptr) {
        results[i].error = "the model has no chat template: give prompt or prompt_ids";
        complete(i, "error");
        continue;
      }
      auto chat = encode_chat(*tokenizer, *chat_template, it.messages, ChatOptions{});
      if (!chat) {
        results[i].error = chat.status().message();
        complete(i, "error");
        continue;
      }
      spec.prompt = std::move(chat->ids);
      detok[i].emplace(*tokenizer, it.stop);
    } else if (!it.prompt.empty() || it.prompt_ids.empty()) {
      if (tokenizer == nullptr) {
        results[i].error = "the model has no tokenizer: give prompt_ids";
        complete(i, "error");
        continue;
      }
      spec.prompt = tokenizer->encode_prompt(it.prompt, /*allow_special=*/true);
      detok[i].emplace(*tokenizer, it.stop);
    } else {
      spec.prompt = it.prompt_ids;
      if (tokenizer != nullptr) detok[i].emplace(*tokenizer, it.stop);
    }
    spec.sampling = it.sampling;
    spec.limits = it.limits;
    if (tokenizer != nullptr) spec.limits.stop_token_ids = tokenizer->vocab().stop_ids;
    spec.priority = it.priority;
    results[i].prompt_tokens = static_cast<int64_t>(spec.prompt.size());
    index[engine.add(std::move(spec))] = i;
  }
  while (engine.has_work()) {
    for (const StepOutput& out : engine.step()) {
      const size_t i = index.at(out.id);
      BatchResult& r = results[i];
      r.logprobs.insert(r.logprobs.end(), out.logprobs.begin(), out.logprobs.end());
      for (int32_t t : out.new_tokens) {
        if (r.token_ids.empty()) r.ttft_seconds = since_start();
        r.token_ids.push_back(t);
        if (!detok[i]) continue;
        auto piece = detok[i]->push(t);
        r.text += piece.text;
        if (piece.stopped) {
          engine.abort(out.id);  // a stop string ends it: its blocks are freed now
          complete(i, "stop");
        }
      }
      if (out.finished && r.finish_reason.empty()) {
        r.error = out.error;
        complete(i, reason_name(out.finish_reason));
      }
    }
  }
  return results;
}

}  // namespace inferd
