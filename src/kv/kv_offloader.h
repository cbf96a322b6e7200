// KvOffloader: keeps cached KV blocks beyond the pool, in the offload tiers (disk, Redis).
//
//   engine thread                                   writer thread
//   after a step, content usage >= watermark:
//     coldest free cached blocks ──stage()──► staging slots (preallocated) ──put()──► tiers
//   allocate() reusing a cached block not yet staged: stage() it first (last chance)
//   take_cached_prefix() past the pool's own hits, start_load() into reserved blocks:
//                                                   reader thread
//     the request waits (kWaitingForKv) ◄─poll()─── tiers ──get()──► check ──► import into the blocks
//     then adopt_loaded() caches the blocks and the request joins the batch
//
// Neither direction stalls a step: a block is copied into a staging slot (a memcpy) and the writer
// thread stores it (when every slot is busy the block is skipped, counted); reads run on the
// reader thread, bounded by the tiers' timeouts, while the engine steps the other requests. A
// record that fails its check is a miss (and is removed), so the worst a tier can do is cost a
// recomputation.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "kv/block_pool.h"
#include "kv/kv_cache.h"
#include "kv/kv_cache_manager.h"
#include "kv/kv_record.h"
#include "kv/kv_tier.h"

namespace inferd {

struct KvOffloadOptions {
  std::string disk_dir;              // --kv-offload-dir: empty = no disk tier
  double disk_gb = 8;                // --kv-offload-disk-gb
  std::string redis_url;             // --kv-offload-redis: empty = no Redis tier
  double watermark = 0.8;            // --kv-offload-watermark: content usage above which cold blocks go out
  int32_t max_blocks_per_step = 16;  // staged after one step (a memcpy each)
  int64_t staging_bytes = int64_t{256} << 20;  // upper bound of the staging slots' memory
  int32_t max_staging_blocks = 64;

  bool enabled() const { return !disk_dir.empty() || !redis_url.empty(); }
  Status validate() const;
};

class KvOffloader final : public KvBlockSource {
 public:
  // cache: not owned, must outlive this. Opens the tiers and starts the writer thread.
  static Expected<std::unique_ptr<KvOffloader>> create(const KvOffloadOptions& options, KvCache& cache,
                                                       const BlockHash& model_fingerprint);
  // Lets the writer store what is staged (up to a few seconds), then joins it.
  ~KvOffloader() override;
  KvOffloader(const KvOffloader&) = delete;
  KvOffloader& operator=(const KvOffloader&) = delete;

  // Engine thread. Connects to `pool`: its evictions of blocks no tier holds are staged first.
  void attach(BlockPool& pool);
  // Engine thread. When the pool's content usage is at or above the watermark, stages up to
  // `max_blocks` of its coldest free cached blocks that no tier holds; returns how many.
  int32_t offload_cold(BlockPool& pool, int32_t max_blocks);
  // Engine thread. Whether cold blocks wait to be staged: the pool is at or above the watermark
  // and holds free cached blocks no tier has (staging slots may all be busy just now).
  bool has_cold_work(const BlockPool& pool) const;
  // Engine thread. Copies `block` (content key `hash`) into a staging slot for the writer and
  // marks it offloaded; false (nothing changed) when every slot is busy.
  bool stage(BlockPool& pool, int32_t block);
  // Engine thread. Called after each block stage() took, with its key: the other ranks of a
  // parallel job stage their slice of the same block (docs/parallelism.md).
  void set_stage_hook(std::function<void(int32_t block, const BlockHash& key)> hook) {
    stage_hook_ = std::move(hook);
  }
  // A rank other than 0 of a parallel job (it has no pool of its own): copies `block` into a
  // staging slot to be stored under `key`; false when every slot is busy (counted as dropped).
  bool stage_block(int32_t block, const BlockHash& key);

  // KvBlockSource (engine thread): loads on the reader thread (started on first use).
  uint64_t start_load(std::vector<BlockHash> keys, std::vector<int32_t> blocks) override;
  void poll(std::vector<Finished>* finished) override;
  void cancel(uint64_t ticket) override;
  // Waits for load `ticket` to finish and returns what poll() would have reported for it (a rank
  // other than 0 of a parallel job, which follows rank 0's loads instead of polling).
  Finished wait_load(uint64_t ticket);
  // Engine thread, synchronous: loads consecutive keys into fresh blocks of `pool` (as many as are
  // free), each cached under its key and appended to `blocks`; returns how many (tests, tools).
  int64_t load(std::span<const BlockHash> keys, BlockPool& pool, std::vector<int32_t>* blocks);

  // Blocks until the writer has stored everything staged so far (tests, benchmarks).
  void flush();

  const KvStoreIdentity& identity() const { return identity_; }
  // Tiers in lookup order (disk first, then Redis). Their stats are safe to read from any thread.
  const std::vector<std::unique_ptr<KvTier>>& tiers() const { return tiers_; }
  int64_t num_dropped_writes() const { return dropped_writes_.load(); }

 private:
  KvOffloader(const KvOffloadOptions& options, KvCache& cache, KvStoreIdentity identity);
  void writer_loop();
  void reader_loop();
  // Fills blocks[i] with keys[i]'s record, in order, until a miss, a bad record or `cancel`.
  // Returns how many; `error` names a tier that went down meanwhile. The reader side: one thread
  // at a time (the reader thread, or load()'s caller).
  int64_t read_into(std::span<const BlockHash> keys, std::span<const int32_t> blocks,
                    const std::atomic<bool>* cancel, std::string* error);
  std::span<std::byte> slot_bytes(int32_t slot) {
    return {staging_.data() + static_cast<size_t>(slot) * record_bytes_, record_bytes_};
  }

  KvOffloadOptions options_;
  KvCache& cache_;
  KvStoreIdentity identity_;
  size_t payload_bytes_, record_bytes_;
  std::vector<std::unique_ptr<KvTier>> tiers_;
  std::vector<std::byte> staging_;  // [slots, record_bytes]
  std::vector<int32_t> cold_;       // engine thread scratch

  struct Job {
    BlockHash key;
    int32_t slot;
  };
  std::mutex mutex_;
  std::condition_variable wake_writer_, drained_;
  std::vector<int32_t> free_slots_;      // guarded by mutex_
  std::vector<Job> jobs_;                // guarded by mutex_: a ring of one entry per slot
  size_t jobs_head_ = 0, num_jobs_ = 0;  // guarded by mutex_
  int32_t in_flight_ = 0;                // guarded by mutex_: jobs taken by the writer, not yet done
  bool stopping_ = false;                // guarded by mutex_
  std::atomic<int64_t> dropped_writes_{0};
  std::thread writer_;

  struct Load {
    uint64_t ticket;
    std::vector<BlockHash> keys;
    std::vector<int32_t> blocks;
    std::shared_ptr<std::atomic<bool>> cancel;
  };
  std::mutex load_mutex_;
  std::condition_variable wake_reader_, load_finished_;
  std::vector<Load> loads_;  // guarded by load_mutex_: queued, oldest first
  std::vector<std::pair<uint64_t, std::shared_ptr<std::atomic<bool>>>> load_flags_;  // ... and in flight
  std::vector<Finished> finished_;                                                   // guarded by load_mutex_
  bool reader_stopping_ = false;                                                     // guarded by load_mutex_
  uint64_t next_ticket_ = 1;                                                         // engine thread
  std::thread reader_;
  std::function<void(int32_t, const BlockHash&)> stage_hook_;  // engine thread
};

}  // namespace inferd
