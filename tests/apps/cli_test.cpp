// The inferd binary end to end: output, exit codes and one-line errors.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <numeric>
#include <sstream>

#include "engine/offline_batch.h"
#include "kernels/backend.h"
#include "kernels/onednn_matmul.h"
#include "model/default_model.h"
#include "model/model_loader.h"
#include "test_support.h"
#include "tokenizer/tokenizer_loader.h"

namespace inferd {
namespace {

struct Result {
  int exit_code = -1;
  std::string out, err;
};

Result run_inferd(const std::string& args) {
  const std::string dir = test::temp_dir();
  const std::string cmd = std::string(INFERD_BINARY) + " " + args + " >" + dir + "/out 2>" + dir + "/err";
  const int status = std::system(cmd.c_str());
  Result r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = test::read_text(dir + "/out");
  r.err = test::read_text(dir + "/err");
  return r;
}

std::vector<int32_t> parse_ids(const std::string& line) {
  std::vector<int32_t> ids;
  std::stringstream ss(line);
  std::string item;
  while (std::getline(ss, item, ',')) ids.push_back(std::stoi(item));
  return ids;
}

void expect_one_line_error(const Result& r, const std::string& fragment) {
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_EQ(r.err.rfind("inferd: error: ", 0), 0u) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_NE(r.err.find(fragment), std::string::npos) << r.err;
}

// oneDNN is optional at build time (-DINFERD_WITH_ONEDNN=OFF, or not installed): without it
// --matmul onednn is a one-line error that names it; with it the same run generates.
TEST(CliTest, OneDnnMatmulRunsOrSaysItIsAbsent) {
  const std::string model = test::fixture_path("tiny/llama_tied/model-f32.gguf");
  Result r = run_inferd("run --model " + model + " --prompt-ids 1,2,3,4 -n 6 -t 2 --matmul onednn");
  if (OneDnnWeight::available()) {
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(parse_ids(r.out).size(), 6u) << r.out;
  } else {
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.err.find("no oneDNN"), std::string::npos) << r.err;
  }
}

// --matmul cuda without a usable CUDA backend (a build without it, or no device) is a one-line
// error with the reason, before any model is loaded; an unknown backend names the choices.
TEST(CliTest, CudaMatmulRunsOrSaysWhyNot) {
  const std::string model = test::fixture_path("tiny/llama_tied/model-f32.gguf");
  Result r = run_inferd("run --model " + model + " --prompt-ids 1,2,3,4 -n 6 -t 2 --matmul cuda");
  const Status available = cuda_backend_available();
  if (available.is_ok()) {
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(parse_ids(r.out).size(), 6u) << r.out;
  } else {
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.err.find(available.message()), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("internal error"), std::string::npos) << r.err;
  }
  r = run_inferd("run --model " + model + " --prompt-ids 1,2 -n 2 --matmul tpu");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("must be packed, f32, onednn or cuda, not 'tpu'"), std::string::npos) << r.err;
}

// Greedy tokens by recomputing the whole sequence every step (one prefill of prompt + output so
// far, no cache reuse between steps): a reference independent of the engine's incremental decode.
std::vector<int32_t> greedy_by_recompute(Transformer& t, std::vector<int32_t> tokens, int64_t n,
                                         const std::vector<int32_t>& stop_ids = {}) {
  const ModelConfig& c = t.config();
  std::vector<int32_t> out;
  std::vector<float> logits(static_cast<size_t>(c.vocab_size));
  for (int64_t k = 0; k < n; ++k) {
    const auto len = static_cast<int64_t>(tokens.size());
    const int64_t blocks = (len + 15) / 16;
    KvCache cache(c.num_layers, blocks, 16, c.kv_dim(), KvDType::kF16);
    std::vector<int32_t> table(static_cast<size_t>(blocks)), positions(tokens.size()), seq(tokens.size(), 0);
    std::vector<int64_t> slots(tokens.size());
    std::iota(table.begin(), table.end(), 0);
    std::iota(positions.begin(), positions.end(), 0);
    std::iota(slots.begin(), slots.end(), 0);
    AttentionSequence s{0, len, len, table};
    const int32_t last = static_cast<int32_t>(len - 1);
    EXPECT_TRUE(t.forward({tokens, positions, slots, seq, {&s, 1}, {&last, 1}}, cache, logits).is_ok());
    const auto best = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    out.push_back(best);
    tokens.push_back(best);
    if (std::find(stop_ids.begin(), stop_ids.end(), best) != stop_ids.end()) break;
  }
  return out;
}

