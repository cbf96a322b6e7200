// PrefixIndex: the router's approximate picture of one instance's prefix cache, built from the
// prompts routed there (SGLang's cache-aware router keeps a radix tree of them; this is a
// hash chain of fixed chunks, as vLLM's block keys). Used by the cache-aware policy and by the
// disaggregation decider's estimate of uncached prompt tokens. Not thread-safe: the router's
// I/O thread owns it.
//
//   prompt bytes:  [ chunk 0: 64 B ][ chunk 1: 64 B ][ chunk 2: 64 B ][ tail < 64 B ]
//   keys:          k0 = H(seed, c0)  k1 = H(k0, c1)    k2 = H(k1, c2)   kt = H'(k2, tail)
//
// A key names its chunk and everything before it, so a match walks the chain from chunk 0 and
// stops at the first key the index does not hold. The tail's key is of another domain (H'),
// so it never matches a full chunk. The index holds at most `capacity` keys, least recently
// inserted first out.
#pragma once

#include <cstdint>
#include <list>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace inferd {

inline constexpr size_t kPrefixChunkBytes = 64;

// The chain keys of `prompt`: one per full chunk, then one for a non-empty tail.
std::vector<uint64_t> prefix_chunk_keys(std::string_view prompt);

class PrefixIndex final {
 public:
  explicit PrefixIndex(size_t capacity = 65536);

  // Bytes of `prompt`'s longest prefix whose chunks are all held (a multiple of 64, or the
  // whole prompt when its tail matched too).
  size_t match(std::string_view prompt) const;
  // Adds (or refreshes) every key of `prompt`; evicts the least recently inserted keys beyond
  // capacity. A prompt's head chunks end most recent, so eviction takes its tail first.
  void insert(std::string_view prompt);

  size_t size() const { return lru_.size(); }
  size_t capacity() const { return capacity_; }

 private:
  size_t capacity_;
  std::list<uint64_t> lru_;  // most recent first
  std::unordered_map<uint64_t, std::list<uint64_t>::iterator> where_;
};

}  // namespace inferd
