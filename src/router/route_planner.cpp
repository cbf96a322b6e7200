#include "router/route_planner.h"

#include <vector>

namespace inferd {

RoutePlanner::RoutePlanner(InstancePool* pool, PlannerOptions options)
    : pool_(pool),
      options_(options),
      policy_(options.policy, options.cache_aware),
      decider_(options.disagg_min_tokens),
      sessions_(options.max_sessions),
      responses_(options.max_sessions) {}

std::optional<InstancePick> RoutePlanner::choose(InstanceRole role, const RoutedRequest& request,
                                                 std::optional<uint64_t> exclude) {
  const std::vector<InstanceState*> healthy = pool_->healthy(role, exclude);
  if (healthy.empty()) return std::nullopt;
  std::vector<Candidate> candidates;
  candidates.reserve(healthy.size());
  for (const InstanceState* s : healthy)
    candidates.push_back(
        {s->id, s->load_score(), s->index.match(request.prompt_key), s->index.size(), s->load.kv_usage});
  const PolicyChoice c = policy_.choose(candidates, request.prompt_key.size(), static_cast<int>(role));
  InstancePick pick{c.id, c.rule, 0};
  for (const Candidate& cand : candidates) {
    if (cand.id == c.id) pick.matched_bytes = cand.matched_bytes;
  }
  return pick;
}

void RoutePlanner::remember(uint64_t id, const RoutedRequest& request) {
  if (InstanceState* s = pool_->find(id); s != nullptr && !request.prompt_key.empty())
    s->index.insert(request.prompt_key);
}

InstanceState* RoutePlanner::session_instance(const RoutedRequest& request) {
  if (request.session_id.empty()) return nullptr;
  const std::optional<uint64_t> id = sessions_.lookup(request.session_id);
  if (!id) return nullptr;
  InstanceState* s = pool_->find(*id);
  if (s == nullptr || !s->serving() || s->spec.role == InstanceRole::kPrefill) return nullptr;
  return s;
}

std::optional<uint64_t> RoutePlanner::response_owner(const std::string& response_id) {
  const std::optional<uint64_t> id = responses_.lookup(response_id);
  if (!id) return std::nullopt;
  const InstanceState* s = pool_->find(*id);
  if (s == nullptr || s->retired) {
    responses_.erase(response_id);
    return std::nullopt;
  }
  return id;
}

void RoutePlanner::forget_instance(uint64_t instance_id) {
  sessions_.forget_instance(instance_id);
  responses_.forget_instance(instance_id);
}

std::optional<RoutePlan> RoutePlanner::plan(const RoutedRequest& request) {
  const bool have_both = pool_->any_healthy(InstanceRole::kBoth);
  const bool have_decode = pool_->any_healthy(InstanceRole::kDecode);
  // A continuation goes to the instance that stores its previous response, up or not (when it is
  // down the attempt fails with its error: no other instance could answer).
  if (!request.previous_response_id.empty()) {
    if (const std::optional<uint64_t> owner = response_owner(request.previous_response_id)) {
      const InstanceState* s = pool_->find(*owner);
      RoutePlan plan;
      plan.target_id = *owner;
      plan.target_role = s->spec.role;
      plan.rule = "response";
      plan.decision.reason = *request.disagg_blocker;
      plan.matched_bytes = s->index.match(request.prompt_key);
      remember(*owner, request);
      return plan;
    }
  }
  if (!have_both && !have_decode) return std::nullopt;
  RoutePlan plan;
  InstanceState* session = session_instance(request);
  // A session on a both instance stays there: that instance holds the whole conversation.
  const bool session_on_both = session != nullptr && session->spec.role == InstanceRole::kBoth;
  DisaggInputs in;
  in.prefill_available = pool_->any_healthy(InstanceRole::kPrefill) && !session_on_both;
  in.decode_available = have_decode;
  in.blocker = request.disagg_blocker;
  in.prompt_tokens = request.estimated_prompt_tokens();
  std::optional<InstancePick> prefill;
  if (in.prefill_available && in.decode_available && !in.blocker) {
    prefill = choose(InstanceRole::kPrefill, request, std::nullopt);
    in.matched_tokens = static_cast<int64_t>(prefill->matched_bytes / 4);
  }
  plan.decision = decider_.decide(in);
  if (session_on_both && plan.decision.reason == "no_prefill" && pool_->any_healthy(InstanceRole::kPrefill))
    plan.decision.reason = "session";
  plan.disaggregated = plan.decision.disaggregate;
  const InstanceRole role = plan.disaggregated || !have_both ? InstanceRole::kDecode : InstanceRole::kBoth;
  if (session != nullptr && (session->spec.role == role || !plan.disaggregated)) {
    plan.target_id = session->id;
    plan.target_role = session->spec.role;
    plan.rule = "session";
    plan.matched_bytes = session->index.match(request.prompt_key);
  } else {
    const std::optional<InstancePick> target = choose(role, request, std::nullopt);
    plan.target_id = target->id;
    plan.target_role = role;
    plan.rule = target->rule;
    plan.matched_bytes = target->matched_bytes;
  }
  if (plan.disaggregated) {
    plan.prefill_id = prefill->id;
    plan.matched_bytes = prefill->matched_bytes;
    remember(plan.prefill_id, request);
  }
  remember(plan.target_id, request);
  return plan;
}

std::optional<InstancePick> RoutePlanner::pick(InstanceRole role, const RoutedRequest& request,
                                               std::optional<uint64_t> exclude) {
  std::optional<InstancePick> p = choose(role, request, exclude);
  if (p) remember(p->id, request);
  return p;
}

void RoutePlanner::served(const RoutedRequest& request, uint64_t instance_id) {
  if (!request.session_id.empty()) sessions_.record(request.session_id, instance_id);
}

}  // namespace inferd
