// `inferd router`: the front of a fleet of inferd instances (flags and wiring; the work is in
// src/router/).
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "router/router_server.h"

namespace inferd {

struct RouterFlags {
  RouterOptions options;
  std::vector<std::string> instances, prefill, decode;  // URLs
  std::string policy = "cache-aware";
};

void add_router_flags(CLI::App* cmd, RouterFlags* flags);

// Returns the process exit code.
int run_router(const RouterFlags& flags);

}  // namespace inferd
