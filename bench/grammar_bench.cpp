// Grammar engine figures: JSON-schema compile time, and token-mask cost per token on real
// vocabularies (SmolLM2's 49,152 tokens from the default model's GGUF; Qwen's 151,669 from the
// tokenizer.json scripts/qwen_tokenizer_json.py writes). A document valid for a nested schema is
// tokenized with the model's tokenizer and fed token by token: each step times the mask, checks
// the document's next token is allowed, and counts the allowed tokens (so the walk is real).
//
//   build/grammar_bench [--qwen-dir DIR] [--skip-qwen] [--cold-reps N]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "grammar/grammar.h"
#include "grammar/grammar_matcher.h"
#include "grammar/grammar_vocab.h"
#include "grammar/token_mask_cache.h"
#include "model/default_model.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_loader.h"

namespace {

using inferd::GrammarMatcher;
using inferd::GrammarVocab;
using Clock = std::chrono::steady_clock;
using Json = nlohmann::ordered_json;

double micros_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

const char* kNestedSchema = R"({
  "type": "object",
  "properties": {
    "id": {"type": "integer", "minimum": 0},
    "name": {"type": "string", "maxLength": 40},
    "email": {"type": "string", "format": "email"},
    "active": {"type": "boolean"},
    "address": {"type": "object", "properties": {
        "street": {"type": "string"}, "city": {"type": "string"},
        "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
        "country": {"enum": ["US", "FR", "DE", "JP"]}},
      "required": ["street", "city", "country"]},
    "orders": {"type": "array", "items": {"type": "object", "properties": {
        "sku": {"type": "string"}, "quantity": {"type": "integer", "minimum": 1, "maximum": 99},
        "price": {"type": "number", "minimum": 0}, "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 5}},
      "required": ["sku", "quantity", "price"]}},
    "notes": {"type": ["string", "null"]}
  },
  "required": ["id", "name", "address", "orders"]
})";

const char* kDocuments[] = {
    R"({"id": 4217, "name": "Ada Lovelace", "email": "ada.lovelace@example.com", "active": true, "address": {"street": "12 Analytical Engine Road", "city": "London", "zip": "10001", "country": "US"}, "orders": [{"sku": "BK-1843-NOTES", "quantity": 2, "price": 19.99, "tags": ["books", "history", "mathematics"]}, {"sku": "PEN-FOUNTAIN", "quantity": 1, "price": 42.5}], "notes": "Deliver after 5pm, ring twice. The parcel contains fragile items."})",
    R"({"id": 98, "name": "Grace Hopper", "active": false, "address": {"street": "1 Compiler Way", "city": "Arlington", "country": "DE"}, "orders": [{"sku": "COBOL-MANUAL", "quantity": 12, "price": 7.25, "tags": ["manuals"]}, {"sku": "NANOSECOND-WIRE", "quantity": 99, "price": 0.3, "tags": []}, {"sku": "BUG-JAR", "quantity": 1, "price": 3}], "notes": null})",
};

struct StepStats {
  std::vector<double> micros;
  std::vector<int> allowed;
  uint64_t max_work = 0;  // GrammarMatcher::token_work() of the costliest mask or step
};

double percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())))];
}

double mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0 : s / static_cast<double>(v.size());
}

// Feeds `tokens` through a fresh matcher, timing each mask.
bool run_document(const std::shared_ptr<const inferd::Grammar>& g,
                  const std::shared_ptr<const GrammarVocab>& vocab, const std::vector<int32_t>& tokens,
                  size_t num_logits, StepStats* stats) {
  GrammarMatcher m(g, vocab);
  std::vector<uint32_t> mask(GrammarMatcher::bitmask_words(num_logits));
  for (size_t i = 0; i <= tokens.size(); ++i) {
    const auto t0 = Clock::now();
    m.fill_next_token_bitmask(mask);
    stats->micros.push_back(micros_since(t0));
    stats->max_work = std::max(stats->max_work, m.token_work());
    int allowed = 0;
    for (uint32_t w : mask) allowed += __builtin_popcount(w);
    stats->allowed.push_back(allowed);
    if (i == tokens.size()) break;
    const int32_t id = tokens[i];
    if (!((mask[static_cast<size_t>(id) >> 5] >> (id & 31)) & 1) || !m.accept_token(id)) {
      std::printf("  token %zu (id %d, '%s') refused%s%s\n", i, id, vocab->token_bytes(id).c_str(),
                  m.failed() ? ": " : "", m.error().c_str());
      return false;
    }
    stats->max_work = std::max(stats->max_work, m.token_work());
  }
  if (!m.can_end()) {
    std::printf("  document incomplete for the grammar\n");
    return false;
  }
  return true;
}

