// InstancePool: the fleet behind the router and each instance's state: up or ejected, failed
// health checks in a row, the router's requests in flight there, the load its /metrics last
// showed, and its PrefixIndex. Instances from flags stay for the process; those of the
// instances file come and go with it (a removed one is retired: it gets no new request and
// leaves the pool once its last request ends). Not thread-safe: the router's I/O thread owns it.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "router/instance_spec.h"
#include "router/load_metrics.h"
#include "router/prefix_index.h"

namespace inferd {

struct InstanceState {
  InstanceState(uint64_t id_, InstanceSpec spec_, bool from_file_, size_t index_capacity)
      : id(id_), spec(std::move(spec_)), from_file(from_file_), index(index_capacity) {}

  uint64_t id;
  InstanceSpec spec;
  bool from_file;
  bool up = false;        // down until its first successful health check
  bool checked = false;   // its first health check has an outcome, good or bad
  bool retired = false;   // no longer in the instances file
  bool checking = false;  // a health check is in flight
  int failed_checks = 0;  // in a row
  int64_t in_flight = 0;  // the router's requests there
  InstanceLoad load;      // from its last /metrics scrape
  PrefixIndex index;
  std::string last_error;

  // The load the policies compare: the router's in flight + the instance's running + waiting.
  double load_score() const { return static_cast<double>(in_flight) + load.running + load.waiting; }
  bool serving() const { return up && !retired; }
};

struct PoolOptions {
  int failed_checks_to_eject = 2;
  size_t index_capacity = 65536;  // chunks per instance's PrefixIndex
};

// What a health result or an ejection changed.
enum class HealthTransition { kNone, kCameUp, kWentDown };

class InstancePool final {
 public:
  explicit InstancePool(PoolOptions options = {});

  // Adds instances given by flags (kept for the process; duplicates ignored).
  void add_fixed(const std::vector<InstanceSpec>& specs);

  struct Reconciled {
    std::vector<uint64_t> added, retired;
  };
  // The instances file's current list: new ones join (down until checked), missing ones retire,
  // a retired one listed again comes back.
  Reconciled set_file_instances(const std::vector<InstanceSpec>& specs);

  // The instance, or null when it left the pool.
  InstanceState* find(uint64_t id);
  // Instances of `role` that are up and not retired, in id order, without `exclude`.
  std::vector<InstanceState*> healthy(InstanceRole role, std::optional<uint64_t> exclude = std::nullopt);
  bool any_healthy(InstanceRole role) const;
  // Every instance not retired has had its first health check answered (or failed): until
  // then the router cannot tell a prefill instance that is down from one not asked yet.
  bool all_checked() const;
  // Instances to health-check (all but the retired), in id order.
  std::vector<uint64_t> checked_ids() const;

  // One health check's outcome: up at once on success, ejected after failed_checks_to_eject.
  HealthTransition record_check(uint64_t id, bool ok, const std::string& error);
  // A failure while routing (connection error, timeout, 5xx): ejected at once.
  HealthTransition eject(uint64_t id, const std::string& error);

  // The router's request count there; a retired instance leaves at its last release.
  void acquire(uint64_t id);
  void release(uint64_t id);

  const std::map<uint64_t, InstanceState>& instances() const { return instances_; }

 private:
  InstanceState* find_spec(const InstanceSpec& spec);
  uint64_t add(const InstanceSpec& spec, bool from_file);

  PoolOptions options_;
  uint64_t next_id_ = 1;
  std::map<uint64_t, InstanceState> instances_;
};

}  // namespace inferd
