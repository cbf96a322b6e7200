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
};

void add_serve_flags(CLI::App* cmd, ServeFlags* flags);

// model_path empty: the default model. Returns the process exit code.
// parallel: rank 0 of a tensor-parallel job, or nullptr.
int run_serve(const std::string& model_path, int threads, const EngineFlags& engine_flags, ServeFlags flags,
              Parallel* parallel = nullptr);

}  // namespace inferd
