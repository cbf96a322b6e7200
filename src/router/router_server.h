// RouterServer: `inferd router`, the OpenAI-compatible front of a fleet of inferd instances
// (docs/disaggregation.md). Boost.Beast on Asio with C++20 coroutines on one I/O thread, like
// the server: clients' requests are planned by the RoutePlanner and forwarded to instances
// (streams passed through chunk by chunk), a prefill leg first when disaggregated; a background
// coroutine health-checks and scrapes every instance and re-reads the instances file. SIGTERM /
// SIGINT: stop accepting, let in-flight requests finish within the grace period, return 0.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "router/instance_spec.h"
#include "router/route_planner.h"

namespace inferd {

struct RouterOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 8000;                 // 0: any free port (tests)
  std::vector<InstanceSpec> instances;  // from --instance / --prefill / --decode
  std::string instances_file;           // empty: none
  PlannerOptions planner;
  size_t prefix_index_chunks = 65536;  // per instance
  double health_interval_seconds = 1;
  double request_timeout_seconds = 600;  // an instance's answer (a stream: between two chunks)
  std::string api_key;                   // empty: clients need none
  int64_t max_body_bytes = 8 << 20;
  int64_t max_header_bytes = 16 << 10;
  double header_timeout_seconds = 10;
  double idle_timeout_seconds = 60;
  double write_timeout_seconds = 30;
  double shutdown_grace_seconds = 30;

  // Some instance (or an instances file), positive intervals; names the flag.
  Status validate() const;
};

class RouterServer final {
 public:
  explicit RouterServer(RouterOptions options);
  ~RouterServer();
  RouterServer(const RouterServer&) = delete;
  RouterServer& operator=(const RouterServer&) = delete;

  // Reads the instances file (an error names its line), binds and listens.
  Status listen();
  uint16_t port() const;
  // Serves on the calling thread until SIGTERM / SIGINT; returns the exit code.
  int run();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace inferd
