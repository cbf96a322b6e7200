// KVCacheManager: per-request block tables over a BlockPool. The scheduler asks it for room
// before running a request's tokens (allocate_slots) and returns the blocks when the request
// finishes, is aborted or preempted (free). Engine thread only.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "kv/block_pool.h"
#include "kv/kv_export_store.h"

namespace inferd {

using RequestId = uint64_t;

// Where blocks the pool no longer holds may still be found (KvOffloader: disk, Redis; a prefill
// instance). Loads run on the source's own thread: a request whose KV is coming waits with its
// blocks reserved while the engine keeps stepping the others (Scheduler's kWaitingForKv).
class KvBlockSource {
 public:
  virtual ~KvBlockSource() = default;
  // Engine thread. Starts loading the contents of keys[0], keys[1], ... (a hash chain, in order)
  // into blocks[0], blocks[1], ... (fresh pool blocks the caller holds and nobody else touches
  // until poll() reports the load); returns its ticket.
  virtual uint64_t start_load(std::vector<BlockHash> keys, std::vector<int32_t> blocks) = 0;
  struct Finished {
    uint64_t ticket = 0;
    int64_t loaded = 0;  // leading keys whose blocks now hold their contents (the rest: missing)
    std::string error;   // non-empty when the load failed (a tier went down), not on a clean miss
  };
  // Engine thread. Appends the loads finished since the last call.
  virtual void poll(std::vector<Finished>* finished) = 0;
  // Engine thread. Asks a load to stop early; poll() still reports it (its blocks are written
  // until then).
  virtual void cancel(uint64_t ticket) = 0;
};

// A prefill instance's KV of one request: the handle its answer carried (docs/disaggregation.md).
struct RemoteKvRef {
  std::string host;
  uint16_t port = 0;
  uint64_t transfer_id = 0;
  int64_t num_tokens = 0;  // prompt tokens the transfer holds
};

// Where a request's KV is pulled from another instance (the decode side of disaggregation), on
// the source's own thread, as KvBlockSource loads do.
class RemoteKvSource {
 public:
  virtual ~RemoteKvSource() = default;
  // Engine thread. Pulls blocks first_block, first_block + 1, ... of `from` into blocks[0],
  // blocks[1], ... (fresh pool blocks the caller holds), checking block i against keys[i].
  virtual uint64_t start_load(const RemoteKvRef& from, int64_t first_block, std::vector<BlockHash> keys,
                              std::vector<int32_t> blocks) = 0;
  // Engine thread, as KvBlockSource::poll / cancel. `timed_out`: given up waiting (the peer may be
  // unreachable), not aborted.
  virtual void poll(std::vector<KvBlockSource::Finished>* finished) = 0;
  virtual void cancel(uint64_t ticket, bool timed_out) = 0;
  // Its counters (read from any thread).
  virtual const KvTransferStats& stats() const = 0;
};

class KVCacheManager final {
 public:
  // pool: not owned. block_size: tokens per block. prefix_caching: reuse full blocks by content.
  KVCacheManager(BlockPool& pool, int32_t block_size, bool prefix_caching = false);

  // A request's tokens as two runs (prompt, then output so far), and the key their hash chain
  // starts from: zero for the base model, a LoRA adapter's fingerprint for its requests, so two
  // adapters (or an adapter and the base) never share a block, here or in a tier.
  struct Tokens {
    std::span<const int32_t> prompt, output;
    BlockHash root{};
    int64_t size() const { return static_cast<int64_t>(prompt.size() + output.size()); }
    int32_t at(int64_t i) const {
      const auto p = static_cast<size_t>(i);
      return p < prompt.size() ? prompt[p] : output[p - prompt.size()];
    }
  };

