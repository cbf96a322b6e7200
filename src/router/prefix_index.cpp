#include "router/prefix_index.h"

#include <algorithm>

#include "common/check.h"

namespace inferd {

namespace {

constexpr uint64_t kFullChunkSeed = 0x9e3779b97f4a7c15ull;
constexpr uint64_t kTailDomain = 0xc2b2ae3d27d4eb4full;

// splitmix64's finalizer: spreads FNV's low-entropy high bits.
uint64_t mix(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

// FNV-1a over the bytes, started from the predecessor's key.
uint64_t chain(uint64_t previous, std::string_view bytes) {
  uint64_t h = 0xcbf29ce484222325ull ^ mix(previous);
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return mix(h ^ bytes.size());
}

}  // namespace

std::vector<uint64_t> prefix_chunk_keys(std::string_view prompt) {
  std::vector<uint64_t> keys;
  keys.reserve(prompt.size() / kPrefixChunkBytes + 1);
  uint64_t previous = kFullChunkSeed;
  size_t at = 0;
  for (; at + kPrefixChunkBytes <= prompt.size(); at += kPrefixChunkBytes) {
    previous = chain(previous, prompt.substr(at, kPrefixChunkBytes));
    keys.push_back(previous);
  }
  if (at < prompt.size()) keys.push_back(chain(previous ^ kTailDomain, prompt.substr(at)));
  return keys;
}

PrefixIndex::PrefixIndex(size_t capacity) : capacity_(capacity) {
  INFERD_CHECK(capacity > 0);
}

size_t PrefixIndex::match(std::string_view prompt) const {
  const std::vector<uint64_t> keys = prefix_chunk_keys(prompt);
  size_t matched = 0;
  for (uint64_t key : keys) {
    if (!where_.contains(key)) break;
    matched = std::min(prompt.size(), matched + kPrefixChunkBytes);
  }
  return matched;
}

void PrefixIndex::insert(std::string_view prompt) {
  const std::vector<uint64_t> keys = prefix_chunk_keys(prompt);
  // Last chunk first: chunk 0 ends the most recent, the last to be evicted.
  for (auto it = keys.rbegin(); it != keys.rend(); ++it) {
    if (auto found = where_.find(*it); found != where_.end()) {
      lru_.splice(lru_.begin(), lru_, found->second);
      continue;
    }
    lru_.push_front(*it);
    where_.emplace(*it, lru_.begin());
  }
  while (lru_.size() > capacity_) {
    where_.erase(lru_.back());
    lru_.pop_back();
  }
}

}  // namespace inferd
