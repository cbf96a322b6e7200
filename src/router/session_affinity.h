// SessionAffinity: which instance served each session's last turn (a body's session_id or the
// X-Session-Id header), so its next turn goes there while that instance is healthy: its prefix
// cache (and session pins) hold the conversation. The router keeps a second one from each
// stored /v1/responses answer's id to the instance that stores it. An LRU map: the least
// recently used keys beyond `capacity` are forgotten. Not thread-safe: the router's I/O thread
// owns it.
#pragma once

#include <cstdint>
#include <list>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>

namespace inferd {

class SessionAffinity final {
 public:
  explicit SessionAffinity(size_t capacity = 100000);

  // The instance of the session's last turn, if remembered; refreshes the session.
  std::optional<uint64_t> lookup(const std::string& session_id);
  // The instance that served this turn.
  void record(const std::string& session_id, uint64_t instance_id);
  // Forgets one session.
  void erase(const std::string& session_id);
  // Forgets every session of an instance that left the fleet.
  void forget_instance(uint64_t instance_id);

  size_t size() const { return lru_.size(); }

 private:
  size_t capacity_;
  std::list<std::pair<std::string, uint64_t>> lru_;  // most recent first
  std::unordered_map<std::string, std::list<std::pair<std::string, uint64_t>>::iterator> where_;
};

}  // namespace inferd