TEST(CliTest, GreedyRunMatchesRecomputation) {
  const std::string model = test::fixture_path("tiny/llama_tied/model-f32.gguf");
  Result r = run_inferd("run --model " + model + " --prompt-ids 1,2,3,4 -n 6 -t 2");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto ids = parse_ids(r.out);
  ASSERT_EQ(ids.size(), 6u) << r.out;
  EXPECT_NE(r.err.find("tokens/s"), std::string::npos);

  auto weights = load_model(model);
  ASSERT_TRUE(weights.has_value());
  ThreadPool pool(1);
  Transformer t(**weights, pool);
  EXPECT_EQ(ids, greedy_by_recompute(t, {1, 2, 3, 4}, 6));
}

TEST(CliTest, SeededSamplingIsReproducible) {
  const std::string args = "run --model " + test::fixture_path("tiny/qwen3") +
                           " --prompt-ids 9,8,7 -n 12 --temperature 1.0 --top-k 50 --seed ";
  Result a = run_inferd(args + "5"), b = run_inferd(args + "5"), c = run_inferd(args + "6");
  ASSERT_EQ(a.exit_code, 0) << a.err;
  EXPECT_EQ(a.out, b.out);
  EXPECT_NE(a.out, c.out);
}

TEST(CliTest, InfoPrintsConfig) {
  Result r = run_inferd("info --model " + test::fixture_path("tiny/qwen2"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["architecture"], "qwen2");
  EXPECT_EQ(j["num_layers"], 2);
  EXPECT_EQ(j["format"], "safetensors");
}

// `inferd prune` on the default model (it has a tokenizer, which --calibration needs): heads and
// channels measured on one chunk of the calibration text, cut, and the model loads with the new
// sizes and runs.
TEST(CliTest, PruneCutsHeadsAndChannelsOfTheDefaultModel) {
  auto path = default_model_path();
  INFERD_REQUIRE_OR_SKIP(path.has_value(), "default model not installed");
  const std::string out = test::temp_dir() + "/pruned.gguf";
  Result r =
      run_inferd("prune -i " + *path + " -o " + out + " --prune-heads 0.33 --prune-ffn 0.25 --calibration " +
                 test::fixture_path("text/calibration.txt") + " --calibration-chunks 1");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("importance measured over 512 calibration tokens"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("query / KV heads 9 / 3 -> 6 / 3, FFN channels 1536 -> 1152"), std::string::npos)
      << r.err;
  Result info = run_inferd("info --model " + out);
  ASSERT_EQ(info.exit_code, 0) << info.err;
  auto j = nlohmann::json::parse(info.out);
  EXPECT_EQ(j["num_heads"], 6);
  EXPECT_EQ(j["intermediate_size"], 1152);
  Result run = run_inferd("run --model " + out + " --prompt-ids 1,2,3,4 -n 6 -t 2");
  ASSERT_EQ(run.exit_code, 0) << run.err;
}

// Text in, streamed text out: equals the greedy tokens (recomputed) decoded in one piece.
TEST(CliTest, TextPromptStreamsDecodedText) {
  auto path = default_model_path();
  INFERD_REQUIRE_OR_SKIP(path.has_value(), "default model not installed");
  const std::string prompt = "<|im_start|>user\nName three colours.<|im_end|>\n<|im_start|>assistant\n";
  Result r = run_inferd("run -n 24 -t 2 --prompt '" + prompt + "'");
  ASSERT_EQ(r.exit_code, 0) << r.err;

  auto weights = load_model(*path);
  ASSERT_TRUE(weights.has_value());
  auto tok = load_tokenizer((*weights)->gguf.get(), (*weights)->source_path, (*weights)->config.vocab_size);
  ASSERT_TRUE(tok.has_value()) << tok.status().message();
  ThreadPool pool(1);
  Transformer t(**weights, pool);
  const auto ids = greedy_by_recompute(t, (*tok)->encode_prompt(prompt, true), 24, (*tok)->vocab().stop_ids);
  EXPECT_EQ(r.out, (*tok)->decode(ids, /*skip_special=*/true) + "\n");
  EXPECT_FALSE(r.out.find_first_not_of(" \n") == std::string::npos) << "empty answer";
}

TEST(CliTest, ChatUsesTheTemplateAndGenerateTakesMessages) {
  INFERD_REQUIRE_OR_SKIP(default_model_path().has_value(), "default model not installed");
  Result chat = run_inferd("run -n 12 --chat 'What is 2+2?' --system 'Answer briefly.'");
  ASSERT_EQ(chat.exit_code, 0) << chat.err;
  EXPECT_GT(chat.out.size(), 1u);
  const std::string dir = test::temp_dir();
  const std::string line =
      "{\"messages\": [{\"role\": \"system\", \"content\": \"Answer briefly.\"}, {\"role\": \"user\", "
      "\"content\": \"What is 2+2?\"}], \"max_tokens\": 12}\n";
  test::write_bytes(dir + "/in.jsonl",
                    std::vector<std::byte>(reinterpret_cast<const std::byte*>(line.data()),
                                           reinterpret_cast<const std::byte*>(line.data()) + line.size()));
  Result gen =
      run_inferd("generate -i " + dir + "/in.jsonl -o " + dir + "/out.jsonl --kv-cache-memory 64MiB");
  ASSERT_EQ(gen.exit_code, 0) << gen.err;
  auto j = nlohmann::json::parse(test::read_text(dir + "/out.jsonl"));
  // The same conversation, greedy: the batch path and the single path agree.
  EXPECT_EQ(j["text"].get<std::string>() + "\n", chat.out);
  Result no_template = run_inferd("run --model " + test::fixture_path("tiny/qwen2") + " --chat hi");
  EXPECT_NE(no_template.exit_code, 0);
}

TEST(CliTest, TokenizePrintsIds) {
  INFERD_REQUIRE_OR_SKIP(default_model_path().has_value(), "default model not installed");
  Result plain = run_inferd("tokenize --text 'Hi <|im_end|> 42'");
  Result special = run_inferd("tokenize --allow-special --text 'Hi <|im_end|> 42'");
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  auto a = nlohmann::json::parse(plain.out).get<std::vector<int32_t>>();
  auto b = nlohmann::json::parse(special.out).get<std::vector<int32_t>>();
  EXPECT_GT(a.size(), b.size());
  EXPECT_NE(std::find(b.begin(), b.end(), 2), b.end());  // <|im_end|> is id 2 in SmolLM2
  EXPECT_EQ(std::find(a.begin(), a.end(), 2), a.end());
}

// Offline batch: every line answered, in order, with the asked lengths; a bad line fails alone.
TEST(CliTest, GenerateRunsABatchFile) {
  const std::string dir = test::temp_dir();
  const std::string model = test::fixture_path("tiny/qwen2/model-f32.gguf");
  std::string lines;
  for (int i = 0; i < 12; ++i) {
    lines += "{\"prompt_ids\": [" + std::to_string(i + 1) + ", 7, " + std::to_string(3 * i) +
             "], \"max_tokens\": " + std::to_string(2 + i % 5) + "}\n";
  }
  lines += "{\"prompt_ids\": \"oops\"}\n";
  lines += "{\"prompt_ids\": [5, 6, 7, 8], \"max_tokens\": 5, \"n\": 3, \"temperature\": 1.0, \"seed\": 3}\n";
  test::write_bytes(dir + "/in.jsonl",
                    std::vector<std::byte>(reinterpret_cast<const std::byte*>(lines.data()),
                                           reinterpret_cast<const std::byte*>(lines.data()) + lines.size()));
  Result r = run_inferd("generate --model " + model + " -i " + dir + "/in.jsonl -o " + dir +
                        "/out.jsonl --kv-cache-memory 1MiB --max-num-batched-tokens 16 -t 2");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("KV cache:"), std::string::npos);
  const std::string out = test::read_text(dir + "/out.jsonl");
  std::stringstream ss(out);
  std::string line;
  for (int i = 0; i < 14; ++i) {
    ASSERT_TRUE(std::getline(ss, line)) << "missing line " << i;
    auto j = nlohmann::json::parse(line);
    EXPECT_EQ(j["index"], i);
    if (i == 12) {
      EXPECT_EQ(j["finish_reason"], "error");
      EXPECT_NE(j["error"].get<std::string>().find(":13: field 'prompt_ids'"), std::string::npos) << j;
      continue;
    }
    if (i == 13) {  // n = 3: three samples, the first one also at the top level
      ASSERT_EQ(j["choices"].size(), 3u);
      for (int k = 0; k < 3; ++k) {
        EXPECT_EQ(j["choices"][k]["index"], k);
        EXPECT_EQ(j["choices"][k]["completion_tokens"], 5);
      }
      EXPECT_EQ(j["choices"][0]["text"], j["text"]);
      continue;
    }
    EXPECT_EQ(j["finish_reason"], "length");
    EXPECT_EQ(j["completion_tokens"], 2 + i % 5);
    EXPECT_LE(j["ttft_s"].get<double>(), j["e2e_s"].get<double>());
  }
}

