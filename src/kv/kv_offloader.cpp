#include "kv/kv_offloader.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "kv/disk_kv_tier.h"
#include "kv/redis_kv_tier.h"

namespace inferd {

Status KvOffloadOptions::validate() const {
  if (!(watermark >= 0.0 && watermark <= 1.0))
    return invalid_argument("--kv-offload-watermark must be in [0, 1], got " + std::to_string(watermark));
  if (!disk_dir.empty() && !(disk_gb > 0.0 && std::isfinite(disk_gb)))
    return invalid_argument("--kv-offload-disk-gb must be positive, got " + std::to_string(disk_gb));
  if (max_blocks_per_step < 1 || max_staging_blocks < 1 || staging_bytes < 1)
    return invalid_argument("KV offload staging must hold at least one block");
  if (!redis_url.empty()) {
    auto url = RedisUrl::parse(redis_url);
    if (!url) return url.status();
  }
  return Status::ok();
}

Expected<std::unique_ptr<KvOffloader>> KvOffloader::create(const KvOffloadOptions& options, KvCache& cache,
                                                           const BlockHash& model_fingerprint) {
  INFERD_RETURN_IF_ERROR(options.validate());
  KvStoreIdentity id;
  id.model = model_fingerprint;
  id.num_layers = static_cast<uint32_t>(cache.num_layers());
  id.block_size = static_cast<uint32_t>(cache.block_size());
  id.kv_dim = static_cast<uint32_t>(cache.kv_dim());
  id.dtype = static_cast<uint32_t>(cache.dtype());
  std::unique_ptr<KvOffloader> o(new KvOffloader(options, cache, id));
  if (!options.disk_dir.empty()) {
    const auto bytes = static_cast<int64_t>(options.disk_gb * 1e9);
    INFERD_ASSIGN_OR_RETURN(auto disk, DiskKvTier::open(options.disk_dir, id.store_name(), bytes));
    o->tiers_.push_back(std::move(disk));
  }
  if (!options.redis_url.empty()) {
    INFERD_ASSIGN_OR_RETURN(auto redis, RedisKvTier::open(options.redis_url, id.store_name()));
    o->tiers_.push_back(std::move(redis));
  }
  o->writer_ = std::thread([p = o.get()] { p->writer_loop(); });
  return o;
}

KvOffloader::KvOffloader(const KvOffloadOptions& options, KvCache& cache, KvStoreIdentity identity)
    : options_(options),
      cache_(cache),
      identity_(identity),
      payload_bytes_(cache.block_bytes()),
      record_bytes_(kv_record_bytes(cache.block_bytes())) {
  const auto by_bytes = static_cast<int64_t>(options.staging_bytes / static_cast<int64_t>(record_bytes_));
  const auto slots = static_cast<int32_t>(std::clamp<int64_t>(by_bytes, 1, options.max_staging_blocks));
  staging_.resize(static_cast<size_t>(slots) * record_bytes_);
  jobs_.resize(static_cast<size_t>(slots));
  for (int32_t s = slots - 1; s >= 0; --s) free_slots_.push_back(s);
  cold_.reserve(static_cast<size_t>(options.max_blocks_per_step));
}

KvOffloader::~KvOffloader() {
  {
    std::lock_guard<std::mutex> lock(load_mutex_);
    reader_stopping_ = true;
    for (auto& [ticket, flag] : load_flags_) flag->store(true);
  }
  wake_reader_.notify_all();
  if (reader_.joinable()) reader_.join();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_writer_.notify_all();
  if (writer_.joinable()) writer_.join();
}

void KvOffloader::attach(BlockPool& pool) {
  pool.set_evict_hook([this, &pool](int32_t block, const BlockHash&) { stage(pool, block); });
}

bool KvOffloader::stage(BlockPool& pool, int32_t block) {
  const BlockHash key = pool.hash_of(block);
  if (!stage_block(block, key)) return false;
  pool.mark_offloaded(block);
  if (stage_hook_) stage_hook_(block, key);
  return true;
}

bool KvOffloader::stage_block(int32_t block, const BlockHash& key) {
  int32_t slot;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (free_slots_.empty()) {
      ++dropped_writes_;
      return false;
    }
    slot = free_slots_.back();
    free_slots_.pop_back();
  }
  std::span<std::byte> rec = slot_bytes(slot);
  cache_.export_block(block, rec.data() + kKvRecordHeaderBytes);
  seal_kv_record(rec, identity_, key);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    jobs_[(jobs_head_ + num_jobs_) % jobs_.size()] = Job{key, slot};
    ++num_jobs_;
  }
  wake_writer_.notify_one();
  return true;
}

bool KvOffloader::has_cold_work(const BlockPool& pool) const {
  return pool.num_free_unoffloaded() > 0 && pool.content_usage() >= options_.watermark;
}

int32_t KvOffloader::offload_cold(BlockPool& pool, int32_t max_blocks) {
  if (!has_cold_work(pool)) return 0;
  pool.coldest_unoffloaded(std::min(max_blocks, static_cast<int32_t>(cold_.capacity())), &cold_);
  int32_t staged = 0;
  for (int32_t b : cold_) {
    if (!stage(pool, b)) break;
    ++staged;
  }
  return staged;
}

