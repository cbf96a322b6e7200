// inferd: the command-line entry point. Parses flags and wires library components; no logic.
#include <CLI/CLI.hpp>
#include <charconv>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <exception>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include "bench.h"
#include "cli_error.h"
#include "common/log.h"
#include "engine/input_processor.h"
#include "engine/offline_batch.h"
#include "engine/output_processor.h"
#include "engine_flags.h"
#include "eval/perplexity.h"
#include "model/default_model.h"
#include "model/model_loader.h"
#include "model/transformer.h"
#include "parallel.h"
#include "router_cmd.h"
#include "serve.h"
#include "tensor/quantize.h"
#include "tokenizer/chat_encoder.h"
#include "tokenizer/incremental_detokenizer.h"
#include "tokenizer/tokenizer_loader.h"
#include "tools/model_pruner.h"
#include "tools/model_quantizer.h"
#include "transfer/ucx_kv_transfer.h"
#include "version.h"

namespace {

using namespace inferd;

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
  std::string moe;  // mixture-of-experts models only
  if (c.is_moe()) {
    moe = "\"num_experts\": " + std::to_string(c.num_experts) +
          ", \"num_experts_per_tok\": " + std::to_string(c.num_experts_per_tok) +
          ", \"moe_intermediate_size\": " + std::to_string(c.moe_intermediate_size) +
          ", \"shared_expert_intermediate_size\": " + std::to_string(c.shared_expert_intermediate_size) +
          ", \"norm_topk_prob\": " + (c.norm_topk_prob ? "true" : "false") + ", \"dense_layers\": " +
          std::to_string(c.num_layers -
                         [&] {
                           int64_t n = 0;
                           for (int64_t l = 0; l < c.num_layers; ++l) n += c.is_moe_layer(l);
                           return n;
                         }()) +
          ", ";
  }
  std::printf(
      "{\"path\": \"%s\", \"format\": \"%s\", \"architecture\": \"%s\", \"vocab_size\": %lld, "
      "\"hidden_size\": %lld, \"num_layers\": %lld, \"num_heads\": %lld, \"num_kv_heads\": %lld, "
      "\"head_dim\": %lld, \"intermediate_size\": %lld, %s\"context_length\": %lld, "
      "\"tie_word_embeddings\": %s, \"weight_bytes\": %zu, \"load_seconds\": %.4f}\n",
      (*m)->source_path.c_str(), (*m)->source_format.c_str(), arch_label(c),
      static_cast<long long>(c.vocab_size), static_cast<long long>(c.hidden_size),
      static_cast<long long>(c.num_layers), static_cast<long long>(c.num_heads),
      static_cast<long long>(c.num_kv_heads), static_cast<long long>(c.head_dim),
      static_cast<long long>(c.intermediate_size), moe.c_str(),
      static_cast<long long>(c.max_position_embeddings), c.tie_word_embeddings ? "true" : "false",
      (*m)->weight_bytes, secs);
  return 0;
}

struct RunFlags {
  std::string prompt_ids;
  std::string prompt;
  std::string chat;    // a user message, wrapped in the chat template
  std::string system;  // optional system message for --chat
  int64_t max_tokens = 16;
  float temperature = 0.0f;
  int32_t top_k = 0;
  float top_p = 1.0f;
  std::optional<uint64_t> seed;
  BackendKind matmul = BackendKind::kPacked;
};

// `inferd run`'s request in the front end's terms: the prompt (ids, raw text, or a chat) and
// the sampling flags; the bounds are InputProcessor's.
Expected<GenerationRequest> run_request(const RunFlags& run) {
  GenerationRequest g;
  if (!run.prompt_ids.empty()) {
    INFERD_ASSIGN_OR_RETURN(auto ids, parse_ids(run.prompt_ids));
    g.prompts.push_back({"", std::move(ids), true});
  } else if (!run.prompt.empty()) {
    g.prompts.push_back({run.prompt, {}, false});  // the operator's raw text: special tokens honoured
  } else {
    g.messages = nlohmann::ordered_json::array();
    if (!run.system.empty()) g.messages.push_back({{"role", "system"}, {"content", run.system}});
    g.messages.push_back({{"role", "user"}, {"content", run.chat}});
  }
  g.max_tokens = run.max_tokens;
  g.sampling = SamplingParams{run.temperature, run.top_k, run.top_p, run.seed};
  return g;
}