// A JSONL line's min_tokens holds back its stop tokens, as the server's field does.
TEST(CliTest, GenerateHonoursMinTokens) {
  const std::string dir = test::temp_dir();
  const std::string model = test::fixture_path("tiny/qwen2/model-f32.gguf");
  auto generate = [&](const std::string& lines) {
    test::write_bytes(
        dir + "/in.jsonl",
        std::vector<std::byte>(reinterpret_cast<const std::byte*>(lines.data()),
                               reinterpret_cast<const std::byte*>(lines.data()) + lines.size()));
    Result r = run_inferd("generate --model " + model + " -i " + dir + "/in.jsonl -o " + dir +
                          "/out.jsonl --kv-cache-memory 1MiB -t 2");
    EXPECT_EQ(r.exit_code, 0) << r.err;
    std::vector<nlohmann::json> out;
    std::stringstream ss(test::read_text(dir + "/out.jsonl"));
    for (std::string line; std::getline(ss, line);) out.push_back(nlohmann::json::parse(line));
    return out;
  };
  const auto base = generate("{\"prompt_ids\": [5, 6, 7, 8], \"max_tokens\": 4}\n");
  ASSERT_EQ(base.size(), 1u);
  const int32_t first = base[0]["token_ids"][0];
  const std::string stop = ", \"stop_token_ids\": [" + std::to_string(first) + "]";
  const auto out = generate("{\"prompt_ids\": [5, 6, 7, 8], \"max_tokens\": 4" + stop +
                            "}\n"
                            "{\"prompt_ids\": [5, 6, 7, 8], \"max_tokens\": 4, \"min_tokens\": 3" +
                            stop +
                            "}\n"
                            "{\"prompt_ids\": [1], \"max_tokens\": 1, \"min_tokens\": 2}\n");
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[0]["finish_reason"], "stop");
  EXPECT_EQ(out[0]["completion_tokens"], 1);
  const auto held = out[1]["token_ids"].get<std::vector<int32_t>>();
  ASSERT_GE(held.size(), 3u) << out[1];
  for (size_t i = 0; i < 3; ++i) EXPECT_NE(held[i], first) << i;
  EXPECT_EQ(out[2]["finish_reason"], "error");
  EXPECT_NE(out[2]["error"].get<std::string>().find("min_tokens"), std::string::npos) << out[2];
}

