#include "bench/bench_dataset.h"

#include <algorithm>
#include <cmath>
#include <fstream>

#include <nlohmann/json.hpp>

namespace inferd {

namespace {

struct Scenario {
  const char* name;
  int64_t input_len, output_len;
};
constexpr Scenario kScenarios[] = {
    {"scenario:chat", 512, 128}, {"scenario:summarize", 2048, 256}, {"scenario:code", 1024, 512}};

int64_t draw_len(int64_t len, double ratio, std::mt19937_64& rng) {
  if (ratio <= 0) return len;
  const auto lo =
      std::max<int64_t>(1, static_cast<int64_t>(std::floor(static_cast<double>(len) * (1 - ratio))));
  const auto hi =
      std::max<int64_t>(lo, static_cast<int64_t>(std::ceil(static_cast<double>(len) * (1 + ratio))));
  return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
}

Expected<std::vector<BenchItem>> read_jsonl(const std::string& path, const DatasetOptions& o,
                                            const Tokenizer& tokenizer) {
  std::ifstream in(path);
  if (!in) return not_found("dataset jsonl:" + path + ": cannot open it");
  std::vector<BenchItem> items;
  std::string line;
  for (int64_t n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const auto where = "dataset jsonl:" + path + " line " + std::to_string(n) + ": ";
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object()) return invalid_argument(where + "not a JSON object");
    BenchItem item;
    item.output_len = o.output_len;
    for (const char* key : {"output_len", "max_tokens"}) {
      if (j.contains(key)) {
        if (!j[key].is_number_integer() || j[key].get<int64_t>() < 1)
          return invalid_argument(where + "'" + key + "' must be a positive integer");
        item.output_len = j[key].get<int64_t>();
      }
    }
    if (j.contains("prompt") && j["prompt"].is_string()) {
      item.turns.push_back(j["prompt"].get<std::string>());
      item.prompt_tokens = static_cast<int64_t>(tokenizer.encode(item.turns[0], false).size());
    } else if (j.contains("messages") && j["messages"].is_array() && !j["messages"].empty()) {
      item.messages_json = j["messages"].dump();
      int64_t tokens = 0;
      for (const auto& m : j["messages"]) {
        if (m.is_object() && m.contains("content") && m["content"].is_string())
          tokens += static_cast<int64_t>(tokenizer.encode(m["content"].get<std::string>(), false).size());
      }
      item.prompt_tokens = tokens;
    } else {
      return invalid_argument(where + "needs \"prompt\" (a string) or \"messages\" (a non-empty array)");
    }
    items.push_back(std::move(item));
    if (static_cast<int64_t>(items.size()) == o.num_prompts) break;
  }
  if (items.empty()) return invalid_argument("dataset jsonl:" + path + ": no requests in it");
  return items;
}

}  // namespace

Status validate(const DatasetOptions& o) {
  if (o.num_prompts < 1) return invalid_argument("--num-prompts must be at least 1");
  if (o.input_len < 1 || o.output_len < 1)
    return invalid_argument("--input-len and --output-len must be at least 1");
  if (!(o.range_ratio >= 0 && o.range_ratio < 1)) return invalid_argument("--range-ratio must be in [0, 1)");
  if (o.prefix_len < 1 || o.num_prefixes < 1 || o.suffix_len < 1)
    return invalid_argument("--prefix-len, --num-prefixes and --suffix-len must be at least 1");
  if (o.turns < 1) return invalid_argument("--turns must be at least 1");
  const bool known = o.name == "random" || o.name == "shared-prefix" || o.name == "multi-turn" ||
                     o.name.rfind("jsonl:", 0) == 0 ||
                     std::any_of(std::begin(kScenarios), std::end(kScenarios),
                                 [&](const Scenario& s) { return o.name == s.name; });
  if (!known) {
    return invalid_argument(
        "--dataset '" + o.name +
        "' (expected random, shared-prefix, multi-turn, scenario:chat, scenario:summarize, "
        "scenario:code or jsonl:FILE)");
  }
  return Status::ok();
}

std::string random_token_text(const Tokenizer& tokenizer, int64_t len, std::mt19937_64& rng) {
  std::uniform_int_distribution<int32_t> pick(0, tokenizer.vocab_size() - 1);
  std::vector<int32_t> ids;
  // Decoded text re-encodes to a slightly different count: draw, re-encode, cut, and repeat.
  for (int attempt = 0; attempt < 8; ++attempt) {
    while (static_cast<int64_t>(ids.size()) < len) {
      const int32_t id = pick(rng);
      if (tokenizer.is_special(id)) continue;
      ids.push_back(id);
    }
    std::vector<int32_t> again = tokenizer.encode(tokenizer.decode(ids), false);
    if (static_cast<int64_t>(again.size()) >= len) {
      again.resize(static_cast<size_t>(len));
      ids = std::move(again);
      const std::string text = tokenizer.decode(ids);
      if (static_cast<int64_t>(tokenizer.encode(text, false).size()) == len) return text;
      ids.pop_back();
    } else {
      ids = std::move(again);
    }
  }
  return tokenizer.decode(ids);
}

Expected<std::vector<BenchItem>> make_dataset(const DatasetOptions& o_in, const Tokenizer& tokenizer) {
  INFERD_RETURN_IF_ERROR(validate(o_in));
  DatasetOptions o = o_in;
  if (o.name.rfind("jsonl:", 0) == 0) return read_jsonl(o.name.substr(6), o, tokenizer);
  for (const Scenario& s : kScenarios) {
    if (o.name == s.name) {
      o.input_len = s.input_len;
      o.output_len = s.output_len;
    }
  }
  std::mt19937_64 rng(o.seed);
  std::vector<BenchItem> items;
  auto count = [&](const std::string& text) {
    return static_cast<int64_t>(tokenizer.encode(text, false).size());
  };
  if (o.name == "shared-prefix") {
    std::vector<std::string> prefixes;
    for (int64_t k = 0; k < o.num_prefixes; ++k)
      prefixes.push_back(random_token_text(tokenizer, o.prefix_len, rng));
    for (int64_t i = 0; i < o.num_prompts; ++i) {
      BenchItem item;
      item.system = prefixes[static_cast<size_t>(i % o.num_prefixes)];
      item.turns.push_back(random_token_text(tokenizer, draw_len(o.suffix_len, o.range_ratio, rng), rng));
      item.output_len = draw_len(o.output_len, o.range_ratio, rng);
      item.prompt_tokens = count(item.system) + count(item.turns[0]);
      items.push_back(std::move(item));
    }
    return items;
  }
  const int64_t turns = o.name == "multi-turn" ? o.turns : 1;
  const int64_t conversations = std::max<int64_t>(1, o.num_prompts / turns);
  for (int64_t i = 0; i < conversations; ++i) {
    BenchItem item;
    for (int64_t t = 0; t < turns; ++t)
      item.turns.push_back(random_token_text(tokenizer, draw_len(o.input_len, o.range_ratio, rng), rng));
    item.output_len = draw_len(o.output_len, o.range_ratio, rng);
    item.prompt_tokens = count(item.turns[0]);
    items.push_back(std::move(item));
  }
  return items;
}

}  // namespace inferd
