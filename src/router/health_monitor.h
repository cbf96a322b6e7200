// HealthMonitor: the router's background coroutine. Every health interval it re-reads the
// instances file when its mtime changed, then checks each instance: GET /health (up at once on
// success, ejected after two failures in a row) and, when healthy, GET /metrics for the load
// the policies compare. I/O thread only.
#pragma once

#include <filesystem>
#include <optional>
#include <utility>  // before Asio's awaitable.hpp, which uses std::exchange

#include <boost/asio/awaitable.hpp>

#include "common/status.h"
#include "router/router_state.h"

namespace inferd {

class HealthMonitor final {
 public:
  // state: not owned, outlives the monitor.
  explicit HealthMonitor(RouterState* state) : state_(state) {}

  // Reads the instances file if it changed since the last read. The first read's error (a bad
  // line) is returned; later ones are logged and the previous list kept.
  Status reload_instances_file();
  // Runs until `stop` becomes true.
  boost::asio::awaitable<void> run(const bool& stop);

 private:
  boost::asio::awaitable<void> check(uint64_t id);

  RouterState* state_;
  std::optional<std::filesystem::file_time_type> file_mtime_;
  bool file_read_ = false;
};

}  // namespace inferd
