#include "router/router_state.h"

#include "common/log.h"

namespace inferd {

RouterState::RouterState(RouterOptions o)
    : options(std::move(o)),
      pool(PoolOptions{2, options.prefix_index_chunks}),
      planner(&pool, options.planner) {}

void RouterState::apply(const InstanceSpec& spec, HealthTransition t, const std::string& error) {
  if (t == HealthTransition::kCameUp) {
    log_info("instance up", {{"instance", spec.url}, {"role", std::string(role_name(spec.role))}});
    metrics.set_up(spec, true);
  } else if (t == HealthTransition::kWentDown) {
    log_warning("instance ejected",
                {{"instance", spec.url}, {"role", std::string(role_name(spec.role))}, {"error", error}});
    metrics.ejected(spec);
    metrics.set_up(spec, false);
  }
}

void RouterState::eject(uint64_t id, const InstanceSpec& spec, const std::string& error) {
  apply(spec, pool.eject(id, error), error);
}

void RouterState::refresh_gauges() {
  for (const auto& [id, s] : pool.instances()) {
    metrics.set_up(s.spec, s.serving());
    metrics.set_in_flight(s.spec, s.in_flight);
  }
}

}  // namespace inferd