int64_t KvOffloader::read_into(std::span<const BlockHash> keys, std::span<const int32_t> blocks,
                               const std::atomic<bool>* cancel, std::string* error) {
  size_t done = 0;
  for (auto& tier : tiers_) {
    if (done == keys.size() || (cancel != nullptr && cancel->load())) break;
    if (!tier->up()) continue;
    KvTierStats& stats = tier->stats();
    tier->get(keys.subspan(done), [&](std::span<const std::byte> record) {
      if (cancel != nullptr && cancel->load()) return false;
      const BlockHash& key = keys[done];
      const KvRecordCheck check = check_kv_record(record, identity_, key, payload_bytes_);
      if (check != KvRecordCheck::kOk) {
        ++stats.corrupt;
        tier->remove(key);
        return false;
      }
      cache_.import_block(blocks[done], record.data() + kKvRecordHeaderBytes);
      ++stats.reads;
      stats.read_bytes += static_cast<int64_t>(record.size());
      ++done;
      return true;
    });
    if (!tier->up() && error != nullptr && error->empty()) {
      *error = std::string("the ") + tier->name() + " KV tier failed during the load";
    }
  }
  return static_cast<int64_t>(done);
}

int64_t KvOffloader::load(std::span<const BlockHash> keys, BlockPool& pool, std::vector<int32_t>* blocks) {
  const auto n =
      static_cast<int32_t>(std::min<int64_t>(static_cast<int64_t>(keys.size()), pool.num_free_blocks()));
  if (n == 0) return 0;
  std::vector<int32_t> fresh = *pool.allocate(n);
  std::string error;
  const int64_t done = read_into(keys.first(static_cast<size_t>(n)), fresh, nullptr, &error);
  for (int64_t i = 0; i < done; ++i) {
    const int32_t block = fresh[static_cast<size_t>(i)];
    pool.cache_block(block, keys[static_cast<size_t>(i)]);
    pool.mark_offloaded(block);
    blocks->push_back(block);
  }
  pool.release(std::span<const int32_t>(fresh).subspan(static_cast<size_t>(done)));
  return done;
}

uint64_t KvOffloader::start_load(std::vector<BlockHash> keys, std::vector<int32_t> blocks) {
  const uint64_t ticket = next_ticket_++;
  {
    std::lock_guard<std::mutex> lock(load_mutex_);
    auto flag = std::make_shared<std::atomic<bool>>(false);
    load_flags_.emplace_back(ticket, flag);
    loads_.push_back(Load{ticket, std::move(keys), std::move(blocks), std::move(flag)});
    if (!reader_.joinable()) reader_ = std::thread([this] { reader_loop(); });
  }
  wake_reader_.notify_one();
  return ticket;
}

void KvOffloader::poll(std::vector<Finished>* finished) {
  std::lock_guard<std::mutex> lock(load_mutex_);
  for (Finished& f : finished_) finished->push_back(std::move(f));
  finished_.clear();
}

void KvOffloader::cancel(uint64_t ticket) {
  std::lock_guard<std::mutex> lock(load_mutex_);
  for (auto& [t, flag] : load_flags_) {
    if (t == ticket) flag->store(true);
  }
}

KvBlockSource::Finished KvOffloader::wait_load(uint64_t ticket) {
  std::unique_lock<std::mutex> lock(load_mutex_);
  for (;;) {
    auto it = std::find_if(finished_.begin(), finished_.end(),
                           [&](const Finished& f) { return f.ticket == ticket; });
    if (it != finished_.end()) {
      Finished f = std::move(*it);
      finished_.erase(it);
      return f;
    }
    const bool pending =
        std::any_of(load_flags_.begin(), load_flags_.end(), [&](const auto& e) { return e.first == ticket; });
    if (!pending) return Finished{ticket, 0, "no such load"};
    load_finished_.wait(lock);
  }
}

void KvOffloader::reader_loop() {
  std::unique_lock<std::mutex> lock(load_mutex_);
  for (;;) {
    wake_reader_.wait(lock, [&] { return !loads_.empty() || reader_stopping_; });
    if (loads_.empty()) return;  // stopping, nothing queued
    Load load = std::move(loads_.front());
    loads_.erase(loads_.begin());
    lock.unlock();
    Finished f;
    f.ticket = load.ticket;
    f.loaded = load.cancel->load() ? 0 : read_into(load.keys, load.blocks, load.cancel.get(), &f.error);
    lock.lock();
    load_flags_.erase(std::find_if(load_flags_.begin(), load_flags_.end(),
                                   [&](const auto& e) { return e.first == load.ticket; }));
    finished_.push_back(std::move(f));
    load_finished_.notify_all();
  }
}

void KvOffloader::flush() {
  std::unique_lock<std::mutex> lock(mutex_);
  drained_.wait(lock, [&] { return num_jobs_ == 0 && in_flight_ == 0; });
}

void KvOffloader::writer_loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    if (num_jobs_ == 0) {
      if (stopping_) return;
      // Idle: let the tiers reconnect or tidy up about once a second.
      lock.unlock();
      for (auto& tier : tiers_) tier->maintain();
      lock.lock();
      wake_writer_.wait_for(lock, std::chrono::seconds(1), [&] { return num_jobs_ > 0 || stopping_; });
      continue;
    }
    const Job job = jobs_[jobs_head_];
    jobs_head_ = (jobs_head_ + 1) % jobs_.size();
    --num_jobs_;
    ++in_flight_;
    lock.unlock();
    const std::span<const std::byte> rec = slot_bytes(job.slot);
    for (auto& tier : tiers_) {
      if (!tier->up()) tier->maintain();
      KvTierStats& stats = tier->stats();
      if (tier->put(job.key, rec)) {  // a tier counts its own failures
        ++stats.writes;
        stats.write_bytes += static_cast<int64_t>(rec.size());
      }
    }
    lock.lock();
    free_slots_.push_back(job.slot);
    --in_flight_;
    if (num_jobs_ == 0 && in_flight_ == 0) drained_.notify_all();
  }
}

}  // namespace inferd
