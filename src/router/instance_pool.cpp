#include "router/instance_pool.h"

#include <algorithm>

namespace inferd {

InstancePool::InstancePool(PoolOptions options) : options_(options) {}

InstanceState* InstancePool::find(uint64_t id) {
  auto it = instances_.find(id);
  return it == instances_.end() ? nullptr : &it->second;
}

InstanceState* InstancePool::find_spec(const InstanceSpec& spec) {
  for (auto& [id, s] : instances_) {
    if (s.spec == spec) return &s;
  }
  return nullptr;
}

uint64_t InstancePool::add(const InstanceSpec& spec, bool from_file) {
  const uint64_t id = next_id_++;
  instances_.emplace(std::piecewise_construct, std::forward_as_tuple(id),
                     std::forward_as_tuple(id, spec, from_file, options_.index_capacity));
  return id;
}

void InstancePool::add_fixed(const std::vector<InstanceSpec>& specs) {
  for (const InstanceSpec& spec : specs) {
    if (find_spec(spec) == nullptr) add(spec, false);
  }
}

InstancePool::Reconciled InstancePool::set_file_instances(const std::vector<InstanceSpec>& specs) {
  Reconciled r;
  for (const InstanceSpec& spec : specs) {
    InstanceState* s = find_spec(spec);
    if (s == nullptr) {
      r.added.push_back(add(spec, true));
    } else if (s->retired) {
      s->retired = false;
      r.added.push_back(s->id);
    }
  }
  std::vector<uint64_t> gone;
  for (auto& [id, s] : instances_) {
    if (!s.from_file || s.retired) continue;
    if (std::find(specs.begin(), specs.end(), s.spec) != specs.end()) continue;
    s.retired = true;
    r.retired.push_back(id);
    if (s.in_flight == 0) gone.push_back(id);
  }
  for (uint64_t id : gone) instances_.erase(id);
  return r;
}

std::vector<InstanceState*> InstancePool::healthy(InstanceRole role, std::optional<uint64_t> exclude) {
  std::vector<InstanceState*> out;
  for (auto& [id, s] : instances_) {
    if (s.spec.role == role && s.serving() && id != exclude) out.push_back(&s);
  }
  return out;
}

bool InstancePool::any_healthy(InstanceRole role) const {
  return std::any_of(instances_.begin(), instances_.end(),
                     [&](const auto& kv) { return kv.second.spec.role == role && kv.second.serving(); });
}

bool InstancePool::all_checked() const {
  return std::all_of(instances_.begin(), instances_.end(),
                     [](const auto& kv) { return kv.second.retired || kv.second.checked; });
}

std::vector<uint64_t> InstancePool::checked_ids() const {
  std::vector<uint64_t> ids;
  for (const auto& [id, s] : instances_) {
    if (!s.retired) ids.push_back(id);
  }
  return ids;
}

HealthTransition InstancePool::record_check(uint64_t id, bool ok, const std::string& error) {
  InstanceState* s = find(id);
  if (s == nullptr) return HealthTransition::kNone;
  s->checked = true;
  if (ok) {
    s->failed_checks = 0;
    if (s->up) return HealthTransition::kNone;
    s->up = true;
    return HealthTransition::kCameUp;
  }
  s->last_error = error;
  ++s->failed_checks;
  if (!s->up || s->failed_checks < options_.failed_checks_to_eject) return HealthTransition::kNone;
  s->up = false;
  return HealthTransition::kWentDown;
}

HealthTransition InstancePool::eject(uint64_t id, const std::string& error) {
  InstanceState* s = find(id);
  if (s == nullptr) return HealthTransition::kNone;
  s->last_error = error;
  s->failed_checks = std::max(s->failed_checks, options_.failed_checks_to_eject);
  if (!s->up) return HealthTransition::kNone;
  s->up = false;
  return HealthTransition::kWentDown;
}

void InstancePool::acquire(uint64_t id) {
  if (InstanceState* s = find(id)) ++s->in_flight;
}

void InstancePool::release(uint64_t id) {
  InstanceState* s = find(id);
  if (s == nullptr) return;
  --s->in_flight;
  if (s->retired && s->in_flight <= 0) instances_.erase(id);
}

}  // namespace inferd
