// RoutingPolicy: which instance of a set gets a request: round-robin, least-load, or
// cache-aware (SGLang's router rule over the PrefixIndex matches, with a load guard). Plain
// data in (Candidate per instance), an instance id out; no sockets. Not thread-safe: the
// router's I/O thread owns it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>

#include "common/status.h"

namespace inferd {

enum class PolicyKind { kRoundRobin, kLeastLoad, kCacheAware };

// "round-robin", "least-load", "cache-aware".
Expected<PolicyKind> parse_policy(std::string_view name);
const char* policy_name(PolicyKind kind);

// SGLang's cache-aware thresholds (its router's defaults).
struct CacheAwareOptions {
  double balance_abs_threshold = 32;   // loads (in flight) apart before balancing takes over...
  double balance_rel_threshold = 1.5;  // ...and the busiest above this multiple of the idlest
  double cache_threshold = 0.5;        // matched share of the prompt that makes a hit worth it
};

// One instance as the policy sees it.
struct Candidate {
  uint64_t id = 0;
  double load = 0;           // router's in flight there + its scraped running + waiting requests
  size_t matched_bytes = 0;  // of this prompt, in the instance's PrefixIndex
  size_t index_size = 0;     // chunks its PrefixIndex holds
  double kv_usage = 0;       // its scraped KV cache usage (0..1): least-load's tie-break
};

struct PolicyChoice {
  uint64_t id = 0;
  std::string rule;  // round_robin, least_load, balance, cache_hit, smallest_index
};

class RoutingPolicy final {
 public:
  explicit RoutingPolicy(PolicyKind kind, CacheAwareOptions options = {});

  // Picks one of `candidates` (non-empty, in a stable order). `group` keys the round-robin
  // cursor, one per kind of instance set (e.g. the role), so each set is cycled on its own.
  PolicyChoice choose(std::span<const Candidate> candidates, size_t prompt_bytes, int group);

  PolicyKind kind() const { return kind_; }
  const CacheAwareOptions& options() const { return options_; }

 private:
  PolicyChoice round_robin(std::span<const Candidate> candidates, int group);
  static PolicyChoice least_load(std::span<const Candidate> candidates);
  PolicyChoice cache_aware(std::span<const Candidate> candidates, size_t prompt_bytes) const;

  PolicyKind kind_;
  CacheAwareOptions options_;
  std::map<int, uint64_t> next_;  // round-robin cursor per group
};

}  // namespace inferd