void print_stats(const char* label, const StepStats& s) {
  std::vector<double> allowed(s.allowed.begin(), s.allowed.end());
  std::printf(
      "  %-34s steps %4zu  mask us: mean %8.1f  p50 %7.1f  p90 %8.1f  max %9.1f  | allowed: min %d mean %.0f "
      "max %d | work max %llu\n",
      label, s.micros.size(), mean(s.micros), percentile(s.micros, 0.5), percentile(s.micros, 0.9),
      *std::max_element(s.micros.begin(), s.micros.end()),
      *std::min_element(s.allowed.begin(), s.allowed.end()), mean(allowed),
      *std::max_element(s.allowed.begin(), s.allowed.end()), static_cast<unsigned long long>(s.max_work));
}

int g_cold_reps = 1;  // --cold-reps N: document 1 on N freshly compiled grammars

void bench_vocab(const char* name, const inferd::Tokenizer& tok) {
  inferd::GrammarVocabSpec spec;
  for (int32_t id = 0; id < tok.vocab_size(); ++id) {
    spec.token_bytes.push_back(tok.token_bytes(id));
    if (tok.is_special(id)) spec.special_ids.push_back(id);
  }
  spec.end_ids = tok.vocab().stop_ids;
  if (tok.vocab().eos_id) spec.end_ids.push_back(*tok.vocab().eos_id);
  auto t0 = Clock::now();
  auto vocab = GrammarVocab::create(std::move(spec));
  if (!vocab) {
    std::printf("%s: %s\n", name, vocab.status().message().c_str());
    return;
  }
  std::printf("%s: %d tokens, trie of %zu nodes built in %.1f ms\n", name, (*vocab)->size(),
              (*vocab)->trie().num_nodes(), micros_since(t0) / 1000);
  const size_t num_logits = static_cast<size_t>(tok.vocab_size()) + 64;  // a padded logits row
  auto grammar = inferd::grammar_from_json_schema(Json::parse(kNestedSchema));
  if (!grammar) {
    std::printf("  %s\n", grammar.status().message().c_str());
    return;
  }
  for (int d = 0; d < 2; ++d) {
    const std::vector<int32_t> tokens = tok.encode(kDocuments[d], false);
    StepStats cold, warm;
    const bool ok = run_document(*grammar, *vocab, tokens, num_logits, &cold);
    std::printf("  document %d: %zu tokens, %s\n", d + 1, tokens.size(),
                ok ? "every token allowed" : "REFUSED");
    if (!ok) continue;
    print_stats(d == 0 ? "new grammar + matcher (cold)" : "same grammar, new matcher", cold);
    run_document(*grammar, *vocab, tokens, num_logits, &warm);
    print_stats("again, new matcher (warm cache)", warm);
    if (d == 0) {
      std::printf("  allowed tokens per step (document 1):");
      for (size_t i = 0; i < cold.allowed.size(); ++i)
        std::printf("%s%d", i % 20 == 0 ? "\n    " : " ", cold.allowed[i]);
      std::printf("\n");
    }
  }
  std::printf("  context-mask cache entries: %zu\n", (*grammar)->token_mask_cache(*vocab)->num_entries());
  if (g_cold_reps > 1) {
    const std::vector<int32_t> tokens = tok.encode(kDocuments[0], false);
    StepStats all;
    for (int r = 0; r < g_cold_reps; ++r) {
      auto fresh = inferd::grammar_from_json_schema(Json::parse(kNestedSchema));
      if (!fresh || !run_document(*fresh, *vocab, tokens, num_logits, &all)) return;
    }
    char label[64];
    std::snprintf(label, sizeof label, "document 1, %d new grammars (cold)", g_cold_reps);
    print_stats(label, all);
  }
  // Ambiguous regexes a user may reasonably send (hundreds to thousands of live parses), on text
  // they match: what they cost per token, against StackStore's bounds.
  const std::string prose =
      "the analytical engine weaves algebraic patterns just as the jacquard loom weaves flowers and "
      "leaves and we may say most aptly that it holds a place wholly its own";
  const std::string csv = "ada,lovelace,1815,london,mathematician,analytical engine notes,grace,hopper,1906,";
  for (const auto& [regex, text] : std::vector<std::pair<std::string, std::string>>{
           {"[a-z ]{0,2000}[a-z ]{0,2000}", prose}, {"(.*,){0,50}", csv}, {"([a-z]+ ?){1,200}", prose}}) {
    auto re = inferd::grammar_from_regex(regex);
    StepStats cold, warm;
    const std::vector<int32_t> tokens = tok.encode(text, false);
    if (re && run_document(*re, *vocab, tokens, num_logits, &cold) &&
        run_document(*re, *vocab, tokens, num_logits, &warm)) {
      print_stats(("regex " + regex + ", cold").c_str(), cold);
      print_stats(("regex " + regex + ", warm").c_str(), warm);
    } else if (!re) {
      std::printf("  regex %s: %s\n", regex.c_str(), re.status().message().c_str());
    }
  }
  // Long outputs: how far a matcher's own store grows (it lives as long as the request, bounded by
  // StackStore::kMaxStoredIds).
  {
    std::string long_json = "[";
    for (int i = 0; i < 1500; ++i) {
      long_json += (i > 0 ? ", " : "") + std::string("{\"id\": ") + std::to_string(i) +
                   ", \"name\": \"item " + std::to_string(i * 37) +
                   "\", \"tags\": [\"red\", \"blue\"], \"price\": " + std::to_string(i) +
                   ".5, \"ok\": " + (i % 3 == 0 ? "true" : "null") + "}";
    }
    long_json += "]";
    std::string long_prose;
    while (long_prose.size() < 3900) long_prose += prose + " ";
    long_prose.resize(3900);
    for (const auto& [label, grammar_text, text] :
         std::vector<std::tuple<std::string, std::string, std::string>>{
             {"any JSON", "", long_json},
             {"regex [a-z ]{0,2000}[a-z ]{0,2000}", "[a-z ]{0,2000}[a-z ]{0,2000}", long_prose}}) {
      auto g = grammar_text.empty() ? inferd::parse_gbnf(*inferd::json_schema_to_gbnf(Json::parse("{}")))
                                    : inferd::grammar_from_regex(grammar_text);
      if (!g) continue;
      const std::vector<int32_t> tokens = tok.encode(text, false);
      GrammarMatcher m(*g, *vocab);
      std::vector<uint32_t> mask(GrammarMatcher::bitmask_words(num_logits));
      uint64_t max_work = 0;
      const auto t0 = Clock::now();
      bool ok = true;
      for (int32_t id : tokens) {
        m.fill_next_token_bitmask(mask);
        max_work = std::max(max_work, m.token_work());
        if (!m.accept_token(id)) {
          ok = false;
          break;
        }
        max_work = std::max(max_work, m.token_work());
      }
      std::printf(
          "  long %-38s %6zu tokens %s in %.2f s: matcher store %zu stack ids (%.1f MiB), work max %llu\n",
          label.c_str(), tokens.size(), ok ? "accepted" : (m.failed() ? "FAILED" : "REFUSED"),
          micros_since(t0) / 1e6, m.stored_ids(), static_cast<double>(m.stored_ids()) * 4 / (1 << 20),
          static_cast<unsigned long long>(max_work));
    }
  }
  // any JSON object (json_object mode) on document 1.
  StepStats any_cold, any_warm;
  const std::vector<int32_t> tokens = tok.encode(kDocuments[0], false);
  auto any =
      inferd::parse_gbnf(*inferd::json_schema_to_gbnf(Json::parse("{}")));  // a fresh any-value grammar
  if (any && run_document(*any, *vocab, tokens, num_logits, &any_cold) &&
      run_document(*any, *vocab, tokens, num_logits, &any_warm)) {
    print_stats("any JSON value, cold", any_cold);
    print_stats("any JSON value, warm", any_warm);
  }
}

