// Decode throughput of constrained sequences against unconstrained ones on the default model:
// 16 chat requests answered under a nested JSON schema (the grammar masks every sampled row),
// then the same 16 prompts unconstrained with each request's max_tokens set to the length its
// constrained answer had (ignore_eos), so both runs decode the same number of tokens per request
// and the same batch sizes step by step. Prints decode tokens/s of each, their ratio, and the
// sampling time (masks included) per token. Rounds alternate; medians.
// --no-prefetch: grammar masks at sampling time instead of during the forward pass
// (EngineOptions::prefetch_grammar_masks), to see what the prefetch takes off the critical path.
//   build/constrained_decode_bench [rounds=3] [threads=2] [--no-prefetch]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/input_processor.h"
#include "model/default_model.h"
#include "model/model_loader.h"
#include "model/transformer.h"
#include "tokenizer/tokenizer_loader.h"

namespace {

using namespace inferd;

constexpr const char* kSchema = R"({
  "type": "object",
  "properties": {
    "name": {"type": "string", "maxLength": 40},
    "age": {"type": "integer", "minimum": 0, "maximum": 150},
    "address": {"type": "object", "properties": {
      "street": {"type": "string"}, "city": {"type": "string"}, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
      "required": ["street", "city", "zip"], "additionalProperties": false},
    "hobbies": {"type": "array", "items": {"type": "object", "properties": {
      "name": {"type": "string"}, "years": {"type": "integer"}}, "required": ["name", "years"]}}
  },
  "required": ["name", "age", "address", "hobbies"],
  "additionalProperties": false
})";

struct Run {
  double decode_tokens_per_second = 0;
  double sample_micros_per_token = 0;
  double mask_wait_micros_per_token = 0;  // waiting for prefetched masks after the forward pass
  std::vector<int64_t> lengths;
  int64_t invalid = 0;  // constrained answers that finished but do not parse
};

bool g_prefetch = true;

Run run(Transformer& model, const InputProcessor& inputs, const Tokenizer& tok, bool constrained,
        const std::vector<int64_t>& lengths) {
  EngineOptions options;
  options.prefetch_grammar_masks = g_prefetch;
  options.num_kv_blocks = 1024;
  options.scheduler.max_num_seqs = 16;
  Engine engine(model, options);
  std::map<RequestId, size_t> index;
  for (size_t i = 0; i < 16; ++i) {
    GenerationRequest g;
    g.messages = nlohmann::ordered_json::array(
        {{{"role", "user"}, {"content", "Describe person number " + std::to_string(i) + " as JSON."}}});
    g.sampling.temperature = 1.0f;
    g.sampling.seed = i;
    g.max_tokens = constrained ? 160 : lengths[i];
    if (constrained) {
      StructuredOutput so;
      so.kind = StructuredOutput::Kind::kJsonSchema;
      so.schema = nlohmann::ordered_json::parse(kSchema);
      so.field = "response_format";
      g.structured_output = so;
    } else {
      g.ignore_eos = true;
    }
    InputProcessed p = inputs.process(g);
    if (!p.input) {
      std::fprintf(stderr, "constrained_decode_bench: %s\n", p.error.message.c_str());
      std::exit(1);
    }
    index[engine.add(std::move(p.input->requests[0]))] = i;
  }
  Run r;
  r.lengths.assign(16, 0);
  std::vector<std::vector<int32_t>> outputs(16);
  while (engine.has_work()) {
    for (const StepOutput& s : engine.step()) {
      auto& out = outputs[index.at(s.id)];
      out.insert(out.end(), s.new_tokens.begin(), s.new_tokens.end());
    }
  }
  for (size_t i = 0; i < 16; ++i) {
    r.lengths[i] = static_cast<int64_t>(outputs[i].size());
    if (constrained) {
      std::string text = tok.decode(outputs[i], /*skip_special=*/true);
      if (nlohmann::json::parse(text, nullptr, false).is_discarded() && r.lengths[i] < 160) ++r.invalid;
    }
  }
  const EngineStats& st = engine.stats();
  r.decode_tokens_per_second = static_cast<double>(st.decode_tokens) / st.decode_seconds;
  r.sample_micros_per_token = 1e6 * st.sample_seconds / static_cast<double>(st.decode_tokens + 16);
  r.mask_wait_micros_per_token = 1e6 * st.mask_wait_seconds / static_cast<double>(st.decode_tokens + 16);
  return r;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<const char*> args;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--no-prefetch") == 0) {
      g_prefetch = false;
    } else {
      args.push_back(argv[i]);
    }
  }
  const int rounds = args.size() > 0 ? std::atoi(args[0]) : 3;
  const int threads = args.size() > 1 ? std::atoi(args[1]) : 2;
  auto path = default_model_path();
  if (!path) {
    std::fprintf(stderr, "constrained_decode_bench: the default model is not installed (scripts/setup)\n");
    return 1;
  }
  auto weights = load_model(*path);
  if (!weights) {
    std::fprintf(stderr, "constrained_decode_bench: %s\n", weights.status().message().c_str());
    return 1;
  }
  auto tok = load_tokenizer((*weights)->gguf.get(), (*weights)->source_path, (*weights)->config.vocab_size);
  auto tmpl = tok ? load_chat_template((*weights)->source_path, **tok)
                  : Expected<std::unique_ptr<ChatTemplate>>(unsupported("no tokenizer"));
  if (!tok || !tmpl || !*tmpl) {
    std::fprintf(stderr, "constrained_decode_bench: the model has no tokenizer or chat template\n");
    return 1;
  }
  ThreadPool pool(threads);
  Transformer model(**weights, pool);
  const InputProcessor inputs(tok->get(), tmpl->get(),
                              InputLimits{2048, static_cast<int32_t>((*weights)->config.vocab_size), 16});
  std::vector<double> with, without, ratio, sample_with, sample_without;
  int64_t invalid = 0, tokens = 0;
  for (int round = 0; round < rounds; ++round) {
    const Run c = run(model, inputs, **tok, true, {});
    const Run u = run(model, inputs, **tok, false, c.lengths);
    with.push_back(c.decode_tokens_per_second);
    without.push_back(u.decode_tokens_per_second);
    ratio.push_back(c.decode_tokens_per_second / u.decode_tokens_per_second);
    sample_with.push_back(c.sample_micros_per_token);
    sample_without.push_back(u.sample_micros_per_token);
    invalid += c.invalid;
    for (int64_t n : c.lengths) tokens += n;
    std::printf(
        "round %d: constrained %.1f tok/s, unconstrained %.1f tok/s, ratio %.3f; sampling %.1f vs %.1f "
        "us/token; waiting for prefetched masks %.1f us/token\n",
        round, c.decode_tokens_per_second, u.decode_tokens_per_second, ratio.back(),
        c.sample_micros_per_token, u.sample_micros_per_token, c.mask_wait_micros_per_token);
  }
  std::printf(
      "16 sequences, %lld tokens per round on average: constrained %.1f tok/s, unconstrained %.1f tok/s, "
      "ratio %.3f (median of %d); sampling incl. masks %.1f us/token vs %.1f; %lld finished answers "
      "that do not parse\n",
      static_cast<long long>(tokens / rounds), median(with), median(without), median(ratio), rounds,
      median(sample_with), median(sample_without), static_cast<long long>(invalid));
  return 0;
}
