// DiskKvTier: offloaded KV blocks as files DIR/<store>/<key>.kvb, at most `max_bytes` in all
// (least recently written or read removed first). Files written by an earlier run of the same
// model and layout are found at start and served. Writes go to a temporary name and are renamed
// into place, so a reader never sees half a record (a crash or a full disk may leave a short file;
// its check makes it a miss). put() runs on the writer thread, get()/remove() on the engine
// thread; the index is shared under a mutex.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "kv/kv_tier.h"

namespace inferd {

// Creates `dir` when missing and checks that files can be written in it (flag checking at start).
Status check_writable_dir(const std::string& dir, const std::string& flag);

class DiskKvTier final : public KvTier {
 public:
  // Creates DIR/<store_name> when missing and indexes the records already there.
  static Expected<std::unique_ptr<DiskKvTier>> open(const std::string& dir, const std::string& store_name,
                                                    int64_t max_bytes);

  const char* name() const override { return "disk"; }
  bool up() const override { return true; }
  bool put(const BlockHash& key, std::span<const std::byte> record) override;
  void get(std::span<const BlockHash> keys, const Take& take) override;
  void remove(const BlockHash& key) override;

  const std::string& path() const { return path_; }
  int64_t num_bytes() const;
  int64_t num_records() const;

 private:
  DiskKvTier(std::string path, int64_t max_bytes) : path_(std::move(path)), max_bytes_(max_bytes) {}
  std::string file_of(const BlockHash& key) const;
  void index_existing();
  // Under mutex_: records `key` as most recently used with `bytes`.
  void note_locked(const BlockHash& key, int64_t bytes);
  void evict_locked(std::vector<std::string>* doomed);

  std::string path_;
  int64_t max_bytes_;
  mutable std::mutex mutex_;
  struct Entry {
    int64_t bytes;
    std::list<BlockHash>::iterator lru;
  };
  std::list<BlockHash> lru_;  // front = least recently used
  std::unordered_map<BlockHash, Entry, BlockHashHasher> index_;
  int64_t total_bytes_ = 0;
  std::vector<std::byte> read_buffer_;  // engine thread
};

}  // namespace inferd
