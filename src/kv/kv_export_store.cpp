#include "kv/kv_export_store.h"

namespace inferd {

KvExportStore::KvExportStore(double lease_seconds, int64_t max_bytes)
    : lease_seconds_(lease_seconds), max_bytes_(max_bytes) {}

void KvExportStore::expire_locked(std::chrono::steady_clock::time_point now) {
  for (auto it = entries_.begin(); it != entries_.end();) {
    if (it->second.expiry > now) {
      ++it;
      continue;
    }
    bytes_ -= static_cast<int64_t>(it->second.records->size());
    stats_.expired++;
    it = entries_.erase(it);
  }
  num_entries_ = static_cast<int64_t>(entries_.size());
}

bool KvExportStore::fits(size_t bytes) {
  std::lock_guard lock(mutex_);
  expire_locked(std::chrono::steady_clock::now());
  return bytes_.load() + static_cast<int64_t>(bytes) <= max_bytes_;
}

bool KvExportStore::put(uint64_t id, std::vector<std::byte> records, int64_t num_blocks,
                        size_t record_bytes) {
  std::lock_guard lock(mutex_);
  const auto now = std::chrono::steady_clock::now();
  expire_locked(now);
  const auto size = static_cast<int64_t>(records.size());
  if (bytes_.load() + size > max_bytes_ || entries_.count(id) != 0) {
    stats_.refused++;
    return false;
  }
  if (corrupt_for_tests_ && !records.empty()) records.back() ^= std::byte{0x10};
  Entry e;
  e.records = std::make_shared<const std::vector<std::byte>>(std::move(records));
  e.num_blocks = num_blocks;
  e.record_bytes = record_bytes;
  e.expiry = now + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                       std::chrono::duration<double>(lease_seconds_));
  entries_.emplace(id, std::move(e));
  bytes_ += size;
  num_entries_ = static_cast<int64_t>(entries_.size());
  stats_.exported++;
  stats_.exported_bytes += size;
  return true;
}

std::optional<KvExportStore::Entry> KvExportStore::take(uint64_t id) {
  std::lock_guard lock(mutex_);
  expire_locked(std::chrono::steady_clock::now());
  auto it = entries_.find(id);
  if (it == entries_.end()) return std::nullopt;
  Entry e = std::move(it->second);
  entries_.erase(it);
  bytes_ -= static_cast<int64_t>(e.records->size());
  num_entries_ = static_cast<int64_t>(entries_.size());
  stats_.taken++;
  return e;
}

bool KvExportStore::contains(uint64_t id) {
  std::lock_guard lock(mutex_);
  return entries_.count(id) != 0;
}

bool KvExportStore::describe(uint64_t id, int64_t* num_blocks, int64_t* bytes) {
  std::lock_guard lock(mutex_);
  auto it = entries_.find(id);
  if (it == entries_.end()) return false;
  *num_blocks = it->second.num_blocks;
  *bytes = static_cast<int64_t>(it->second.records->size());
  return true;
}

void KvExportStore::expire() {
  std::lock_guard lock(mutex_);
  expire_locked(std::chrono::steady_clock::now());
}

}  // namespace inferd