void bench_compile() {
  Json schema = {{"type", "object"}, {"properties", Json::object()}, {"required", Json::array()}};
  const char* types[] = {"string", "integer", "number", "boolean"};
  for (int i = 0; i < 50; ++i) {
    const std::string key = "field_" + std::to_string(i);
    Json p = {{"type", types[i % 4]}};
    if (i % 7 == 0) p = {{"type", "array"}, {"items", {{"type", "string"}}}, {"maxItems", 4}};
    if (i % 11 == 0) p = {{"enum", {"a", "b", "c"}}};
    if (i % 13 == 0) p = {{"type", "integer"}, {"minimum", 0}, {"maximum", 1000}};
    schema["properties"][key] = p;
    if (i % 2 == 0) schema["required"].push_back(key);
  }
  const int reps = 50;
  double gbnf_us = 0, total_us = 0;
  size_t rules = 0, chars = 0;
  for (int r = 0; r < reps; ++r) {
    auto t0 = Clock::now();
    auto text = inferd::json_schema_to_gbnf(schema);
    gbnf_us += micros_since(t0);
    auto t1 = Clock::now();
    auto g = inferd::grammar_from_json_schema(schema);
    total_us += micros_since(t1);
    if (!g || !text) {
      std::printf("compile failed\n");
      return;
    }
    rules = (*g)->rules().size();
    chars = text->size();
  }
  std::printf(
      "compile of a 50-property schema (25 required; arrays, enums, ranges): %.0f us (schema -> GBNF %.0f "
      "us; "
      "%zu GBNF chars, %zu rules), mean of %d\n",
      total_us / reps, gbnf_us / reps, chars, rules, reps);
}

}  // namespace