  // Prefix caching, for a request that holds no blocks: takes the longest run of cached blocks
  // whose hash chain matches the first full blocks of `tokens` (never the block of the last
  // token, whose logits must be computed) and returns how many tokens they cover (0 when
  // caching is off). Counts the query and the hit. With a block source and `remote`, also lists
  // the keys of the full blocks after those (up to the same limit) that the source may hold.
  int64_t take_cached_prefix(RequestId id, const Tokens& tokens, std::vector<BlockHash>* remote = nullptr);
  // Fresh blocks for a load (held by the caller, in no table); nullopt when fewer are free.
  std::optional<std::vector<int32_t>> reserve_blocks(int64_t n);
  // Returns blocks reserve_blocks() gave (a load that ended without its request).
  void release_blocks(std::span<const int32_t> blocks);
  // A load for `id` (which holds at most its cached prefix, as take_cached_prefix() left it)
  // ended: the first `loaded` of `blocks` hold keys[0..loaded), the chain continuing the
  // request's blocks. They join its table, cached under their keys (a key some other block
  // cached meanwhile takes that block instead); the rest are released. Returns the tokens the
  // request's table now covers.
  // `last_block_tokens` (< block_size): the last of `blocks` is partly filled (a prompt's tail
  // from a prefill instance); when it landed it joins the table uncached. `from_tier`: the
  // blocks came from an offload tier, which therefore holds them already.
  int64_t adopt_loaded(RequestId id, std::span<const BlockHash> keys, std::span<const int32_t> blocks,
                       int64_t loaded, int64_t last_block_tokens = -1, bool from_tier = true);
  // The keys of the blocks that hold the first `num_tokens` of `tokens`: hash-chain keys of the
  // full blocks (what prefix caching caches them under), then, when num_tokens is not a multiple
  // of the block size, a key of the partly filled last block in a domain of its own (its tokens
  // and their count), which no full block ever has.
  std::vector<BlockHash> block_keys(const Tokens& tokens, int64_t num_tokens);
  // Tokens the request's table covers (given-back blocks included), as blocks x block_size.
  int64_t num_table_tokens(RequestId id) const {
    return (static_cast<int64_t>(block_table(id).size()) + evicted_blocks(id)) * block_size_;
  }
  KvBlockSource* block_source() const { return source_; }
  // Registers the request's full blocks among its first `num_computed` tokens for reuse.
  void cache_full_blocks(RequestId id, const Tokens& tokens, int64_t num_computed);
  bool prefix_caching() const { return prefix_caching_; }
  // Where take_cached_prefix() looks past the pool's own blocks (not owned; nullptr = nowhere).
  void set_block_source(KvBlockSource* source) { source_ = source; }
  int64_t prefix_query_tokens() const { return query_tokens_; }
  int64_t prefix_hit_tokens() const { return hit_tokens_; }

  int32_t block_size() const { return block_size_; }

  // Makes the request's table cover `num_tokens` tokens, taking blocks as needed. Returns false
  // (and changes nothing) when the pool has too few free blocks.
  [[nodiscard]] bool allocate_slots(RequestId id, int64_t num_tokens);
  // Makes room in the request's table (and its list of keys) for `max_tokens` tokens, so that
  // allocate_slots() and cache_full_blocks() do not allocate while it grows to that length
  // (no-op for a request that holds no blocks).
  void reserve_table(RequestId id, int64_t max_tokens);

  // A sliding window (StreamingLLM): gives back the blocks of positions [sink_blocks x
  // block_size, end_block x block_size) that the request still holds; the first sink_blocks stay.
  // The table then has a hole: block_table() lists the sink's blocks, then those from
  // sink_blocks + evicted_blocks() on, and slot() maps positions across the hole. Returns how
  // many blocks were given back. The given-back blocks stay cached (their keys are valid).
  int64_t evict(RequestId id, int64_t sink_blocks, int64_t end_block);
  // Blocks given back by evict() (0 for a request that never evicted).
  int64_t evicted_blocks(RequestId id) const;

