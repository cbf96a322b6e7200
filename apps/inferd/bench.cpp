#include "bench.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>

#include "bench/bench_report.h"
#include "cli_error.h"
#include "common/thread_pool.h"
#include "engine_flags.h"
#include "model/default_model.h"
#include "model/model_loader.h"
#include "parallel.h"
#include "tokenizer/tokenizer_loader.h"

namespace inferd {

namespace {

Expected<std::vector<int64_t>> parse_list(const std::string& text) {
  std::vector<int64_t> out;
  size_t at = 0;
  while (at < text.size()) {
    size_t end = text.find(',', at);
    if (end == std::string::npos) end = text.size();
    const std::string item = text.substr(at, end - at);
    char* stop = nullptr;
    const long long v = std::strtoll(item.c_str(), &stop, 10);
    if (item.empty() || stop != item.c_str() + item.size() || v < 1)
      return invalid_argument("--sweep-concurrency: '" + item + "' is not a positive integer");
    out.push_back(v);
    at = end + 1;
  }
  if (out.empty()) return invalid_argument("--sweep-concurrency is empty");
  return out;
}

Expected<double> parse_rate(const std::string& text) {
  if (text == "inf") return std::numeric_limits<double>::infinity();
  char* stop = nullptr;
  const double v = std::strtod(text.c_str(), &stop);
  if (text.empty() || stop != text.c_str() + text.size() || !(v > 0) || !std::isfinite(v))
    return invalid_argument("--request-rate '" + text + "' (expected a positive number or inf)");
  return v;
}

// Mean and sample standard deviation of repetitions (as llama-bench reports them).
std::pair<double, double> mean_sd(const std::vector<double>& v) {
  double mean = 0, var = 0;
  for (double x : v) mean += x;
  mean /= static_cast<double>(v.size());
  for (double x : v) var += (x - mean) * (x - mean);
  return {mean, v.size() > 1 ? std::sqrt(var / static_cast<double>(v.size() - 1)) : 0.0};
}

std::string mean_pm(const std::vector<double>& v) {
  const auto [mean, sd] = mean_sd(v);
  char s[64];
  std::snprintf(s, sizeof s, "%.2f ± %.2f", mean, sd);
  return s;
}

nlohmann::json stats_json(const std::vector<double>& v) {
  if (v.empty()) return nullptr;
  const auto [mean, sd] = mean_sd(v);
  return {{"mean", mean},
          {"stddev", sd},
          {"min", *std::min_element(v.begin(), v.end())},
          {"max", *std::max_element(v.begin(), v.end())},
          {"samples", v}};
}

}  // namespace

BenchCommands add_bench_commands(CLI::App* bench, BenchServeFlags* f, BenchLatencyFlags* l) {
  bench->require_subcommand(1);
  CLI::App* serve =
      bench->add_subcommand("serve", "load-test an OpenAI-compatible server (inferd, llama-server, vLLM)");
  ServeBenchOptions& o = f->options;
  serve->add_option("--base-url", o.base_url, "the server, http://host:port");
  serve->add_option("--endpoint", o.endpoint, "/v1/completions or /v1/chat/completions");
  serve->add_option("--model", o.model, "the model field (default: the first id of GET /v1/models)");
  serve->add_option("--api-key", o.api_key, "sent as Authorization: Bearer KEY");
  serve->add_option("--num-prompts", f->dataset.num_prompts, "requests to send")->check(CLI::PositiveNumber);
  serve->add_option("--request-rate", f->request_rate, "requests per second (Poisson), or inf: all at once");
  serve->add_option("--burstiness", o.burstiness, "gamma shape of arrival gaps: 1 = Poisson, <1 burstier")
      ->check(CLI::PositiveNumber);
  serve->add_option("--max-concurrency", o.max_concurrency, "requests in flight at most (0 = no limit)")
      ->check(CLI::NonNegativeNumber);
  serve->add_option("--seed", o.seed, "seed of the dataset and the arrival times");
  serve->add_option("--request-timeout", o.request_timeout, "seconds before a request counts as failed")
      ->check(CLI::PositiveNumber);
  serve->add_option("--dataset", f->dataset.name,
                    "random, shared-prefix, multi-turn, scenario:chat|summarize|code, or jsonl:FILE");
  serve->add_option("--input-len", f->dataset.input_len, "random / multi-turn: prompt tokens per request");
  serve->add_option("--output-len", f->dataset.output_len,
                    "output tokens per request (max_tokens, ignore_eos)");
  serve->add_option("--range-ratio", f->dataset.range_ratio, "lengths vary uniformly within ±ratio");
  serve->add_option("--prefix-len", f->dataset.prefix_len, "shared-prefix: tokens of each system prompt");
  serve->add_option("--num-prefixes", f->dataset.num_prefixes, "shared-prefix: distinct system prompts");
  serve->add_option("--suffix-len", f->dataset.suffix_len, "shared-prefix: tokens of each question");
  serve->add_option("--turns", f->dataset.turns, "multi-turn: requests per conversation");
  serve->add_option("--tokenizer", f->tokenizer,
                    "model (.gguf or HF dir) whose vocabulary makes the prompts");
  serve->add_flag(
      "--no-ignore-eos", [&o](int64_t) { o.ignore_eos = false; }, "let requests end at EOS");
  serve->add_flag("--session-ids", o.session_ids,
                  "send each conversation's turns under one session_id (the server pins a turn's KV for the "
                  "next: --session-ttl)");
  serve->add_option("--slo", f->slo, "goodput objectives, e.g. ttft=500ms,tpot=100ms");
  serve->add_option("--result-json", f->result_json, "write every figure and per-request records here");
  serve->add_option("--plot", f->plot_dir, "write PNG plots into this folder (gnuplot)");
  serve->add_option("--sweep-concurrency", f->sweep_concurrency,
                    "run once per max concurrency, e.g. 1,2,4,8,16,32, and compare");
  serve->add_flag("--no-progress", f->no_progress, "no progress line on stderr");

  CLI::App* latency = bench->add_subcommand("latency", "in-process prompt / generation tokens per second");
  latency->add_option("-m,--model", l->model, "a .gguf file or a Hugging Face model directory");
  latency->add_option("-t,--threads", l->threads, "worker threads")->check(CLI::Range(1, 1024));
  latency->add_option("-p,--n-prompt", l->options.prompt_tokens, "prompt tokens (pp), 0 to skip")
      ->check(CLI::NonNegativeNumber);
  latency->add_option("-n,--n-gen", l->options.gen_tokens, "generated tokens (tg), 0 to skip")
      ->check(CLI::NonNegativeNumber);
  latency->add_option("-r,--repetitions", l->options.repetitions, "repetitions")->check(CLI::PositiveNumber);
  latency
      ->add_option("-d,--n-depth", l->options.depth,
                   "tokens already in the KV cache when the tg run starts (as llama-bench's -d; pp runs "
                   "at depth 0)")
      ->check(CLI::NonNegativeNumber);
  add_kv_dtype_flag(latency, &l->options.kv_dtype);
  add_streaming_flag(latency, &l->options.streaming);
  latency->add_flag("--json", l->json, "print one JSON object instead of a table");
  add_matmul_flag(latency, &l->matmul);
  return {serve, latency};
}

int run_bench_serve(const BenchServeFlags& flags_in) {
  BenchServeFlags f = flags_in;
  auto rate = parse_rate(f.request_rate);
  if (!rate) return fail(rate.status().message());
  f.options.request_rate = *rate;
  f.options.progress = !f.no_progress;
  f.dataset.seed = f.options.seed;
  Slo slo;
  if (!f.slo.empty()) {
    auto parsed = parse_slo(f.slo);
    if (!parsed) return fail(parsed.status().message());
    slo = *parsed;
  }
  std::vector<int64_t> sweep;
  if (!f.sweep_concurrency.empty()) {
    auto parsed = parse_list(f.sweep_concurrency);
    if (!parsed) return fail(parsed.status().message());
    sweep = *parsed;
  }
  if (Status s = f.options.validate(); !s.is_ok()) return fail(s.message());
  if (Status s = validate(f.dataset); !s.is_ok()) return fail(s.message());
  std::string path = f.tokenizer;
  if (path.empty()) {
    auto d = default_model_path();
    if (!d) return fail(d.status().message() + " (pass --tokenizer)");
    path = *d;
  }
  auto weights = load_model(path);
  if (!weights) return fail("--tokenizer: " + weights.status().message());
  auto tokenizer =
      load_tokenizer((*weights)->gguf.get(), (*weights)->source_path, (*weights)->config.vocab_size);
  if (!tokenizer) return fail("--tokenizer: " + tokenizer.status().message());
  auto items = make_dataset(f.dataset, **tokenizer);
  if (!items) return fail(items.status().message());
  if (f.options.model.empty()) {
    auto model = first_served_model(f.options);
    if (!model) return fail(model.status().message());
    f.options.model = *model;
  }
  BenchRunInfo info{f.dataset.name, f.options.model, f.options, slo};
  std::vector<SweepPoint> points;
  std::optional<ServeRun> last;
  nlohmann::json sweep_json = nlohmann::json::array();
  const std::vector<int64_t> runs = sweep.empty() ? std::vector<int64_t>{f.options.max_concurrency} : sweep;
  for (size_t k = 0; k < runs.size(); ++k) {
    const int64_t concurrency = runs[k];
    info.options.max_concurrency = concurrency;
    if (k > 0) {
      // Each sweep point draws its own prompts: a server's prefix cache must not carry over.
      DatasetOptions d = f.dataset;
      d.seed = f.dataset.seed + k;
      items = make_dataset(d, **tokenizer);
      if (!items) return fail(items.status().message());
    }
    if (!sweep.empty())
      std::fprintf(stderr, "bench: max concurrency %lld\n", static_cast<long long>(concurrency));
    auto run = run_serve_benchmark(info.options, *items);
    if (!run) return fail(run.status().message());
    const BenchSummary s = summarize_run(run->records, run->duration, slo);
    std::printf("%s", format_report(s, info).c_str());
    points.push_back({concurrency, s});
    if (!sweep.empty()) sweep_json.push_back(report_json(s, *run, info));
    last = std::move(*run);
  }
  if (points.size() > 1) std::printf("\n%s", format_sweep(points).c_str());
  if (!f.result_json.empty()) {
    nlohmann::json out = sweep.empty() ? report_json(points.back().summary, *last, info)
                                       : nlohmann::json{{"sweep", sweep_json}};
    std::ofstream file(f.result_json);
    if (!file) return fail("--result-json " + f.result_json + ": cannot write it");
    file << out.dump(1) << "\n";
  }
  if (!f.plot_dir.empty()) {
    if (points.back().summary.completed == 0) {
      std::fprintf(stderr, "inferd: warning: --plot: no request succeeded, nothing to plot\n");
    } else if (Status s = write_plots(f.plot_dir, *last, points); !s.is_ok()) {
      return fail(s.message());
    }
  }
  for (const SweepPoint& p : points) {
    if (p.summary.failed > 0) {
      std::fprintf(stderr, "inferd: warning: %lld of %lld requests failed (first error: see --result-json)\n",
                   static_cast<long long>(p.summary.failed), static_cast<long long>(p.summary.num_requests));
    }
  }
  return 0;
}

int run_bench_latency(const BenchLatencyFlags& f_in, Parallel* parallel) {
  BenchLatencyFlags f = f_in;
  const int threads = f.threads;
  std::string path = f.model;
  if (path.empty()) {
    auto d = default_model_path();
    if (!d) return fail(d.status().message());
    path = *d;
  }
  auto weights = load_model(path);
  if (!weights) return fail(weights.status().message());
  if (parallel != nullptr) {
    if (Status s = parallel->split(**weights); !s.is_ok()) return fail(s.message());
  }
  ThreadPool pool(threads);
  Transformer model(**weights, pool, transformer_options(f.matmul));
  if (parallel != nullptr) {
    f.options.prepare_engine = [&](EngineOptions& e) { return parallel->attach(model, e); };
    f.options.collective_seconds = [parallel] { return parallel->group().collective_seconds(); };
  }
  const int ranks = parallel != nullptr ? parallel->size() : 1;
  auto r = run_latency_benchmark(model, f.options);
  if (!r) return fail(r.status().message());
  const std::string name = std::filesystem::path(path).filename().string();
  if (f.json) {
    const auto pp = stats_json(r->prompt_tokens_per_second), tg = stats_json(r->generation_tokens_per_second);
    nlohmann::json j = {
        {"model", name},
        {"threads", threads},
        {"n_prompt", f.options.prompt_tokens},
        {"n_gen", f.options.gen_tokens},
        {"n_depth", f.options.depth},
        {"kv_cache_dtype", std::string(kv_dtype_name(f.options.kv_dtype))},
        {"streaming_llm", f.options.streaming.enabled()
                              ? nlohmann::json{{"sink_tokens", f.options.streaming.sink_tokens},
                                               {"window_tokens", f.options.streaming.window_tokens}}
                              : nlohmann::json()},
        {"repetitions", f.options.repetitions},
        {"prompt_tokens_per_second", pp.is_null() ? pp : pp["mean"]},
        {"generation_tokens_per_second", tg.is_null() ? tg : tg["mean"]},
        {"prompt", pp},
        {"generation", tg}};
    if (parallel != nullptr) {
      j["tensor_parallel_size"] = parallel->tensor_size();
      j["pipeline_parallel_size"] = parallel->pipeline_size();
      j["prompt_collective_share"] = r->prompt_collective_share;
      j["generation_collective_share"] = r->generation_collective_share;
    }
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }
  if (parallel != nullptr) {
    std::printf(
        "%s parallel over %d ranks (threads per rank); rank 0's time in collectives: pp %.1f %%, tg %.1f "
        "%%\n",
        parallel->pipeline_size() == 1 ? "tensor"
        : parallel->tensor_size() == 1 ? "pipeline"
                                       : "tensor and pipeline",
        ranks, 100 * r->prompt_collective_share, 100 * r->generation_collective_share);
  }
  std::printf("| model | threads | test | t/s |\n|---|---|---|---|\n");
  if (!r->prompt_tokens_per_second.empty())
    std::printf("| %s | %d | pp%lld | %s |\n", name.c_str(), threads,
                static_cast<long long>(f.options.prompt_tokens),
                mean_pm(r->prompt_tokens_per_second).c_str());
  if (!r->generation_tokens_per_second.empty()) {
    std::string test = "tg" + std::to_string(f.options.gen_tokens);
    if (f.options.depth > 0) test += " @ d" + std::to_string(f.options.depth);
    if (f.options.kv_dtype != KvDType::kF16)
      test += ", " + std::string(kv_dtype_name(f.options.kv_dtype)) + " KV";
    if (f.options.streaming.enabled())
      test += ", sink " + std::to_string(f.options.streaming.sink_tokens) + " + window " +
              std::to_string(f.options.streaming.window_tokens);
    std::printf("| %s | %d | %s | %s |\n", name.c_str(), threads, test.c_str(),
                mean_pm(r->generation_tokens_per_second).c_str());
  }
  return 0;
}

}  // namespace inferd