// One request through the front end and the engine (the same path as `serve` and `generate`),
// streamed to stdout as text, or as ids for --prompt-ids; timings to stderr.
int run_generate(const CommonFlags& flags, const RunFlags& run, Parallel* parallel) {
  auto request = run_request(run);
  if (!request) return fail(request.status().message());
  double load_secs = 0;
  auto m = load(flags, &load_secs);
  if (!m) return fail(m.status().message());
  if (parallel != nullptr) {
    if (Status s = parallel->split(**m); !s.is_ok()) return fail(s.message());
  }
  const ModelConfig& config = (*m)->config;
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<ChatTemplate> chat_template;
  if (auto t = load_tokenizer((*m)->gguf.get(), (*m)->source_path, config.vocab_size)) {
    tokenizer = std::move(*t);
    auto ct = load_chat_template((*m)->source_path, *tokenizer);
    if (!ct) return fail(ct.status().message());
    chat_template = std::move(*ct);
  } else if (run.prompt_ids.empty()) {
    return fail(t.status().message());
  }
  if (!run.chat.empty() && chat_template == nullptr)
    return fail((*m)->source_path + ": the model has no chat template; use --prompt");
  const InputProcessor inputs(
      tokenizer.get(), chat_template.get(),
      InputLimits{config.max_position_embeddings, static_cast<int32_t>(config.vocab_size)});
  InputProcessed in = inputs.process(std::move(*request));
  if (!in.input) return fail(in.error.message);
  RequestSpec& spec = in.input->requests.at(0);
  const int64_t prompt_tokens = static_cast<int64_t>(spec.prompt.size());
  EngineOptions options;  // a KV cache for this one request
  options.scheduler.max_model_len = config.max_position_embeddings;
  options.num_kv_blocks =
      (prompt_tokens + spec.limits.max_tokens + options.block_size - 1) / options.block_size;
  ThreadPool pool(flags.threads);
  Transformer model(**m, pool, transformer_options(run.matmul));
  if (parallel != nullptr) {
    if (Status s = parallel->attach(model, options); !s.is_ok()) return fail(s.message());
  }
  Engine engine(model, options);
  const bool print_ids = !run.prompt_ids.empty();
  OutputProcessor choice(print_ids ? nullptr : tokenizer.get(), OutputOptions{in.input->stop});
  const auto submitted = std::chrono::steady_clock::now();
  const RequestId id = engine.add(std::move(spec));
  size_t printed = 0;
  while (engine.has_work()) {
    for (const StepOutput& out : engine.step()) {
      const ChoiceDelta d = choice.apply(out, std::chrono::steady_clock::now());
      if (d.stop_string) engine.abort(id);
      std::fputs(print_ids ? "" : d.content.c_str(), stdout);
      for (; print_ids && printed < choice.token_ids().size(); ++printed)
        std::printf(printed == 0 ? "%d" : ",%d", choice.token_ids()[printed]);
      std::fflush(stdout);
    }
  }
  std::printf("\n");
  std::fflush(stdout);
  if (!choice.error().empty()) return fail(choice.error());
  const auto seconds = [](auto a, auto b) { return std::chrono::duration<double>(b - a).count(); };
  const double ttft = choice.first_token_at() ? seconds(submitted, *choice.first_token_at()) : 0.0;
  const auto generated = static_cast<int64_t>(choice.token_ids().size());
  const double decode =
      choice.first_token_at() ? seconds(*choice.first_token_at(), *choice.last_token_at()) : 0.0;
  std::fprintf(
      stderr,
      "load %.3f s | prompt %lld tokens, TTFT %.1f ms, %.1f tokens/s | decode %lld tokens, %.1f tokens/s\n",
      load_secs, static_cast<long long>(prompt_tokens), ttft * 1e3,
      ttft > 0 ? static_cast<double>(prompt_tokens) / ttft : 0.0, static_cast<long long>(generated - 1),
      generated > 1 && decode > 0 ? static_cast<double>(generated - 1) / decode : 0.0);
  return 0;
}

struct TokenizeFlags {
  std::string text;
  std::string jsonl;  // a file of JSON strings, one per line: encode each, print totals
  bool allow_special = false;
};

// Encodes every line of a JSONL file of strings; prints totals and single-thread throughput.
int tokenize_file(const Tokenizer& tok, const TokenizeFlags& tf) {
  std::ifstream in(tf.jsonl);
  if (!in) return fail(tf.jsonl + ": cannot open");
  std::vector<std::string> docs;
  std::string line;
  size_t bytes = 0;
  for (size_t n = 1; std::getline(in, line); ++n) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_string())
      return fail(tf.jsonl + ":" + std::to_string(n) + ": not a JSON string");
    docs.push_back(j.get<std::string>());
    bytes += docs.back().size();
  }
  const auto t0 = std::chrono::steady_clock::now();
  size_t tokens = 0;
  for (const auto& d : docs) tokens += tok.encode(d, tf.allow_special).size();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf(
      "{\"documents\": %zu, \"bytes\": %zu, \"tokens\": %zu, \"seconds\": %.4f, \"mb_per_second\": %.3f, "
      "\"tokens_per_second\": %.0f}\n",
      docs.size(), bytes, tokens, secs, static_cast<double>(bytes) / 1e6 / secs,
      static_cast<double>(tokens) / secs);
  return 0;
}

int run_tokenize(const CommonFlags& flags, const TokenizeFlags& tf) {
  double load_secs = 0;
  auto m = load(flags, &load_secs);
  if (!m) return fail(m.status().message());
  auto t = load_tokenizer((*m)->gguf.get(), (*m)->source_path, (*m)->config.vocab_size);
  if (!t) return fail(t.status().message());
  if (!tf.jsonl.empty()) return tokenize_file(**t, tf);
  const auto ids = (*t)->encode(tf.text, tf.allow_special);
  std::string out = "[";
  for (size_t i = 0; i < ids.size(); ++i) out += (i ? ", " : "") + std::to_string(ids[i]);
  std::printf("%s]\n", out.c_str());
  return 0;
}

struct GenerateFlags {
  std::string input, output;
  int64_t max_tokens = 256;
};

