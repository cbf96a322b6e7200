// KvExportStore: a prefill instance's finished prompts' KV, kept for the decode instance that will
// pull it (docs/disaggregation.md). The engine thread puts a request's blocks here as sealed
// KvRecords when its prompt is computed; the transfer thread takes them when a decode instance
// asks. An entry not taken within the lease is dropped, and the store holds at most max_bytes.
// Thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <vector>

namespace inferd {

// Counters of KV transfers between instances (UcxKvServer, UcxKvClient), read from any thread.
struct KvTransferStats {
  std::atomic<int64_t> pulls{0};       // pulls finished with every block (either side)
  std::atomic<int64_t> blocks{0};      // blocks moved
  std::atomic<int64_t> bytes{0};       // record bytes moved
  std::atomic<int64_t> failures{0};    // pulls that ended in an error (peer gone, unknown transfer)
  std::atomic<int64_t> corrupt{0};     // records that failed their check (decode side)
  std::atomic<int64_t> micros{0};      // decode side: pull start to blocks imported, summed
  std::atomic<int64_t> rendezvous{0};  // decode side: replies that came by rendezvous (large ones)
};

struct KvExportStats {
  std::atomic<int64_t> exported{0}, exported_bytes{0};  // entries put
  std::atomic<int64_t> taken{0};                        // entries pulled
  std::atomic<int64_t> expired{0};                      // dropped at the end of their lease
  std::atomic<int64_t> refused{0};                      // did not fit in max_bytes
};

class KvExportStore final {
 public:
  KvExportStore(double lease_seconds, int64_t max_bytes);

  struct Entry {
    std::shared_ptr<const std::vector<std::byte>> records;  // num_blocks records of record_bytes each
    int64_t num_blocks = 0;
    size_t record_bytes = 0;
    std::chrono::steady_clock::time_point expiry;
  };
  // Whether `bytes` more would fit now (expired entries dropped first).
  bool fits(size_t bytes);
  // Keeps `records` under `id` for the lease; false (nothing kept) when it does not fit.
  bool put(uint64_t id, std::vector<std::byte> records, int64_t num_blocks, size_t record_bytes);
  // Removes and returns the entry of `id`; nullopt when there is none (never put, taken, expired).
  std::optional<Entry> take(uint64_t id);
  bool contains(uint64_t id);
  // The size of `id`'s entry; false when there is none.
  bool describe(uint64_t id, int64_t* num_blocks, int64_t* bytes);
  // Drops entries whose lease ended.
  void expire();

  // Fault injection for the fleet tests (INFERD_FAULT_CORRUPT_KV_EXPORT): put() flips one byte of
  // the last record's payload, as a transfer corrupted past the transport's own checks would.
  void set_corrupt_for_tests(bool on) { corrupt_for_tests_ = on; }

  double lease_seconds() const { return lease_seconds_; }
  int64_t num_entries() const { return num_entries_.load(); }
  int64_t bytes() const { return bytes_.load(); }
  const KvExportStats& stats() const { return stats_; }

 private:
  void expire_locked(std::chrono::steady_clock::time_point now);
  double lease_seconds_;
  int64_t max_bytes_;
  bool corrupt_for_tests_ = false;
  std::mutex mutex_;
  std::unordered_map<uint64_t, Entry> entries_;  // guarded by mutex_
  std::atomic<int64_t> bytes_{0}, num_entries_{0};
  KvExportStats stats_;
};

}  // namespace inferd
