#include "router/session_affinity.h"

#include "common/check.h"

namespace inferd {

SessionAffinity::SessionAffinity(size_t capacity) : capacity_(capacity) {
  INFERD_CHECK(capacity > 0);
}

std::optional<uint64_t> SessionAffinity::lookup(const std::string& session_id) {
  auto it = where_.find(session_id);
  if (it == where_.end()) return std::nullopt;
  lru_.splice(lru_.begin(), lru_, it->second);
  return it->second->second;
}

void SessionAffinity::record(const std::string& session_id, uint64_t instance_id) {
  if (auto it = where_.find(session_id); it != where_.end()) {
    it->second->second = instance_id;
    lru_.splice(lru_.begin(), lru_, it->second);
    return;
  }
  lru_.emplace_front(session_id, instance_id);
  where_.emplace(session_id, lru_.begin());
  while (lru_.size() > capacity_) {
    where_.erase(lru_.back().first);
    lru_.pop_back();
  }
}

void SessionAffinity::erase(const std::string& session_id) {
  auto it = where_.find(session_id);
  if (it == where_.end()) return;
  lru_.erase(it->second);
  where_.erase(it);
}

void SessionAffinity::forget_instance(uint64_t instance_id) {
  for (auto it = lru_.begin(); it != lru_.end();) {
    if (it->second == instance_id) {
      where_.erase(it->first);
      it = lru_.erase(it);
    } else {
      ++it;
    }
  }
}

}  // namespace inferd