void progress_bar(size_t done, size_t total, double seconds) {
  constexpr int kWidth = 30;
  const int filled = total == 0 ? kWidth : static_cast<int>(kWidth * done / total);
  std::fprintf(stderr, "\r[%s%s] %zu/%zu requests, %.1f s",
               std::string(static_cast<size_t>(filled), '=').c_str(),
               std::string(static_cast<size_t>(kWidth - filled), ' ').c_str(), done, total, seconds);
  if (done == total) std::fputc('\n', stderr);
}

int run_batch(const CommonFlags& flags, const EngineFlags& engine_flags, const GenerateFlags& g,
              Parallel* parallel) {
  std::ifstream in(g.input);
  if (!in) return fail(g.input + ": cannot open");
  std::vector<GenerationRequest> items;
  std::vector<std::string> line_errors;  // per input line; "" when it parsed
  std::string line;
  for (size_t n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    auto j = nlohmann::ordered_json::parse(line, nullptr, false);
    auto item = j.is_discarded() ? Expected<GenerationRequest>(invalid_argument("not valid JSON"))
                                 : parse_batch_item(j, g.max_tokens);
    line_errors.push_back(item ? "" : g.input + ":" + std::to_string(n) + ": " + item.status().message());
    items.push_back(item ? std::move(*item) : GenerationRequest{});
  }
  double load_secs = 0;
  auto m = load(flags, &load_secs);
  if (!m) return fail(m.status().message());
  if (parallel != nullptr) {
    if (Status s = parallel->split(**m); !s.is_ok()) return fail(s.message());
  }
  auto tok = load_tokenizer((*m)->gguf.get(), (*m)->source_path, (*m)->config.vocab_size);
  std::unique_ptr<ChatTemplate> chat_template;
  if (tok) {
    auto ct = load_chat_template((*m)->source_path, **tok);
    if (!ct) return fail(ct.status().message());
    chat_template = std::move(*ct);
  }
  auto options = engine_options(engine_flags, (*m)->config);
  if (!options) return fail(options.status().message());
  ThreadPool pool(flags.threads);
  Transformer model(**m, pool, transformer_options(engine_flags.matmul));
  if (parallel != nullptr) {
    if (Status s = parallel->attach(model, *options); !s.is_ok()) return fail(s.message());
  }
  auto draft = load_draft_model(&*options, **m, pool, engine_flags.matmul);
  if (!draft) return fail(draft.status().message());
  if (*draft && parallel != nullptr)
    return fail(
        "--speculative-config: a draft model with tensor or pipeline parallelism is not supported yet");
  Engine engine(model, *options);
  std::fprintf(stderr, "%s\n", describe_kv_cache(*options, engine_flags, (*m)->config).c_str());
  // Lines that did not parse are reported as errors without reaching the engine.
  std::vector<GenerationRequest> runnable;
  std::vector<size_t> runnable_index;
  for (size_t i = 0; i < items.size(); ++i) {
    if (line_errors[i].empty()) {
      runnable.push_back(items[i]);
      runnable_index.push_back(i);
    }
  }
  const auto t0 = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  const InputProcessor inputs(
      tok ? tok->get() : nullptr, chat_template.get(),
      InputLimits{options->scheduler.max_model_len, static_cast<int32_t>((*m)->config.vocab_size),
                  static_cast<int64_t>(runnable.size()) + 1});
  auto results = run_offline_batch(engine, inputs, tok ? tok->get() : nullptr, runnable,
                                   [&](size_t d, size_t t) { progress_bar(d, t, elapsed()); });
  const double secs = elapsed();
  std::ofstream out(g.output, std::ios::trunc);
  if (!out) return fail(g.output + ": cannot write");
  int64_t generated = 0, prompt_tokens = 0;
  size_t next = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    BatchResult r;
    if (!line_errors[i].empty()) {
      r.samples.resize(1);
      r.samples[0].error = line_errors[i];
    } else {
      r = results[next++];
    }
    for (const BatchSample& s : r.samples) generated += static_cast<int64_t>(s.token_ids.size());
    prompt_tokens += r.prompt_tokens;
    out << batch_result_json(r, i).dump() << "\n";
  }
  std::fprintf(stderr,
               "%zu requests, %lld prompt + %lld generated tokens in %.2f s: %.1f generated tokens/s\n",
               items.size(), static_cast<long long>(prompt_tokens), static_cast<long long>(generated), secs,
               static_cast<double>(generated) / secs);
  const EngineStats& st = engine.stats();
  std::fprintf(stderr,
               "engine: %lld steps, %.2f ms per step; forward %.1f%%, sampling %.1f%%, scheduler + "
               "bookkeeping %.2f%%; "
               "%lld preemptions\n",
               static_cast<long long>(st.steps),
               st.steps ? 1e3 * st.total_seconds() / static_cast<double>(st.steps) : 0.0,
               100 * st.execute_seconds / st.total_seconds(), 100 * st.sample_seconds / st.total_seconds(),
               100 * st.schedule_seconds / st.total_seconds(),
               static_cast<long long>(engine.scheduler().num_preemptions()));
  if (st.decode_steps > 0) {
    std::fprintf(stderr, "decode: %lld decode-only steps, %.2f ms per step, %.1f tokens/s\n",
                 static_cast<long long>(st.decode_steps),
                 1e3 * st.decode_seconds / static_cast<double>(st.decode_steps),
                 static_cast<double>(st.decode_tokens) / st.decode_seconds);
  }
  return 0;
}

}  // namespace

