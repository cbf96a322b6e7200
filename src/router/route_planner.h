// RoutePlanner: where one request goes. Over the InstancePool's healthy instances it applies
// session affinity, the RoutingPolicy and the DisaggDecider, and records the prompt in the
// chosen instances' PrefixIndexes. Plain logic, no sockets: the HTTP side (router_server)
// carries the plan out. Not thread-safe: the router's I/O thread owns it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "router/disagg_decider.h"
#include "router/instance_pool.h"
#include "router/routed_request.h"
#include "router/routing_policy.h"
#include "router/session_affinity.h"

namespace inferd {

struct PlannerOptions {
  PolicyKind policy = PolicyKind::kCacheAware;
  CacheAwareOptions cache_aware;
  int64_t disagg_min_tokens = 256;
  size_t max_sessions = 100000;  // sessions remembered, and as many stored responses' instances
};

struct RoutePlan {
  bool disaggregated = false;
  uint64_t prefill_id = 0;  // when disaggregated: the prefill instance
  uint64_t target_id = 0;   // the both or decode instance whose answer the client gets
  InstanceRole target_role = InstanceRole::kBoth;
  // How the target was chosen: the policy's rule, "session", or "response" (the instance that
  // stores the previous_response_id: no other can answer).
  std::string rule;
  DisaggDecision decision;   // why disaggregated or not
  size_t matched_bytes = 0;  // of the prompt, on the instance that computes it
};

// One pick of an instance of a role.
struct InstancePick {
  uint64_t id = 0;
  std::string rule;
  size_t matched_bytes = 0;
};

class RoutePlanner final {
 public:
  // pool: not owned, outlives the planner.
  RoutePlanner(InstancePool* pool, PlannerOptions options);

  // The plan for a request, its prompt added to the chosen instances' indexes; none when no
  // instance that can answer (a both or a decode) is healthy.
  std::optional<RoutePlan> plan(const RoutedRequest& request);
  // An instance of `role` other than `exclude` (a retry, or the decode instance after a failed
  // prefill), its index updated; none when there is no other healthy one.
  std::optional<InstancePick> pick(InstanceRole role, const RoutedRequest& request,
                                   std::optional<uint64_t> exclude);
  // The request's answer came from `instance_id`: its session's next turn goes there.
  void served(const RoutedRequest& request, uint64_t instance_id);

  // The instance that stores a /v1/responses answer, if the router saw it (or found it).
  std::optional<uint64_t> response_owner(const std::string& response_id);
  // `instance_id` stores the response `response_id`: its continuations go there.
  void stored(const std::string& response_id, uint64_t instance_id) {
    responses_.record(response_id, instance_id);
  }
  // The response was deleted.
  void forget_response(const std::string& response_id) { responses_.erase(response_id); }
  // An instance left the fleet: its sessions and stored responses are forgotten.
  void forget_instance(uint64_t instance_id);

  const PlannerOptions& options() const { return options_; }
  SessionAffinity& sessions() { return sessions_; }

 private:
  std::optional<InstancePick> choose(InstanceRole role, const RoutedRequest& request,
                                     std::optional<uint64_t> exclude);
  // The session's instance while it is healthy and can answer.
  InstanceState* session_instance(const RoutedRequest& request);
  void remember(uint64_t id, const RoutedRequest& request);

  InstancePool* pool_;
  PlannerOptions options_;
  RoutingPolicy policy_;
  DisaggDecider decider_;
  SessionAffinity sessions_;
  SessionAffinity responses_;  // response id -> the instance that stores it
};

}  // namespace inferd
