#include "kv/kv_record.h"

#include <cstdio>
#include <cstring>

#include <xxhash.h>

#include "common/check.h"

namespace inferd {

namespace {

constexpr uint32_t kMagic = 0x42564b49;  // "IKVB" little-endian
constexpr uint16_t kVersion = 1;
constexpr size_t kChecksumOffset = 64;

template <typename T>
void put(std::byte* p, size_t at, T v) {
  std::memcpy(p + at, &v, sizeof v);
}
template <typename T>
T get(const std::byte* p, size_t at) {
  T v;
  std::memcpy(&v, p + at, sizeof v);
  return v;
}

// The header's first 64 bytes seed the hash of the payload: one checksum covers both.
uint64_t record_checksum(std::span<const std::byte> record) {
  const uint64_t header = XXH3_64bits(record.data(), kChecksumOffset);
  return XXH3_64bits_withSeed(record.data() + kKvRecordHeaderBytes, record.size() - kKvRecordHeaderBytes,
                              header);
}

}  // namespace

BlockHash KvStoreIdentity::store_key() const {
  std::byte buf[32];
  put(buf, 0, model.lo);
  put(buf, 8, model.hi);
  put(buf, 16, num_layers);
  put(buf, 20, block_size);
  put(buf, 24, kv_dim);
  put(buf, 28, dtype);
  const XXH128_hash_t h = XXH3_128bits(buf, sizeof buf);
  return BlockHash{h.low64, h.high64};
}

BlockHash kv_shard_fingerprint(const BlockHash& model, const KvShard& shard) {
  if (shard.single()) return model;
  std::byte buf[28];
  put(buf, 0, model.lo);
  put(buf, 8, model.hi);
  put(buf, 16, shard.rank);
  put(buf, 20, shard.tensor_size);
  put(buf, 24, shard.stages);
  const XXH128_hash_t h = XXH3_128bits(buf, sizeof buf);
  return BlockHash{h.low64, h.high64};
}

std::string KvStoreIdentity::store_name() const {
  return hex_of(store_key());
}

std::string hex_of(const BlockHash& h) {
  char s[33];
  std::snprintf(s, sizeof s, "%016llx%016llx", static_cast<unsigned long long>(h.hi),
                static_cast<unsigned long long>(h.lo));
  return s;
}

void seal_kv_record(std::span<std::byte> record, const KvStoreIdentity& id, const BlockHash& key) {
  INFERD_CHECK(record.size() >= kKvRecordHeaderBytes);
  std::byte* p = record.data();
  put(p, 0, kMagic);
  put(p, 4, kVersion);
  put(p, 6, static_cast<uint16_t>(id.dtype));
  put(p, 8, id.num_layers);
  put(p, 12, id.block_size);
  put(p, 16, id.kv_dim);
  put(p, 20, uint32_t{0});
  put(p, 24, id.model.lo);
  put(p, 32, id.model.hi);
  put(p, 40, key.lo);
  put(p, 48, key.hi);
  put(p, 56, static_cast<uint64_t>(record.size() - kKvRecordHeaderBytes));
  put(p, kChecksumOffset, record_checksum(record));
}

KvRecordCheck check_kv_record(std::span<const std::byte> record, const KvStoreIdentity& id,
                              const BlockHash& key, size_t payload_bytes) {
  if (record.size() < kKvRecordHeaderBytes) return KvRecordCheck::kTruncated;
  const std::byte* p = record.data();
  if (get<uint32_t>(p, 0) != kMagic || get<uint16_t>(p, 4) != kVersion) return KvRecordCheck::kBadMagic;
  if (get<uint64_t>(p, 56) != record.size() - kKvRecordHeaderBytes ||
      record.size() != kv_record_bytes(payload_bytes)) {
    // A record cut short (or padded) disagrees with its own length field or with the layout.
    return get<uint64_t>(p, 56) == payload_bytes ? KvRecordCheck::kTruncated : KvRecordCheck::kForeign;
  }
  if (get<uint16_t>(p, 6) != id.dtype || get<uint32_t>(p, 8) != id.num_layers ||
      get<uint32_t>(p, 12) != id.block_size || get<uint32_t>(p, 16) != id.kv_dim ||
      get<uint64_t>(p, 24) != id.model.lo || get<uint64_t>(p, 32) != id.model.hi) {
    return KvRecordCheck::kForeign;
  }
  if (get<uint64_t>(p, 40) != key.lo || get<uint64_t>(p, 48) != key.hi) return KvRecordCheck::kWrongKey;
  if (get<uint64_t>(p, kChecksumOffset) != record_checksum(record)) return KvRecordCheck::kBadChecksum;
  return KvRecordCheck::kOk;
}

const char* kv_record_check_name(KvRecordCheck c) {
  switch (c) {
    case KvRecordCheck::kOk: return "ok";
    case KvRecordCheck::kTruncated: return "truncated";
    case KvRecordCheck::kBadMagic: return "not a KV record";
    case KvRecordCheck::kForeign: return "another model or cache layout";
    case KvRecordCheck::kWrongKey: return "another block's key";
    case KvRecordCheck::kBadChecksum: return "checksum mismatch";
  }
  return "?";
}

}  // namespace inferd