struct QuantizeFlags {
  std::string input;
  std::string output;
  std::string type;
  QuantizeOptions options;
};

struct PruneFlags {
  std::string input, output, drop_layers, calibration;
  double heads = 0, ffn = 0;
  int64_t calibration_chunks = 0;
};

// --drop-layers LIST or auto:N (the N layers of least Block Influence), --prune-heads RATIO,
// --prune-ffn RATIO: the cuts, measured on --calibration where a flag asks for it.
Expected<PrunePlan> prune_plan(const PruneFlags& p) {
  const bool auto_layers = p.drop_layers.rfind("auto", 0) == 0;
  if (p.drop_layers.empty() && p.heads == 0 && p.ffn == 0)
    return invalid_argument("give --drop-layers, --prune-heads or --prune-ffn");
  const bool calibrate = auto_layers || p.heads != 0 || p.ffn != 0;
  for (const auto& [flag, ratio] : {std::pair{"--prune-heads", p.heads}, std::pair{"--prune-ffn", p.ffn}})
    if (ratio != 0 && !(ratio > 0 && ratio < 1))
      return invalid_argument(std::string(flag) + " " + std::to_string(ratio) +
                              ": give a fraction between 0 and 1");
  if (!calibrate && !p.calibration.empty())
    return invalid_argument("--calibration is for --drop-layers auto:N, --prune-heads and --prune-ffn");
  PrunePlan plan;
  if (!p.drop_layers.empty() && !auto_layers) {
    INFERD_ASSIGN_OR_RETURN(plan.drop_layers, parse_layer_list(p.drop_layers));
  }
  if (!calibrate) return plan;
  int64_t count = 0;
  if (auto_layers) {
    const std::string n = p.drop_layers.size() > 5 && p.drop_layers[4] == ':' ? p.drop_layers.substr(5) : "";
    const auto [end, ec] = std::from_chars(n.data(), n.data() + n.size(), count);
    if (n.empty() || ec != std::errc() || end != n.data() + n.size() || count < 1)
      return invalid_argument("--drop-layers " + p.drop_layers + ": give auto:N, N >= 1 layers to drop");
  }
  if (p.calibration.empty())
    return invalid_argument(std::string(auto_layers    ? "--drop-layers auto:N"
                                        : p.heads != 0 ? "--prune-heads"
                                                       : "--prune-ffn") +
                            " needs --calibration TEXT");
  INFERD_ASSIGN_OR_RETURN(StructureImportance imp,
                          structure_importance(p.input, p.calibration, 512, p.calibration_chunks));
  std::fprintf(stderr, "prune: importance measured over %lld calibration tokens\n",
               static_cast<long long>(imp.tokens));
  if (auto_layers) {
    if (count > static_cast<int64_t>(imp.layer.size()) - 2)
      return invalid_argument("--drop-layers " + p.drop_layers + ": the model has " +
                              std::to_string(imp.layer.size()) + " layers, and the first and last are kept");
    std::string table;
    for (size_t l = 0; l < imp.layer.size(); ++l) {
      char cell[32];
      std::snprintf(cell, sizeof cell, "%s%zu:%.4f", l == 0 ? "" : " ", l, imp.layer[l]);
      table += cell;
    }
    std::fprintf(stderr, "prune: Block Influence per layer: %s\n", table.c_str());
    plan.drop_layers = least_important_layers(imp.layer, count);
    std::string list;
    for (int64_t l : plan.drop_layers) list += (list.empty() ? "" : ",") + std::to_string(l);
    std::fprintf(stderr, "prune: dropping layers %s\n", list.c_str());
  }
  if (p.heads != 0) {
    const auto heads = static_cast<int64_t>(imp.head.empty() ? 0 : imp.head[0].size());
    INFERD_ASSIGN_OR_RETURN(plan.keep_heads, heads_to_keep(imp.head, heads, imp.num_kv_heads, p.heads));
  }
  if (p.ffn != 0) {
    INFERD_ASSIGN_OR_RETURN(plan.keep_channels, channels_to_keep(imp.channel, p.ffn));
  }
  return plan;
}

int run_prune(const PruneFlags& p) {
  auto plan = prune_plan(p);
  if (!plan) return fail(plan.status().message());
  auto r = prune_model(p.input, p.output, *plan);
  if (!r) return fail(r.status().message());
  std::fprintf(
      stderr,
      "prune: %s -> %s: layers %lld -> %lld, query / KV heads %lld / %lld -> %lld / %lld, FFN channels "
      "%lld -> %lld; %lld tensors (%lld rounded again); %.1f MiB -> %.1f MiB\n",
      p.input.c_str(), p.output.c_str(), static_cast<long long>(r->layers_in),
      static_cast<long long>(r->layers_out), static_cast<long long>(r->heads_in),
      static_cast<long long>(r->kv_heads_in), static_cast<long long>(r->heads_out),
      static_cast<long long>(r->kv_heads_out), static_cast<long long>(r->ffn_in),
      static_cast<long long>(r->ffn_out), static_cast<long long>(r->tensors_out),
      static_cast<long long>(r->requantized), static_cast<double>(r->input_bytes) / (1 << 20),
      static_cast<double>(r->output_bytes) / (1 << 20));
  return 0;
}

