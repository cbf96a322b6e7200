#include "router/routing_policy.h"

#include <algorithm>

#include "common/check.h"

namespace inferd {

Expected<PolicyKind> parse_policy(std::string_view name) {
  if (name == "round-robin") return PolicyKind::kRoundRobin;
  if (name == "least-load") return PolicyKind::kLeastLoad;
  if (name == "cache-aware") return PolicyKind::kCacheAware;
  return invalid_argument("--policy '" + std::string(name) +
                          "' (expected round-robin, least-load or cache-aware)");
}

const char* policy_name(PolicyKind kind) {
  switch (kind) {
    case PolicyKind::kRoundRobin: return "round-robin";
    case PolicyKind::kLeastLoad: return "least-load";
    case PolicyKind::kCacheAware: return "cache-aware";
  }
  return "cache-aware";
}

RoutingPolicy::RoutingPolicy(PolicyKind kind, CacheAwareOptions options) : kind_(kind), options_(options) {}

PolicyChoice RoutingPolicy::choose(std::span<const Candidate> candidates, size_t prompt_bytes, int group) {
  INFERD_CHECK(!candidates.empty());
  switch (kind_) {
    case PolicyKind::kRoundRobin: return round_robin(candidates, group);
    case PolicyKind::kLeastLoad: return least_load(candidates);
    case PolicyKind::kCacheAware: return cache_aware(candidates, prompt_bytes);
  }
  return least_load(candidates);
}

PolicyChoice RoutingPolicy::round_robin(std::span<const Candidate> candidates, int group) {
  uint64_t& next = next_[group];
  const Candidate& c = candidates[next % candidates.size()];
  ++next;
  return {c.id, "round_robin"};
}

PolicyChoice RoutingPolicy::least_load(std::span<const Candidate> candidates) {
  // The lowest load; ties to the emptier KV cache, then the earlier candidate.
  const auto it =
      std::min_element(candidates.begin(), candidates.end(), [](const Candidate& a, const Candidate& b) {
        return a.load < b.load || (a.load == b.load && a.kv_usage < b.kv_usage);
      });
  return {it->id, "least_load"};
}

// SGLang's cache_aware rule: balance when the loads are far apart (in absolute and relative
// terms), else the longest match when it covers enough of the prompt, else the instance whose
// index is smallest (the most room for a new prefix).
PolicyChoice RoutingPolicy::cache_aware(std::span<const Candidate> candidates, size_t prompt_bytes) const {
  const auto [lo, hi] =
      std::minmax_element(candidates.begin(), candidates.end(),
                          [](const Candidate& a, const Candidate& b) { return a.load < b.load; });
  const bool imbalanced = hi->load - lo->load > options_.balance_abs_threshold &&
                          hi->load > options_.balance_rel_threshold * lo->load;
  if (imbalanced) return {lo->id, "balance"};
  // Longest match; ties to the lighter load, then the earlier candidate.
  const Candidate* best = &candidates[0];
  for (const Candidate& c : candidates) {
    if (c.matched_bytes > best->matched_bytes ||
        (c.matched_bytes == best->matched_bytes && c.load < best->load))
      best = &c;
  }
  const double ratio =
      prompt_bytes > 0 ? static_cast<double>(best->matched_bytes) / static_cast<double>(prompt_bytes) : 0.0;
  if (best->matched_bytes > 0 && ratio >= options_.cache_threshold) return {best->id, "cache_hit"};
  const Candidate* smallest = &candidates[0];
  for (const Candidate& c : candidates) {
    if (c.index_size < smallest->index_size ||
        (c.index_size == smallest->index_size && c.load < smallest->load))
      smallest = &c;
  }
  return {smallest->id, "smallest_index"};
}

}  // namespace inferd