  // The blocks of `id` in position order, without the given-back ones (empty when it holds none).
  std::span<const int32_t> block_table(RequestId id) const;

  // Cache slot of position `pos` of request `id` (pos must be covered, not given back).
  int64_t slot(RequestId id, int64_t pos) const;

  // Blocks needed for `num_tokens` tokens of a request that holds none.
  int64_t blocks_for(int64_t num_tokens) const { return (num_tokens + block_size_ - 1) / block_size_; }

  // A block whose contents must be copied (all layers) before a forked request writes to it.
  struct BlockCopy {
    int32_t src, dst;
  };
  // Gives `child` (which holds no blocks) the blocks covering the first `num_tokens` tokens of
  // `parent`: full blocks are shared (one more reference each), a partly filled last block is
  // replaced by a fresh block that the caller must fill from `copy`. Returns false (and changes
  // nothing) when no block is free for that copy.
  [[nodiscard]] bool fork(RequestId parent, RequestId child, int64_t num_tokens,
                          std::optional<BlockCopy>* copy);

  // Returns every block of `id` to the pool (tail blocks first). No-op for an unknown id.
  void free(RequestId id);

  // Session context pool. Pins the full, content-keyed blocks of `id` (a finished turn) for
  // `session` until `expiry`, replacing the session's previous pin: pinned blocks hold a
  // reference, so LRU reuse cannot take them. Pins are kept within `max_pinned` blocks in all,
  // dropping the least recently pinned sessions (back to ordinary LRU). Call before free(id).
  void pin_session(const std::string& session, RequestId id, std::chrono::steady_clock::time_point expiry,
                   int64_t max_pinned);
  // Drops sessions whose pin expired by `now`.
  void expire_sessions(std::chrono::steady_clock::time_point now);
  // Drops the least recently pinned session; false when none is pinned.
  bool drop_oldest_session();
  int64_t num_sessions() const { return static_cast<int64_t>(sessions_.size()); }
  int64_t num_pinned_blocks() const { return pinned_blocks_; }

  int64_t num_blocks_total() const { return pool_.num_blocks(); }
  int64_t num_free_blocks() const { return pool_.num_free_blocks(); }
  int64_t num_requests() const { return static_cast<int64_t>(tables_.size()); }
  // Share of the pool in use, 0..1.
  double usage() const;

 private:
  struct Table {
    std::vector<int32_t> blocks;
    std::vector<BlockHash> hashes;  // content keys of the first hashes.size() position blocks
    int64_t sink_blocks = 0;        // evict(): blocks[0, sink_blocks) are positions' blocks 0...
    int64_t evicted_blocks = 0;     // ... and blocks[i >= sink_blocks] is position block i + this
    // Index into `blocks` of position block b; -1 when it was given back.
    int64_t index(int64_t b) const {
      if (b < sink_blocks || evicted_blocks == 0) return b;
      return b < sink_blocks + evicted_blocks ? -1 : b - evicted_blocks;
    }
  };
  BlockHash hash_block(const BlockHash* parent, const Tokens& tokens, int64_t block);

  BlockPool& pool_;
  int32_t block_size_;
  bool prefix_caching_;
  std::unordered_map<RequestId, Table> tables_;
  std::vector<int32_t> scratch_;  // one block's token ids, for hashing
  KvBlockSource* source_ = nullptr;
  struct Pin {
    std::vector<int32_t> blocks;
    std::chrono::steady_clock::time_point expiry;
    uint64_t order;  // when pinned: smaller = older
  };
  void unpin(std::unordered_map<std::string, Pin>::iterator it);
  // Drops one reference of each block, last block first.
  void release_tail_first(std::span<const int32_t> blocks);
  std::unordered_map<std::string, Pin> sessions_;
  int64_t pinned_blocks_ = 0;
  uint64_t pin_order_ = 0;
  int64_t query_tokens_ = 0, hit_tokens_ = 0;
};

}  // namespace inferd