TEST(CliTest, ServeProfilesResolveWithFlagsWinning) {
  const Result plain = run_inferd("serve --print-config");
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  const auto d = nlohmann::json::parse(plain.out);
  EXPECT_TRUE(d["profile"].is_null());
  EXPECT_EQ(d["schedule_policy"]["value"], "decode-first");
  EXPECT_EQ(d["max_num_batched_tokens"]["value"], 2048);
  EXPECT_EQ(d["max_num_batched_tokens"]["from"], "default");
  for (const char* name : {"chat", "code", "summarize", "long-context", "batch"}) {
    const Result r = run_inferd(std::string("serve --profile ") + name + " --max-num-seqs 7 --print-config");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const auto j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["profile"], name);
    EXPECT_EQ(j["schedule_policy"]["from"], "profile");
    EXPECT_EQ(j["max_num_batched_tokens"]["from"], "profile");
    EXPECT_EQ(j["max_prefill_tokens"]["value"], j["max_num_batched_tokens"]["value"]);
    EXPECT_EQ(j["max_num_seqs"]["value"], 7);  // the flag wins over the profile
    EXPECT_EQ(j["max_num_seqs"]["from"], "flag");
  }
  expect_one_line_error(run_inferd("serve --profile nope --print-config"),
                        "--profile nope: no such profile (chat, code, summarize, long-context, batch)");
}

