// KvTier: one place beyond the KV pool that keeps offloaded blocks (DiskKvTier, RedisKvTier),
// behind the narrow interface KvOffloader drives: put from its writer thread, get and remove from
// the engine thread. Records are opaque bytes here; KvOffloader seals and checks them.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <span>
#include <string>

#include "kv/block_pool.h"

namespace inferd {

// Counters of one tier, read by metrics from any thread.
struct KvTierStats {
  std::atomic<int64_t> writes{0}, write_bytes{0};  // records stored
  std::atomic<int64_t> reads{0}, read_bytes{0};    // records loaded into the pool
  std::atomic<int64_t> failures{0};                // I/O errors, timeouts, writes skipped while down
  std::atomic<int64_t> corrupt{0};                 // records read back that failed their check
};

class KvTier {
 public:
  virtual ~KvTier() = default;
  // "disk" or "redis": the metrics label.
  virtual const char* name() const = 0;
  // Whether the tier is usable now (a Redis that is down is skipped until it is back).
  virtual bool up() const = 0;

  // Writer thread. Stores `record` under `key`; false when it could not.
  virtual bool put(const BlockHash& key, std::span<const std::byte> record) = 0;
  // Writer thread, while idle (about once a second): reconnect, tidy up.
  virtual void maintain() {}

  // Reader side (KvOffloader's reader thread, or load()'s caller). Reads the records of keys[0], keys[1], ...
  // in order and hands each to `take(record)`, stopping at the first key the tier lacks, at a read error, or
  // when `take` returns false. Must never block for long: a slow backend times out and counts as a miss.
  using Take = std::function<bool(std::span<const std::byte> record)>;
  virtual void get(std::span<const BlockHash> keys, const Take& take) = 0;
  // Reader side. Deletes a record that failed its check.
  virtual void remove(const BlockHash& key) = 0;

  KvTierStats& stats() { return stats_; }
  const KvTierStats& stats() const { return stats_; }

 private:
  KvTierStats stats_;
};

}  // namespace inferd
