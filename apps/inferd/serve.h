// `inferd serve`: the OpenAI-compatible server (flags, model loading in the background, wiring).
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "engine_flags.h"
#include "parallel.h"
#include "server/http_server.h"

namespace inferd {

struct ServeFlags {
  ServerOptions server;
  std::string max_body = "8MiB";
  std::string reasoning_parser;  // empty: none
  std::string tool_call_parser;  // empty: none
  std::string chat_template;     // a Jinja file replacing the model's template; empty: the model's
  // Disaggregation (docs/disaggregation.md).
  std::string role = "both";              // both, prefill, decode
  std::string kv_host;                    // prefill: the UCX listener's address (default: --host)
  uint16_t kv_port = 0;                   // prefill: its port (0: any free port, advertised in answers)
  double kv_lease_seconds = 30;           // prefill: how long a finished prompt's KV waits for its pull
  std::string kv_export_buffer = "1GiB";  // prefill: the most KV kept for pulls at once
  // LoRA (docs/lora.md), as vLLM spells it.
  bool enable_lora = false;               // implied by --lora-modules
  std::vector<std::string> lora_modules;  // name=path
  int64_t max_loras = 8;                  // resident at once
  int64_t max_lora_rank = 64;
  std::string pooling;        // /v1/embeddings: last, mean or cls; empty: the GGUF's pooling_type, else last
  std::string hf_overrides;   // vLLM's --hf-overrides JSON (is_matryoshka, matryoshka_dimensions only)
  std::string profile;        // --profile: a scenario's scheduling parameters (serve_profiles())
  bool print_config = false;  // --print-config: print the resolved configuration and exit
};

void add_serve_flags(CLI::App* cmd, ServeFlags* flags);

// `--profile NAME`: the scheduling parameters for a scenario, each value from the sweep in
// docs/profiles.md (scripts/bench/profile_sweep.py).
struct ServeProfile {
  std::string name;
  SchedulePolicy policy;
  int64_t max_num_batched_tokens;  // the step's token budget, also the prefill chunk
  int64_t max_num_seqs;
  std::string batch_window;
  bool prefix_caching;
  double session_ttl;
};
const std::vector<ServeProfile>& serve_profiles();
// Sets the profile's values on `flags`, except those `cmd`'s command line gives; an unknown name
// is an error naming the profiles there are.
Status apply_profile(const std::string& name, const CLI::App& cmd, EngineFlags* flags);
// The scheduling configuration that results (JSON, one key per parameter: its value and where it
// came from: "flag", "profile" or "default").
std::string describe_config(const std::string& profile, const CLI::App& cmd, const EngineFlags& flags);

// model_path empty: the default model. Returns the process exit code.
// parallel: rank 0 of a tensor-parallel job, or nullptr.
int run_serve(const std::string& model_path, int threads, const EngineFlags& engine_flags, ServeFlags flags,
              Parallel* parallel = nullptr);

// `inferd run-batch`: an OpenAI batch file (vLLM's run-batch format, server/batch_file.h) through
// the server's endpoints on a private loopback port; the answers in input order.
struct BatchFileFlags {
  std::string input;             // -i/--input-file
  std::string output;            // -o/--output-file
  int64_t max_concurrency = 64;  // requests in flight at once
};
void add_batch_file_flags(CLI::App* cmd, BatchFileFlags* flags);
int run_batch_file(const std::string& model_path, int threads, const EngineFlags& engine_flags,
                   ServeFlags flags, const BatchFileFlags& batch, Parallel* parallel = nullptr);

}  // namespace inferd