TEST(CliTest, BadInputsGiveOneLineErrors) {
  const std::string dir = test::temp_dir();
  test::write_bytes(dir + "/junk.gguf", std::vector<std::byte>(64, std::byte{0x41}));
  expect_one_line_error(run_inferd("run --model " + dir + "/junk.gguf --prompt-ids 1"),
                        "junk.gguf: not a GGUF file");

  auto good = test::read_bytes(test::fixture_path("tiny/qwen2/model-q8_0.gguf"));
  good.resize(good.size() / 2);
  test::write_bytes(dir + "/half.gguf", good);
  expect_one_line_error(run_inferd("run --model " + dir + "/half.gguf --prompt-ids 1"), "half.gguf");

  const std::string tiny = test::fixture_path("tiny/llama_tied/model-f16.gguf");
  expect_one_line_error(run_inferd("run --model " + tiny + " --prompt-ids 1,x"), "'x' is not a token id");
  expect_one_line_error(run_inferd("run --model " + tiny + " --prompt-ids 1,256"),
                        "token id 256 is outside the vocabulary");
  expect_one_line_error(
      run_inferd("run --model " + tiny + " --prompt-ids 1,2,3 -n 254"),
      "maximum context length is 256 tokens, but the prompt has 3 tokens and max_tokens is 254");
  expect_one_line_error(run_inferd("run --model /nonexistent.gguf --prompt-ids 1"), "/nonexistent.gguf");
  expect_one_line_error(run_inferd("run --model " + tiny + " --prompt hello"), "no tokenizer");
  expect_one_line_error(run_inferd("generate --model " + tiny + " -i /nonexistent.jsonl -o /tmp/x.jsonl"),
                        "/nonexistent.jsonl: cannot open");
  test::write_bytes(dir + "/one.jsonl", std::vector<std::byte>(3, std::byte{'{'}));
  expect_one_line_error(run_inferd("generate --model " + tiny + " -i " + dir + "/one.jsonl -o " + dir +
                                   "/o.jsonl --kv-cache-memory 10B"),
                        "smaller than one KV block");
  // The scheduler's SLO flags and the prune command's automatic mode.
  expect_one_line_error(run_inferd("generate --model " + tiny + " -i " + dir + "/one.jsonl -o " + dir +
                                   "/o.jsonl --slo-class chat:ttft=fast"),
                        "--slo-class chat:ttft=fast: ttft must be a positive duration");
  expect_one_line_error(run_inferd("generate --model " + tiny + " -i " + dir + "/one.jsonl -o " + dir +
                                   "/o.jsonl --slo-class a --slo-class a"),
                        "the class 'a' is given twice");
  expect_one_line_error(run_inferd("generate --model " + tiny + " -i " + dir + "/one.jsonl -o " + dir +
                                   "/o.jsonl --batch-window soon"),
                        "--batch-window soon: give off, auto or milliseconds");
  expect_one_line_error(run_inferd("prune -i " + tiny + " -o " + dir + "/p.gguf --drop-layers auto:1"),
                        "--drop-layers auto:N needs --calibration TEXT");
  expect_one_line_error(run_inferd("prune -i " + tiny + " -o " + dir +
                                   "/p.gguf --drop-layers auto:0 "
                                   "--calibration " +
                                   dir + "/one.jsonl"),
                        "give auto:N, N >= 1");
  expect_one_line_error(
      run_inferd("prune -i " + tiny + " -o " + dir + "/p.gguf --drop-layers 1 --calibration x"),
      "--calibration is for --drop-layers auto:N, --prune-heads and --prune-ffn");
  expect_one_line_error(run_inferd("prune -i " + tiny + " -o " + dir + "/p.gguf"),
                        "give --drop-layers, --prune-heads or --prune-ffn");
  expect_one_line_error(run_inferd("prune -i " + tiny + " -o " + dir + "/p.gguf --prune-heads 0.5"),
                        "--prune-heads needs --calibration TEXT");
  expect_one_line_error(run_inferd("prune -i " + tiny + " -o " + dir + "/p.gguf --prune-ffn 1.5"),
                        "--prune-ffn 1.500000: give a fraction between 0 and 1");
  Result usage = run_inferd("run --prompt-ids 1 --bogus-flag");
  EXPECT_NE(usage.exit_code, 0);
}

}  // namespace
}  // namespace inferd
