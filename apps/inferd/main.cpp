// inferd: the command-line entry point. Parses flags and wires library components; no logic.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <exception>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "engine/generator.h"
#include "model/default_model.h"
#include "model/model_loader.h"
#include "model/transformer.h"

namespace {

using namespace inferd;

int fail(const std::string& message) {
  std::fprintf(stderr, "inferd: error: %s\n", message.c_str());
  return 1;
}

Expected<std::vector<int32_t>> parse_ids(const std::string& text) {
  std::vector<int32_t> ids;
  size_t i = 0;
  while (i < text.size()) {
    size_t end = text.find(',', i);
    if (end == std::string::npos) end = text.size();
    const std::string item = text.substr(i, end - i);
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != item.size() || v < 0 || v > INT32_MAX) {
      return invalid_argument("--prompt-ids: '" + item + "' is not a token id");
    }
    ids.push_back(static_cast<int32_t>(v));
    i = end + 1;
  }
  if (ids.empty()) return invalid_argument("--prompt-ids is empty");
  return ids;
}

struct CommonFlags {
  std::string model;
  int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
};

void add_common(CLI::App* cmd, CommonFlags* f) {
  cmd->add_option("-m,--model", f->model,
                  "a .gguf file or a Hugging Face model directory (default: SmolLM2-135M-Instruct Q4_1)");
  cmd->add_option("-t,--threads", f->threads, "worker threads")->check(CLI::Range(1, 1024));
}

Expected<std::unique_ptr<ModelWeights>> load(const CommonFlags& f, double* seconds) {
  std::string path = f.model;
  if (path.empty()) {
    INFERD_ASSIGN_OR_RETURN(path, default_model_path());
  }
  auto t0 = std::chrono::steady_clock::now();
  auto m = load_model(path);
  *seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return m;
}

const char* arch_label(const ModelConfig& c) {
  return c.arch_name.c_str();
}

int run_info(const CommonFlags& flags) {
  double secs = 0;
  auto m = load(flags, &secs);
  if (!m) return fail(m.status().message());
  const ModelConfig& c = (*m)->config;
  std::printf(
      "{\"path\": \"%s\", \"format\": \"%s\", \"architecture\": \"%s\", \"vocab_size\": %lld, "
      "\"hidden_size\": %lld, \"num_layers\": %lld, \"num_heads\": %lld, \"num_kv_heads\": %lld, "
      "\"head_dim\": %lld, \"intermediate_size\": %lld, \"context_length\": %lld, "
      "\"tie_word_embeddings\": %s, \"weight_bytes\": %zu, \"load_seconds\": %.4f}\n",
      (*m)->source_path.c_str(), (*m)->source_format.c_str(), arch_label(c),
      static_cast<long long>(c.vocab_size), static_cast<long long>(c.hidden_size),
      static_cast<long long>(c.num_layers), static_cast<long long>(c.num_heads),
      static_cast<long long>(c.num_kv_heads), static_cast<long long>(c.head_dim),
      static_cast<long long>(c.intermediate_size), static_cast<long long>(c.max_position_embeddings),
      c.tie_word_embeddings ? "true" : "false", (*m)->weight_bytes, secs);
  return 0;
}

struct RunFlags {
  std::string prompt_ids;
  int64_t max_tokens = 16;
  float temperature = 0.0f;
  int32_t top_k = 0;
  float top_p = 1.0f;
  std::optional<uint64_t> seed;
};

int run_generate(const CommonFlags& flags, const RunFlags& run) {
  auto ids = parse_ids(run.prompt_ids);
  if (!ids) return fail(ids.status().message());
  double load_secs = 0;
  auto m = load(flags, &load_secs);
  if (!m) return fail(m.status().message());
  ThreadPool pool(flags.threads);
  Transformer model(**m, pool);
  GenerationOptions opts;
  opts.max_tokens = run.max_tokens;
  opts.sampling = SamplingParams{run.temperature, run.top_k, run.top_p, run.seed};
  bool first = true;
  auto stats = generate(model, *ids, opts, [&](int32_t id) {
    std::printf(first ? "%d" : ",%d", id);
    std::fflush(stdout);
    first = false;
  });
  std::printf("\n");
  std::fflush(stdout);
  if (!stats) return fail(stats.status().message());
  const auto& s = *stats;
  std::fprintf(
      stderr,
      "load %.3f s | prompt %lld tokens, TTFT %.1f ms, %.1f tokens/s | decode %lld tokens, %.1f tokens/s\n",
      load_secs, static_cast<long long>(s.prompt_tokens), s.prefill_seconds * 1e3,
      static_cast<double>(s.prompt_tokens) / s.prefill_seconds,
      static_cast<long long>(s.generated_tokens - 1),
      s.generated_tokens > 1 ? static_cast<double>(s.generated_tokens - 1) / s.decode_seconds : 0.0);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"inferd: LLM inference engine"};
  app.require_subcommand(1);
  CommonFlags common;

  auto* run_cmd = app.add_subcommand("run", "generate tokens for one prompt");
  add_common(run_cmd, &common);
  RunFlags run;
  run_cmd->add_option("--prompt-ids", run.prompt_ids, "prompt as comma-separated token ids")->required();
  run_cmd->add_option("-n,--max-tokens", run.max_tokens, "tokens to generate")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  run_cmd->add_option("--temperature", run.temperature, "0 = greedy (default)")
      ->check(CLI::Range(0.0f, 100.0f));
  run_cmd->add_option("--top-k", run.top_k, "keep the k most likely tokens (0 = all)")
      ->check(CLI::NonNegativeNumber);
  run_cmd->add_option("--top-p", run.top_p, "nucleus sampling mass")->check(CLI::Range(0.0f, 1.0f));
  run_cmd->add_option("--seed", run.seed, "random seed (same seed, same output)");

  auto* info_cmd = app.add_subcommand("info", "print a model's configuration as JSON");
  add_common(info_cmd, &common);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    if (*run_cmd) return run_generate(common, run);
    if (*info_cmd) return run_info(common);
  } catch (const std::exception& e) {
    return fail(e.what());
  }
  return 0;
}