int run_quantize(const QuantizeFlags& q) {
  const std::optional<DType> target = quantize_target(q.type);
  if (!target)
    return fail("--type " + q.type + " is not one of int8, int4, fp8, q8_0, q4_0, q4_1, f16, bf16, f32");
  const bool tty = isatty(2) != 0;
  int last_percent = -1;
  auto progress = [&](int64_t done, int64_t total, const std::string& name) {
    const int percent = static_cast<int>(100 * done / total);
    if (tty) {
      const int filled = percent / 5;
      std::fprintf(stderr, "\rquantize: [%.*s%*s] %3d%% %lld/%lld %-40.40s", filled, "####################",
                   20 - filled, "", percent, static_cast<long long>(done), static_cast<long long>(total),
                   name.c_str());
      if (done == total) std::fprintf(stderr, "\n");
    } else if (percent / 10 != last_percent / 10 || done == total) {
      std::fprintf(stderr, "quantize: %d%% (%lld/%lld tensors)\n", percent, static_cast<long long>(done),
                   static_cast<long long>(total));
    }
    last_percent = percent;
  };
  if (!q.options.calibration_file.empty())
    std::fprintf(stderr, "quantize: calibrating on %s (the model runs over it on the f32 path)\n",
                 q.options.calibration_file.c_str());
  auto r = quantize_model(q.input, q.output, *target, progress, q.options);
  if (!r) return fail(r.status().message());
  std::fprintf(
      stderr,
      "quantize: %s -> %s (%s): %lld matrices converted, %lld kept at q8_0 (embedding / output), %lld in "
      "groups of 64 (rows not a multiple of 128), %lld 1-D tensors kept, %lld matrices as f16 (rows not a "
      "multiple of the block); %.1f MiB -> %.1f MiB\n",
      q.input.c_str(), q.output.c_str(), q.type.c_str(), static_cast<long long>(r->converted),
      static_cast<long long>(r->kept_q8), static_cast<long long>(r->smaller_groups),
      static_cast<long long>(r->kept), static_cast<long long>(r->fallback),
      static_cast<double>(r->input_bytes) / (1 << 20), static_cast<double>(r->output_bytes) / (1 << 20));
  if (r->kept_f32_routers > 0)
    std::fprintf(stderr, "quantize: %lld MoE routers / shared-expert gates kept at f32\n",
                 static_cast<long long>(r->kept_f32_routers));
  if (r->lora_merged > 0)
    std::fprintf(stderr, "quantize: %lld matrices with the LoRA adapter merged in\n",
                 static_cast<long long>(r->lora_merged));
  if (r->gptq > 0)
    std::fprintf(stderr, "quantize: %lld matrices rounded with GPTQ, calibrated on %lld tokens\n",
                 static_cast<long long>(r->gptq), static_cast<long long>(r->calibration_tokens));
  return 0;
}

struct PerplexityFlags {
  std::string file;
  PerplexityOptions options;
  BackendKind matmul = BackendKind::kPacked;
  bool compare_f32 = false;
  std::string reference_model;
  std::string lora;  // a LoRA adapter the model (and the reference) run with
  bool json = false;
};

int run_perplexity(const CommonFlags& flags, const PerplexityFlags& p) {
  std::ifstream in(p.file, std::ios::binary);
  if (!in) return fail("cannot read " + p.file);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  double load_secs = 0;
  auto m = load(flags, &load_secs);
  if (!m) return fail(m.status().message());
  auto tokenizer = load_tokenizer((*m)->gguf.get(), (*m)->source_path, (*m)->config.vocab_size);
  if (!tokenizer) return fail("perplexity needs the model's tokenizer: " + tokenizer.status().message());
  const std::vector<int32_t> tokens = (*tokenizer)->encode(text, /*allow_special=*/false);
  ThreadPool pool(flags.threads);
  Transformer model(**m, pool, transformer_options(p.matmul));
  std::optional<Transformer> reference;
  std::unique_ptr<ModelWeights> reference_weights;
  if (!p.reference_model.empty()) {
    auto rw = load_model(p.reference_model);
    if (!rw) return fail(rw.status().message());
    reference_weights = std::move(*rw);
    if (reference_weights->config.vocab_size != (*m)->config.vocab_size)
      return fail("--reference-model has a vocabulary of " +
                  std::to_string(reference_weights->config.vocab_size) + ", the model " +
                  std::to_string((*m)->config.vocab_size));
    reference.emplace(*reference_weights, pool, TransformerOptions{.backend = BackendKind::kF32});
  } else if (p.compare_f32) {
    reference.emplace(**m, pool, TransformerOptions{.backend = BackendKind::kF32});
  }
  // --lora: the adapter on the model and on the reference (checked against each one's weights).
  std::shared_ptr<const LoraAdapter> lora, reference_lora;
  PerplexityOptions options = p.options;
  if (!p.lora.empty()) {
    auto a = load_lora_adapter(p.lora, **m, 1 << 20);
    if (!a) return fail("--lora: " + a.status().message());
    lora = *a;
    if (Status s = model.enable_lora(); !s.is_ok()) return fail(s.message());
    options.lora = lora.get();
    if (reference) {
      auto ra = reference_weights ? load_lora_adapter(p.lora, *reference_weights, 1 << 20) : a;
      if (!ra) return fail("--lora on --reference-model: " + ra.status().message());
      reference_lora = *ra;
      if (Status s = reference->enable_lora(); !s.is_ok()) return fail(s.message());
      options.reference_lora = reference_lora.get();
    }
  }
  auto r = perplexity(model, tokens, options, reference ? &*reference : nullptr);
  if (!r) return fail(r.status().message());
  if (p.json) {
    nlohmann::json j = {{"model", (*m)->source_path},   {"matmul", backend_name(p.matmul)},
                        {"text_tokens", tokens.size()}, {"context", p.options.context},
                        {"chunks", r->chunks},          {"scored_tokens", r->scored_tokens},
                        {"perplexity", r->perplexity}};
    if (r->has_reference) {
      j["reference"] = p.reference_model.empty() ? "f32 path" : p.reference_model;
      j["reference_perplexity"] = r->reference_perplexity;
      j["mean_kl"] = r->mean_kl;
      j["max_kl"] = r->max_kl;
      j["top1_agreement"] = r->top1_agreement;
    }
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("%s: %zu tokens, %lld chunks of %lld, %lld scored: perplexity %.4f (%s path)\n",
                (*m)->source_path.c_str(), tokens.size(), static_cast<long long>(r->chunks),
                static_cast<long long>(p.options.context), static_cast<long long>(r->scored_tokens),
                r->perplexity, std::string(backend_name(p.matmul)).c_str());
    if (r->has_reference) {
      const std::string ref =
          p.reference_model.empty() ? std::string("f32 path") : p.reference_model + " (f32 path)";
      std::printf(
          "reference %s: perplexity %.4f (ratio %.4f); KL(reference || this) mean %.5f max %.4f nats; top-1 "
          "agreement %.2f%%\n",
          ref.c_str(), r->reference_perplexity, r->perplexity / r->reference_perplexity, r->mean_kl,
          r->max_kl, 100 * r->top1_agreement);
    }
  }
  return 0;
}

