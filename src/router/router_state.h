// RouterState: what the router's coroutines share on its one I/O thread: the options, the
// InstancePool, the RoutePlanner over it and the RouterMetrics, plus the one way an instance's
// health changes are logged and counted. Owned by RouterServer; I/O thread only.
#pragma once

#include <string>

#include "router/instance_pool.h"
#include "router/route_planner.h"
#include "router/router_metrics.h"
#include "router/router_server.h"

namespace inferd {

struct RouterState {
  explicit RouterState(RouterOptions o);

  RouterOptions options;
  InstancePool pool;
  RoutePlanner planner;
  RouterMetrics metrics;

  // Logs and counts what a health result or an ejection changed.
  void apply(const InstanceSpec& spec, HealthTransition t, const std::string& error);
  // A failure while routing (connection error, timeout, 5xx, broken stream): ejected at once.
  void eject(uint64_t id, const InstanceSpec& spec, const std::string& error);
  // Refreshes the per-instance gauges (up, in flight) before /metrics renders.
  void refresh_gauges();
};

}  // namespace inferd