int main(int argc, char** argv) {
  std::string qwen_dir = "build/qwen-tokenizer";
  bool skip_qwen = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--qwen-dir") == 0 && i + 1 < argc) qwen_dir = argv[++i];
    if (std::strcmp(argv[i], "--skip-qwen") == 0) skip_qwen = true;
    if (std::strcmp(argv[i], "--cold-reps") == 0 && i + 1 < argc)
      g_cold_reps = std::max(1, std::atoi(argv[++i]));
  }
  bench_compile();
  auto path = inferd::default_model_path();
  if (path) {
    auto gguf = inferd::GgufFile::open(*path);
    auto tok = gguf ? inferd::load_tokenizer(&*gguf, *path, int64_t{1} << 30)
                    : inferd::Expected<std::unique_ptr<inferd::Tokenizer>>(gguf.status());
    if (tok) {
      bench_vocab("SmolLM2 (default model)", **tok);
    } else {
      std::printf("SmolLM2: %s\n", tok.status().message().c_str());
    }
  } else {
    std::printf("SmolLM2: %s\n", path.status().message().c_str());
  }
  if (!skip_qwen) {
    const std::string cmd = ".venv/bin/python scripts/qwen_tokenizer_json.py " + qwen_dir + " >/dev/null";
    if (std::system(cmd.c_str()) != 0) {
      std::printf("Qwen: cannot write the tokenizer.json (%s)\n", cmd.c_str());
      return 0;
    }
    auto vocab = inferd::vocab_from_hf_dir(qwen_dir);
    auto tok = vocab ? inferd::Tokenizer::create(std::move(*vocab))
                     : inferd::Expected<std::unique_ptr<inferd::Tokenizer>>(vocab.status());
    if (tok) {
      bench_vocab("Qwen (tokenizer.json)", **tok);
    } else {
      std::printf("Qwen: %s\n", tok.status().message().c_str());
    }
  }
  return 0;
}