// A rank other than 0 of a tensor-parallel job: its slice of the model, mirroring rank 0's steps.
int run_parallel_worker(const CommonFlags& flags, BackendKind matmul, Parallel& parallel,
                        const KvOffloadOptions& offload = {}) {
  // mpirun hands a Ctrl-C or SIGTERM to every rank: rank 0 drains its requests and then stops the
  // workers, which must keep computing its steps until then.
  std::signal(SIGTERM, SIG_IGN);
  std::signal(SIGINT, SIG_IGN);
  double load_secs = 0;
  auto m = load(flags, &load_secs);
  if (!m) return fail(m.status().message());
  if (Status s = parallel.split(**m); !s.is_ok()) {
    // Rank 0 reports the reason; give it the time to, before this exit ends the job.
    std::this_thread::sleep_for(std::chrono::seconds(2));
    return fail(s.message());
  }
  ThreadPool pool(flags.threads);
  Transformer model(**m, pool, transformer_options(matmul));
  if (Status s = parallel.run_worker(model, offload); !s.is_ok()) return fail(s.message());
  return 0;
}

int main(int argc, char** argv) {
  // A crash must kill the process (and let its supervisor restart it), not hang it in UCX's
  // backtrace handler (src/transfer/ucx_kv_transfer.h).
  inferd::restore_crash_signals_from_ucx();
  CLI::App app{"inferd: LLM inference engine"};
  app.set_version_flag("--version", "inferd " + build_version(),
                       "print the version and the commit built, and exit");
  app.require_subcommand(1);
  // Logging flags, accepted before or after the subcommand (`inferd serve --log-format json`).
  app.fallthrough();
  LogLevel log_level = LogLevel::kInfo;
  LogFormat log_format = LogFormat::kText;
  app.add_option("--log-level", log_level, "trace, debug, info (default), warning, error or off")
      ->transform(CLI::CheckedTransformer(std::map<std::string, LogLevel>{{"trace", LogLevel::kTrace},
                                                                          {"debug", LogLevel::kDebug},
                                                                          {"info", LogLevel::kInfo},
                                                                          {"warning", LogLevel::kWarning},
                                                                          {"error", LogLevel::kError},
                                                                          {"off", LogLevel::kOff}},
                                          CLI::ignore_case));
  app.add_option("--log-format", log_format, "text (default) or json: one JSON object a line")
      ->transform(CLI::CheckedTransformer(
          std::map<std::string, LogFormat>{{"text", LogFormat::kText}, {"json", LogFormat::kJson}},
          CLI::ignore_case));
  CommonFlags common;

  auto* run_cmd = app.add_subcommand("run", "generate tokens for one prompt");
  add_common(run_cmd, &common);
  ParallelFlags par;  // run, generate, serve and bench latency
  add_parallel_flags(run_cmd, &par);
  RunFlags run;
  auto* ids_opt = run_cmd->add_option("--prompt-ids", run.prompt_ids, "prompt as comma-separated token ids");
  auto* prompt_opt =
      run_cmd->add_option("-p,--prompt", run.prompt, "prompt text (special tokens in it are honoured)");
  auto* chat_opt =
      run_cmd->add_option("-c,--chat", run.chat, "a user message, formatted with the model's chat template");
  run_cmd->add_option("--system", run.system, "system message for --chat")->needs(chat_opt);
  ids_opt->excludes(prompt_opt)->excludes(chat_opt);
  prompt_opt->excludes(chat_opt);
  // Their bounds are the front end's (InputProcessor), the same as the server's.
  run_cmd->add_option("-n,--max-tokens", run.max_tokens, "tokens to generate");
  run_cmd->add_option("--temperature", run.temperature, "0 = greedy (default), up to 2");
  run_cmd->add_option("--top-k", run.top_k, "keep the k most likely tokens (0 = all)");
  run_cmd->add_option("--top-p", run.top_p, "nucleus sampling mass, in (0, 1]");
  run_cmd->add_option("--seed", run.seed, "random seed (same seed, same output)");
  add_matmul_flag(run_cmd, &run.matmul);

  auto* tokenize_cmd = app.add_subcommand("tokenize", "print the token ids of a text as JSON");
  add_common(tokenize_cmd, &common);
  TokenizeFlags tokenize;
  auto* text_opt = tokenize_cmd->add_option("--text", tokenize.text, "text to tokenize");
  auto* file_opt = tokenize_cmd->add_option(
      "--jsonl", tokenize.jsonl, "encode every JSON string line of a file; print totals and speed");
  text_opt->excludes(file_opt);
  file_opt->excludes(text_opt);
  tokenize_cmd->add_flag("--allow-special", tokenize.allow_special,
                         "turn special-token text into special tokens");

  auto* generate_cmd =
      app.add_subcommand("generate", "run a JSONL file of requests through the engine at once");
  add_common(generate_cmd, &common);
  add_parallel_flags(generate_cmd, &par);
  EngineFlags engine_flags;
  add_engine_flags(generate_cmd, &engine_flags);
  GenerateFlags gen;
  generate_cmd
      ->add_option("-i,--input", gen.input,
                   "JSONL: {\"prompt\": ...} or {\"prompt_ids\": [...]} + sampling fields")
      ->required();
  generate_cmd->add_option("-o,--output", gen.output, "JSONL results, in input order")->required();
  generate_cmd->add_option("-n,--max-tokens", gen.max_tokens, "default max_tokens per request")
      ->check(CLI::PositiveNumber);

  auto* serve_cmd = app.add_subcommand("serve", "serve the model over an OpenAI-compatible HTTP API");
  add_common(serve_cmd, &common);
  add_parallel_flags(serve_cmd, &par);
  add_engine_flags(serve_cmd, &engine_flags);
  ServeFlags serve;
  add_serve_flags(serve_cmd, &serve);

  auto* batch_cmd = app.add_subcommand(
      "run-batch", "run an OpenAI batch file (vLLM's run-batch format) through the server's endpoints");
  add_common(batch_cmd, &common);
  add_parallel_flags(batch_cmd, &par);
  add_engine_flags(batch_cmd, &engine_flags);
  add_serve_flags(batch_cmd, &serve);
  BatchFileFlags batch_file;
  add_batch_file_flags(batch_cmd, &batch_file);

  auto* router_cmd = app.add_subcommand("router", "an OpenAI-compatible front for inferd instances");
  RouterFlags router;
  add_router_flags(router_cmd, &router);

  auto* info_cmd = app.add_subcommand("info", "print a model's configuration as JSON");
  add_common(info_cmd, &common);

  auto* quantize_cmd = app.add_subcommand(
      "quantize", "rewrite a model's matrices in another format (GGUF or Hugging Face dir)");
  QuantizeFlags quant;
  quantize_cmd->add_option("-i,--input", quant.input, "a GGUF model or a Hugging Face directory")->required();
  quantize_cmd
      ->add_option("-o,--output", quant.output,
                   "the GGUF file to write (GGUF input) or the directory to write (Hugging Face input)")
      ->required();
  quantize_cmd
      ->add_option(
          "--type", quant.type,
          "int8 (W8A8, per-channel scales), int4 (asymmetric, groups of 128), fp8 (E4M3, per-channel "
          "scales), q8_0, q4_0, q4_1, f16, bf16 or f32")
      ->required();
  quantize_cmd->add_flag(
      "--pure", quant.options.pure,
      "4-bit types: quantize the token embedding and output matrix too (default: keep them at q8_0)");
  quantize_cmd->add_option(
      "--lora", quant.options.lora,
      "merge this LoRA adapter (a PEFT directory or a GGUF adapter) into the weights first");
  quantize_cmd->add_option(
      "--calibration", quant.options.calibration_file,
      "int4: a UTF-8 text the model runs over first; matrices are then rounded with GPTQ "
      "(e.g. tests/fixtures/text/calibration.txt)");
  quantize_cmd
      ->add_option("--calibration-chunks", quant.options.calibration_chunks,
                   "calibration chunks of 512 tokens to run (default: every whole chunk of the text)")
      ->check(CLI::NonNegativeNumber);

  auto* prune_cmd = app.add_subcommand("prune",
                                       "structured pruning: rewrite a model without some of its layers, "
                                       "attention heads or FFN channels (a GGUF "
                                       "file as GGUF, a Hugging Face directory as safetensors)");
  PruneFlags prune;
  prune_cmd->add_option("-i,--input", prune.input, "a GGUF model or a Hugging Face directory")->required();
  prune_cmd->add_option("-o,--output", prune.output, "the GGUF file (or directory) to write")->required();
  prune_cmd->add_option(
      "--drop-layers", prune.drop_layers,
      "the layers to drop: indices and ranges from 0, e.g. 4,10-19 (the rest are renumbered), or "
      "auto:N, the N layers of least Block Influence on --calibration");
  prune_cmd->add_option(
      "--prune-heads", prune.heads,
      "the fraction of query heads to remove from every KV group of every layer, least important "
      "on --calibration first (e.g. 0.33)");
  prune_cmd->add_option(
      "--prune-ffn", prune.ffn,
      "the fraction of FFN channels to remove from every layer, least important on --calibration "
      "first (the kept count a multiple of 32)");
  prune_cmd->add_option("--calibration", prune.calibration,
                        "a UTF-8 text the model runs over to measure what each layer, head and channel adds");
  prune_cmd
      ->add_option("--calibration-chunks", prune.calibration_chunks,
                   "calibration chunks of 512 tokens to run (default: every whole chunk of the text)")
      ->check(CLI::NonNegativeNumber);

  auto* ppl_cmd =
      app.add_subcommand("perplexity", "teacher-forced perplexity of a text (as llama-perplexity)");
  add_common(ppl_cmd, &common);
  PerplexityFlags ppl;
  ppl_cmd->add_option("-f,--file", ppl.file, "UTF-8 text to score")->required();
  ppl_cmd
      ->add_option("-c,--context", ppl.options.context, "tokens per chunk; the second half of each is scored")
      ->check(CLI::Range(int64_t{4}, int64_t{1} << 20));
  ppl_cmd->add_option("--chunks", ppl.options.max_chunks, "score at most this many chunks (0 = all)")
      ->check(CLI::NonNegativeNumber);
  add_matmul_flag(ppl_cmd, &ppl.matmul);
  add_kv_dtype_flag(ppl_cmd, &ppl.options.kv_dtype);
  add_streaming_flag(ppl_cmd, &ppl.options.streaming);
  ppl_cmd->add_flag("--compare-f32", ppl.compare_f32,
                    "also run the f32 path on the same chunks: its perplexity, mean KL and top-1 agreement");
  ppl_cmd
      ->add_option("--reference-model", ppl.reference_model,
                   "compare against this model (e.g. the F32 original) on the f32 path: its perplexity, mean "
                   "KL and top-1 agreement")
      ->excludes("--compare-f32");
  ppl_cmd->add_option(
      "--lora", ppl.lora,
      "score with this LoRA adapter (a PEFT directory or a GGUF adapter) applied to the model");
  ppl_cmd->add_flag("--json", ppl.json, "print one JSON object");

  auto* bench_cmd = app.add_subcommand("bench", "serving and latency benchmarks");
  BenchServeFlags bench_serve;
  BenchLatencyFlags bench_latency;
  const BenchCommands bench = add_bench_commands(bench_cmd, &bench_serve, &bench_latency);
  add_parallel_flags(bench.latency, &par);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  configure_logging(log_level, log_format);
  try {
    if (*run_cmd && run.prompt.empty() && run.prompt_ids.empty() && run.chat.empty()) {
      return fail("run needs --chat, --prompt or --prompt-ids");
    }
    if ((*serve_cmd || *batch_cmd) && !serve.profile.empty()) {
      if (Status s = apply_profile(serve.profile, *serve_cmd ? *serve_cmd : *batch_cmd, &engine_flags);
          !s.is_ok())
        return fail(s.message());
    }
    if (*serve_cmd && serve.print_config) {
      std::printf("%s\n", describe_config(serve.profile, *serve_cmd, engine_flags).c_str());
      return 0;
    }
    std::unique_ptr<Parallel> parallel;
    if (*run_cmd || *generate_cmd || *serve_cmd || *batch_cmd || *bench.latency) {
      auto p = Parallel::start(par);
      if (!p) return fail(p.status().message());
      parallel = std::move(*p);
      if (parallel != nullptr && parallel->worker()) {
        if (*bench.latency) {
          return run_parallel_worker(CommonFlags{bench_latency.model, bench_latency.threads},
                                     bench_latency.matmul, *parallel);
        }
        if (*run_cmd) return run_parallel_worker(common, run.matmul, *parallel);
        return run_parallel_worker(common, engine_flags.matmul, *parallel, offload_options(engine_flags));
      }
    }
    if (*run_cmd) return run_generate(common, run, parallel.get());
    if (*info_cmd) return run_info(common);
    if (*tokenize_cmd) return run_tokenize(common, tokenize);
    if (*generate_cmd) return run_batch(common, engine_flags, gen, parallel.get());
    if (*serve_cmd) return run_serve(common.model, common.threads, engine_flags, serve, parallel.get());
    if (*batch_cmd)
      return run_batch_file(common.model, common.threads, engine_flags, serve, batch_file, parallel.get());
    if (*router_cmd) return run_router(router);
    if (*ppl_cmd) return run_perplexity(common, ppl);
    if (*quantize_cmd) return run_quantize(quant);
    if (*prune_cmd) return run_prune(prune);
    if (*bench.serve) return run_bench_serve(bench_serve);
    if (*bench.latency) return run_bench_latency(bench_latency, parallel.get());
  } catch (const std::exception& e) {
    return fail(e.what());
  }
  return 0;
}
