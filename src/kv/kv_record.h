// KvRecord: the stored form of one KV block in an offload tier (disk file, Redis value): a fixed
// header naming what it holds, then the block's K/V bytes as KvCache::export_block writes them.
// KvOffloader writes records and checks every one it reads back: a record that is truncated,
// corrupt, of another model or layout, or of another key is a miss, never loaded.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "kv/block_pool.h"

namespace inferd {

// What a stored block belongs to: the model (its fingerprint) and the cache layout. Two processes
// share records only when these are equal.
struct KvStoreIdentity {
  BlockHash model;  // model_fingerprint() of the weights
  uint32_t num_layers = 0, block_size = 0, kv_dim = 0, dtype = 0;
  // One 128-bit key over all of the above: names the store (Redis key prefix, disk folder).
  BlockHash store_key() const;
  // 32 lower-case hex digits of store_key().
  std::string store_name() const;
};

//   offset  size  field
//   0       4     magic "IKVB"
//   4       2     version (1)
//   6       2     KV dtype (KvDType)
//   8       4     num_layers      12  4  block_size      16  4  kv_dim    20  4  reserved (0)
//   24      16    model fingerprint
//   40      16    block key (BlockHash: lo, hi)
//   56      8     payload bytes
//   64      8     checksum: XXH3-64 of the payload seeded with XXH3-64 of bytes [0, 64)
//   72      ...   payload: per layer, K rows then V rows of the block
inline constexpr size_t kKvRecordHeaderBytes = 72;

inline size_t kv_record_bytes(size_t payload_bytes) {
  return kKvRecordHeaderBytes + payload_bytes;
}

// Fills the header of `record` (kv_record_bytes(payload) bytes, payload already at offset 72) and
// its checksum.
void seal_kv_record(std::span<std::byte> record, const KvStoreIdentity& id, const BlockHash& key);

enum class KvRecordCheck { kOk, kTruncated, kBadMagic, kForeign, kWrongKey, kBadChecksum };
const char* kv_record_check_name(KvRecordCheck c);

// Checks a record read back for `key` against `id`, expecting `payload_bytes` of payload.
KvRecordCheck check_kv_record(std::span<const std::byte> record, const KvStoreIdentity& id,
                              const BlockHash& key, size_t payload_bytes);

// A rank's place in a tensor/pipeline-parallel job (docs/parallelism.md): each rank holds its
// own slice of every block (its heads, its stage's layers), so each rank has its own store.
struct KvShard {
  int32_t rank = 0, tensor_size = 1, stages = 1;
  bool single() const { return tensor_size * stages == 1; }
};
// The fingerprint a rank's store is named and checked by: `model` itself for a single process
// (stores written before parallelism stay valid), else `model` mixed with the rank's place, so
// a record of another rank or another split is foreign.
BlockHash kv_shard_fingerprint(const BlockHash& model, const KvShard& shard);

// "0123…" (32 hex digits, hi then lo) of a 128-bit key.
std::string hex_of(const BlockHash& h);

}  // namespace inferd
