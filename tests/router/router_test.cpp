// The router's logic with no sockets: the prefix index (chain keys, LRU bound, longest match),
// each policy's choice on crafted loads, the disaggregation decider, the instances-file parser,
// session affinity, the route planner over a pool, and the parsing of instances' /metrics.
#include <gtest/gtest.h>

#include <string>

#include "router/disagg_decider.h"
#include "router/instance_pool.h"
#include "router/instance_spec.h"
#include "router/load_metrics.h"
#include "router/prefix_index.h"
#include "router/route_planner.h"
#include "router/routed_request.h"
#include "router/router_metrics.h"
#include "router/routing_policy.h"
#include "router/session_affinity.h"

namespace inferd {
namespace {

std::string text(size_t n, char seed = 'a') {
  std::string s;
  for (size_t i = 0; i < n; ++i)
    s.push_back(static_cast<char>(seed + static_cast<char>((i * 7 + i / 13) % 26)));
  return s;
}

// ---- PrefixIndex ------------------------------------------------------------------------------

TEST(PrefixIndexTest, KeysChainEachChunkWithItsPredecessor) {
  const std::string a = text(200);
  const std::vector<uint64_t> k = prefix_chunk_keys(a);
  ASSERT_EQ(k.size(), 4u);  // three full 64-byte chunks and an 8-byte tail
  // Same chunk bytes at another position: another key (the chain differs).
  const std::string repeated = std::string(64, 'x') + std::string(64, 'x');
  const std::vector<uint64_t> r = prefix_chunk_keys(repeated);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_NE(r[0], r[1]);
  // Changing chunk 0 changes every later key; changing chunk 2 keeps chunks 0 and 1.
  std::string b = a;
  b[3] ^= 1;
  const std::vector<uint64_t> kb = prefix_chunk_keys(b);
  for (size_t i = 0; i < k.size(); ++i) EXPECT_NE(k[i], kb[i]) << i;
  std::string c = a;
  c[150] ^= 1;
  const std::vector<uint64_t> kc = prefix_chunk_keys(c);
  EXPECT_EQ(k[0], kc[0]);
  EXPECT_EQ(k[1], kc[1]);
  EXPECT_NE(k[2], kc[2]);
  // A 64-byte tail is a full chunk, not a tail: its key differs from the tail-domain key.
  EXPECT_NE(prefix_chunk_keys(a.substr(0, 64))[0], prefix_chunk_keys(a.substr(0, 63))[0]);
  EXPECT_TRUE(prefix_chunk_keys("").empty());
}

TEST(PrefixIndexTest, MatchesTheLongestHeldPrefix) {
  PrefixIndex index(1000);
  const std::string p = text(300);
  EXPECT_EQ(index.match(p), 0u);
  index.insert(p);
  EXPECT_EQ(index.size(), 5u);               // 4 full chunks + a 44-byte tail
  EXPECT_EQ(index.match(p), 300u);           // the whole prompt, tail included
  EXPECT_EQ(index.match(p + "more"), 256u);  // its tail differs: the full chunks match
  EXPECT_EQ(index.match(p.substr(0, 150)), 128u);
  std::string other = p;
  other[70] ^= 1;  // in chunk 1
  EXPECT_EQ(index.match(other), 64u);
  EXPECT_EQ(index.match(text(300, 'b')), 0u);
  index.insert(p);  // inserting again refreshes, adds nothing
  EXPECT_EQ(index.size(), 5u);
}

TEST(PrefixIndexTest, TheLruBoundEvictsTheOldestPromptsTailFirst) {
  PrefixIndex index(8);
  const std::string a = text(64 * 6, 'a');  // 6 keys
  const std::string b = text(64 * 4, 'b');  // 4 keys
  index.insert(a);
  EXPECT_EQ(index.size(), 6u);
  index.insert(b);
  EXPECT_EQ(index.size(), 8u);  // bounded: two of a's keys went
  EXPECT_EQ(index.match(b), b.size());
  // a's head is younger than its tail (inserted last chunk first): its 4 head chunks remain.
  EXPECT_EQ(index.match(a), 64u * 4);
  // Touching a again makes b the oldest.
  index.insert(a);
  EXPECT_EQ(index.match(a), a.size());
  EXPECT_EQ(index.match(b), 64u * 2);
}

// ---- RoutingPolicy ----------------------------------------------------------------------------

std::vector<Candidate> three(double l1, double l2, double l3) {
  return {{1, l1, 0, 0}, {2, l2, 0, 0}, {3, l3, 0, 0}};
}

TEST(RoutingPolicyTest, RoundRobinCyclesEachGroupOnItsOwn) {
  RoutingPolicy rr(PolicyKind::kRoundRobin);
  const auto c = three(9, 0, 0);
  std::vector<uint64_t> got;
  for (int i = 0; i < 6; ++i) got.push_back(rr.choose(c, 0, 0).id);
  EXPECT_EQ(got, (std::vector<uint64_t>{1, 2, 3, 1, 2, 3}));
  EXPECT_EQ(rr.choose(c, 0, 1).id, 1u);  // another group starts at its own beginning
  EXPECT_EQ(rr.choose(c, 0, 0).id, 1u);
}

TEST(RoutingPolicyTest, LeastLoadTakesTheLowestScoreFirstOnTies) {
  RoutingPolicy ll(PolicyKind::kLeastLoad);
  EXPECT_EQ(ll.choose(three(5, 2, 7), 0, 0).id, 2u);
  EXPECT_EQ(ll.choose(three(1, 1, 1), 0, 0).id, 1u);
  EXPECT_EQ(ll.choose(three(3, 4, 0.5), 0, 0).id, 3u);
  EXPECT_EQ(ll.choose(three(3, 4, 0.5), 0, 0).rule, "least_load");
  // Equal loads: the emptier KV cache.
  std::vector<Candidate> c = {{1, 2, 0, 0, 0.7}, {2, 2, 0, 0, 0.2}, {3, 5, 0, 0, 0.0}};
  EXPECT_EQ(ll.choose(c, 0, 0).id, 2u);
}

TEST(RoutingPolicyTest, CacheAwareFollowsTheLongestMatchAboveTheThreshold) {
  RoutingPolicy ca(PolicyKind::kCacheAware);
  // Prompt of 1000 bytes; instance 2 holds 640 (0.64 >= 0.5) though it is busier.
  std::vector<Candidate> c = {{1, 0, 128, 10}, {2, 20, 640, 50}, {3, 1, 0, 0}};
  PolicyChoice got = ca.choose(c, 1000, 0);
  EXPECT_EQ(got.id, 2u);
  EXPECT_EQ(got.rule, "cache_hit");
  // Below the threshold: the smallest index (instance 3 holds nothing).
  c[1].matched_bytes = 320;
  got = ca.choose(c, 1000, 0);
  EXPECT_EQ(got.id, 3u);
  EXPECT_EQ(got.rule, "smallest_index");
  // Equal matches: the lighter load.
  c = {{1, 5, 640, 10}, {2, 2, 640, 10}};
  EXPECT_EQ(ca.choose(c, 1000, 0).id, 2u);
  // Equal index sizes with no match: the lighter load.
  c = {{1, 5, 0, 10}, {2, 2, 0, 10}};
  EXPECT_EQ(ca.choose(c, 1000, 0).id, 2u);
}

TEST(RoutingPolicyTest, CacheAwareBalancesOnlyWhenBothThresholdsAreCrossed) {
  RoutingPolicy ca(PolicyKind::kCacheAware);  // abs 32, rel 1.5
  // Best match on 1, but 40 - 5 = 35 > 32 and 40 > 1.5 * 5: least load wins.
  std::vector<Candidate> c = {{1, 40, 1000, 100}, {2, 5, 0, 100}};
  PolicyChoice got = ca.choose(c, 1000, 0);
  EXPECT_EQ(got.id, 2u);
  EXPECT_EQ(got.rule, "balance");
  // 100 - 70 = 30: within the absolute threshold, the match wins.
  c = {{1, 100, 1000, 100}, {2, 70, 0, 100}};
  EXPECT_EQ(ca.choose(c, 1000, 0).id, 1u);
  // 140 - 100 = 40 > 32 but 140 < 1.5 * 100: still the match.
  c = {{1, 140, 1000, 100}, {2, 100, 0, 100}};
  EXPECT_EQ(ca.choose(c, 1000, 0).id, 1u);
  // Custom thresholds.
  RoutingPolicy tight(PolicyKind::kCacheAware, CacheAwareOptions{2, 1.0, 0.5});
  c = {{1, 4, 1000, 100}, {2, 1, 0, 100}};
  EXPECT_EQ(tight.choose(c, 1000, 0).id, 2u);
}

TEST(RoutingPolicyTest, ParsesPolicyNames) {
  EXPECT_EQ(*parse_policy("round-robin"), PolicyKind::kRoundRobin);
  EXPECT_EQ(*parse_policy("least-load"), PolicyKind::kLeastLoad);
  EXPECT_EQ(*parse_policy("cache-aware"), PolicyKind::kCacheAware);
  const auto bad = parse_policy("random");
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.status().message().find("random"), std::string::npos);
}

// ---- DisaggDecider ----------------------------------------------------------------------------

TEST(DisaggDeciderTest, DisaggregatesOnlyLongUncachedPromptsWithBothRolesUp) {
  const DisaggDecider d(256);
  DisaggInputs in{true, true, std::nullopt, 1000, 0};
  EXPECT_TRUE(d.decide(in).disaggregate);
  EXPECT_EQ(d.decide(in).reason, "disaggregated");
  in.matched_tokens = 800;  // 200 uncached < 256
  EXPECT_FALSE(d.decide(in).disaggregate);
  EXPECT_EQ(d.decide(in).reason, "short_prompt");
  in.matched_tokens = 744;  // exactly 256 uncached
  EXPECT_TRUE(d.decide(in).disaggregate);
  in.blocker = "logprobs";
  EXPECT_EQ(d.decide(in).reason, "logprobs");
  in.blocker.reset();
  in.prefill_available = false;
  EXPECT_EQ(d.decide(in).reason, "no_prefill");
  in.prefill_available = true;
  in.decode_available = false;
  EXPECT_EQ(d.decide(in).reason, "no_decode");
}

TEST(RoutedRequestTest, FindsTheFieldsThatRuleOutDisaggregation) {
  auto blocker = [](const std::string& body, RouteEndpoint e = RouteEndpoint::kCompletions) {
    auto r = parse_routed_request(e, body, "");
    EXPECT_TRUE(r) << body;
    return r->disagg_blocker.value_or("");
  };
  EXPECT_EQ(blocker(R"({"prompt":"hi","max_tokens":20})"), "");
  EXPECT_EQ(blocker(R"({"prompt":"hi","n":1})"), "");
  EXPECT_EQ(blocker(R"({"prompt":"hi","n":2})"), "n");
  EXPECT_EQ(blocker(R"({"prompt":"hi","logprobs":0})"), "logprobs");
  EXPECT_EQ(blocker(R"({"messages":[],"logprobs":false})", RouteEndpoint::kChat), "");
  EXPECT_EQ(blocker(R"({"messages":[],"logprobs":true})", RouteEndpoint::kChat), "logprobs");
  EXPECT_EQ(blocker(R"({"messages":[],"top_logprobs":0})", RouteEndpoint::kChat), "");
  EXPECT_EQ(blocker(R"({"prompt":"hi","response_format":{"type":"json_object"}})"), "response_format");
  EXPECT_EQ(blocker(R"({"messages":[],"tools":[{"type":"function"}]})", RouteEndpoint::kChat), "tools");
  EXPECT_EQ(blocker(R"({"messages":[],"tools":[]})", RouteEndpoint::kChat), "");
  EXPECT_EQ(blocker(R"({"prompt":"hi","guided_regex":"a+"})"), "guided_regex");
  EXPECT_EQ(blocker(R"({"prompt":"hi","max_tokens":1})"), "max_tokens");
  EXPECT_EQ(blocker(R"({"messages":[],"max_completion_tokens":1})", RouteEndpoint::kChat),
            "max_completion_tokens");
  EXPECT_EQ(blocker(R"({"prompt":["a","b"]})"), "prompt");
  EXPECT_EQ(blocker(R"({"prompt":[1,2,3]})"), "");
}

TEST(RoutedRequestTest, BuildsThePromptKeyAndTheLegsBodies) {
  auto chat = parse_routed_request(
      RouteEndpoint::kChat,
      R"({"messages":[{"role":"system","content":"be brief"},{"role":"user","content":[{"type":"text","text":"hi"}]}],
          "stream":true,"stream_options":{"include_usage":true}})",
      "from-header");
  ASSERT_TRUE(chat);
  EXPECT_EQ(chat->prompt_key,
            "system\x1f"
            "be brief\x1euser\x1fhi\x1e");
  EXPECT_TRUE(chat->stream);
  EXPECT_EQ(chat->session_id, "from-header");
  const auto prefill = nlohmann::json::parse(prefill_body(*chat));
  EXPECT_EQ(prefill["stream"], false);
  EXPECT_FALSE(prefill.contains("stream_options"));
  EXPECT_EQ(prefill["kv_transfer_params"], (nlohmann::json{{"do_remote_decode", true}}));
  const nlohmann::json params = {{"transfer_id", "5f0c2a9e1b3d4c77"}, {"num_tokens", 812}};
  const auto decode = nlohmann::json::parse(decode_body(*chat, params));
  EXPECT_EQ(decode["stream"], true);
  EXPECT_EQ(decode["stream_options"]["include_usage"], true);
  EXPECT_EQ(decode["kv_transfer_params"], params);
  EXPECT_FALSE(nlohmann::json::parse(decode_body(*chat, nlohmann::json())).contains("kv_transfer_params"));

  auto ids =
      parse_routed_request(RouteEndpoint::kCompletions, R"({"prompt":[1,2,3],"session_id":"s1"})", "h");
  ASSERT_TRUE(ids);
  EXPECT_EQ(ids->prompt_key.size(), 12u);  // 4 bytes an id: bytes / 4 = tokens
  EXPECT_EQ(ids->estimated_prompt_tokens(), 3);
  EXPECT_EQ(ids->session_id, "s1");  // the body wins over the header
  EXPECT_FALSE(parse_routed_request(RouteEndpoint::kCompletions, "{not json", ""));
  EXPECT_FALSE(parse_routed_request(RouteEndpoint::kCompletions, "[1,2]", ""));
}

TEST(RoutedRequestTest, ReadsAResponsesBodyAndItsAnswersId) {
  // Instructions and input key as chat's system and user messages would.
  auto r = parse_routed_request(RouteEndpoint::kResponses,
                                R"({"instructions":"be brief","input":"hi","previous_response_id":"resp_1",
                                    "stream":true,"max_output_tokens":1})",
                                "s");
  ASSERT_TRUE(r);
  auto chat = parse_routed_request(
      RouteEndpoint::kChat,
      R"({"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi"}]})", "");
  EXPECT_EQ(r->prompt_key, chat->prompt_key);
  EXPECT_EQ(r->previous_response_id, "resp_1");
  EXPECT_TRUE(r->stream);
  EXPECT_EQ(r->session_id, "s");
  EXPECT_EQ(r->disagg_blocker, "responses");  // never disaggregated, whatever its fields
  // Items: messages with parts, a call's arguments, its output.
  auto items = parse_routed_request(RouteEndpoint::kResponses, R"({"input":[
      {"role":"user","content":[{"type":"input_text","text":"weather?"}]},
      {"type":"function_call","call_id":"c","name":"w","arguments":"{}"},
      {"type":"function_call_output","call_id":"c","output":"sunny"}, 7]})",
                                    "");
  ASSERT_TRUE(items);
  EXPECT_EQ(items->prompt_key,
            "user\x1f"
            "weather?\x1e"
            "assistant\x1f{}\x1etool\x1fsunny\x1e");
  EXPECT_TRUE(items->previous_response_id.empty());

  // The answer's id: a response object, or a stream's response.created event.
  auto body = response_record(R"({"id":"resp_a","object":"response","store":false,"output":[]})");
  ASSERT_TRUE(body);
  EXPECT_EQ(body->id, "resp_a");
  EXPECT_FALSE(body->stored);
  auto events = response_record(
      "event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,"
      "\"response\":{\"id\":\"resp_b\",\"object\":\"response\"}}\n\nevent: response.in_progress\n");
  ASSERT_TRUE(events);
  EXPECT_EQ(events->id, "resp_b");
  EXPECT_TRUE(events->stored);  // store defaults to true
  EXPECT_FALSE(response_record(R"({"error":{"message":"bad"}})"));
  EXPECT_FALSE(response_record(R"({"id":"chatcmpl-1","object":"chat.completion"})"));
  EXPECT_FALSE(response_record("event: response.in_progress\ndata: {\"type\":\"response.in_progress\"}\n\n"));
  EXPECT_FALSE(response_record("event: response.created\ndata: {\"type\":"));  // cut short
  EXPECT_FALSE(response_record(std::string(5000, '[')));

  EXPECT_EQ(last_sequence_number("data: {\"sequence_number\":3}\n\ndata: {\"sequence_number\": 14}\n\n"), 14);
  EXPECT_FALSE(last_sequence_number("data: {\"x\":1}\n\n"));
  const std::string error = responses_error_event(15, "instance gone");
  ASSERT_EQ(error.rfind("event: error\ndata: ", 0), 0u);
  const auto e = nlohmann::json::parse(error.substr(error.find('{')));
  EXPECT_EQ(e, (nlohmann::json{{"type", "error"},
                               {"code", "server_error"},
                               {"message", "instance gone"},
                               {"param", nullptr},
                               {"sequence_number", 15}}));
  EXPECT_EQ(error.substr(error.size() - 2), "\n\n");
}

// ---- Instances file ---------------------------------------------------------------------------

TEST(InstancesFileTest, ParsesRolesUrlsAndComments) {
  const auto list = parse_instances_file(
      "# the fleet\n"
      "both http://127.0.0.1:8001\n"
      "\n"
      "   prefill   http://10.0.0.2:9000/   # trailing slash and comment\n"
      "decode http://decode-1:9100\r\n",
      "fleet.txt");
  ASSERT_TRUE(list) << list.status().message();
  ASSERT_EQ(list->size(), 3u);
  EXPECT_EQ((*list)[0].role, InstanceRole::kBoth);
  EXPECT_EQ((*list)[0].url, "http://127.0.0.1:8001");
  EXPECT_EQ((*list)[0].host, "127.0.0.1");
  EXPECT_EQ((*list)[0].port, "8001");
  EXPECT_EQ((*list)[1].role, InstanceRole::kPrefill);
  EXPECT_EQ((*list)[1].url, "http://10.0.0.2:9000");
  EXPECT_EQ((*list)[2].role, InstanceRole::kDecode);
  EXPECT_EQ((*list)[2].host, "decode-1");
  EXPECT_TRUE(parse_instances_file("", "empty.txt")->empty());
}

TEST(InstancesFileTest, RejectsBadLinesNamingTheLine) {
  auto message = [](const std::string& body) {
    const auto r = parse_instances_file(body, "fleet.txt");
    EXPECT_FALSE(r) << body;
    return r ? std::string() : r.status().message();
  };
  EXPECT_NE(message("both http://a:1\nworker http://b:2\n").find("fleet.txt line 2: unknown role 'worker'"),
            std::string::npos);
  EXPECT_NE(message("# c\n\ndecode\n").find("fleet.txt line 3"), std::string::npos);
  EXPECT_NE(message("both https://a:1\n").find("line 1"), std::string::npos);
  EXPECT_NE(message("both http://a\n").find("no port"), std::string::npos);
  EXPECT_NE(message("both http://a:99999\n").find("bad port"), std::string::npos);
  EXPECT_NE(message("both http://a:1/v1\n").find("path"), std::string::npos);
  EXPECT_NE(message("both http://a:1 extra\n").find("unexpected 'extra'"), std::string::npos);
  EXPECT_NE(message("both http://a:1\nboth http://a:1\n").find("line 2"), std::string::npos);
  EXPECT_FALSE(parse_instance_url(InstanceRole::kBoth, "http://:80", "--instance"));
}

// ---- SessionAffinity --------------------------------------------------------------------------

TEST(SessionAffinityTest, RemembersTheLastInstanceWithinAnLruBound) {
  SessionAffinity s(2);
  EXPECT_FALSE(s.lookup("a"));
  s.record("a", 1);
  s.record("b", 2);
  EXPECT_EQ(*s.lookup("a"), 1u);  // a is now the most recent
  s.record("c", 3);               // evicts b
  EXPECT_FALSE(s.lookup("b"));
  EXPECT_EQ(*s.lookup("a"), 1u);
  s.record("a", 4);  // a later turn elsewhere
  EXPECT_EQ(*s.lookup("a"), 4u);
  EXPECT_EQ(s.size(), 2u);
  s.forget_instance(4);
  EXPECT_FALSE(s.lookup("a"));
  EXPECT_EQ(*s.lookup("c"), 3u);
  s.erase("c");
  s.erase("never");
  EXPECT_FALSE(s.lookup("c"));
  EXPECT_EQ(s.size(), 0u);
}

// ---- InstancePool and RoutePlanner ------------------------------------------------------------

InstanceSpec spec(InstanceRole role, int port) {
  return *parse_instance_url(role, "http://127.0.0.1:" + std::to_string(port), "test");
}

void all_up(InstancePool& pool) {
  for (uint64_t id : pool.checked_ids()) (void)pool.record_check(id, true, "");
}

RoutedRequest completion(const std::string& prompt, const std::string& extra = "") {
  return *parse_routed_request(RouteEndpoint::kCompletions,
                               nlohmann::json{{"prompt", prompt}}.dump().insert(1, extra), "");
}

TEST(InstancePoolTest, EjectsAfterTwoFailedChecksOrAtOnceAndComesBack) {
  InstancePool pool;
  pool.add_fixed({spec(InstanceRole::kBoth, 1), spec(InstanceRole::kBoth, 2), spec(InstanceRole::kBoth, 1)});
  ASSERT_EQ(pool.instances().size(), 2u);               // the duplicate is ignored
  EXPECT_FALSE(pool.any_healthy(InstanceRole::kBoth));  // down until checked
  EXPECT_FALSE(pool.all_checked());
  EXPECT_EQ(pool.record_check(1, true, ""), HealthTransition::kCameUp);
  EXPECT_FALSE(pool.all_checked());  // instance 2 not asked yet
  EXPECT_EQ(pool.record_check(2, false, "refused"), HealthTransition::kNone);
  EXPECT_TRUE(pool.all_checked());  // a failed first check is an outcome too
  EXPECT_EQ(pool.record_check(1, false, "refused"), HealthTransition::kNone);
  EXPECT_EQ(pool.record_check(1, false, "refused"), HealthTransition::kWentDown);
  EXPECT_FALSE(pool.find(1)->up);
  EXPECT_EQ(pool.record_check(1, true, ""), HealthTransition::kCameUp);
  EXPECT_EQ(pool.eject(1, "reset"), HealthTransition::kWentDown);
  EXPECT_EQ(pool.find(1)->last_error, "reset");
  EXPECT_EQ(pool.record_check(1, true, ""), HealthTransition::kCameUp);
}

TEST(InstancePoolTest, FileInstancesRetireWhenRemovedAndLeaveAfterTheirLastRequest) {
  InstancePool pool;
  pool.add_fixed({spec(InstanceRole::kBoth, 1)});
  auto r = pool.set_file_instances({spec(InstanceRole::kBoth, 2), spec(InstanceRole::kDecode, 3)});
  EXPECT_EQ(r.added.size(), 2u);
  all_up(pool);
  EXPECT_EQ(pool.healthy(InstanceRole::kBoth).size(), 2u);
  const uint64_t two = r.added[0];
  pool.acquire(two);
  r = pool.set_file_instances({spec(InstanceRole::kDecode, 3)});
  EXPECT_EQ(r.retired, std::vector<uint64_t>{two});
  ASSERT_NE(pool.find(two), nullptr);                       // still finishing its request
  EXPECT_EQ(pool.healthy(InstanceRole::kBoth).size(), 1u);  // but gets no new one
  pool.release(two);
  EXPECT_EQ(pool.find(two), nullptr);
  // The flag-given instance is never retired by the file.
  r = pool.set_file_instances({});
  EXPECT_NE(pool.find(1), nullptr);
  EXPECT_EQ(pool.instances().size(), 1u);
}

TEST(RoutePlannerTest, RoundRobinSpreadsAndRetriesPickAnotherInstance) {
  InstancePool pool;
  pool.add_fixed({spec(InstanceRole::kBoth, 1), spec(InstanceRole::kBoth, 2)});
  all_up(pool);
  RoutePlanner planner(&pool, PlannerOptions{PolicyKind::kRoundRobin});
  const RoutedRequest r = completion("hello");
  EXPECT_EQ(planner.plan(r)->target_id, 1u);
  EXPECT_EQ(planner.plan(r)->target_id, 2u);
  EXPECT_EQ(planner.plan(r)->target_id, 1u);
  const auto retry = planner.pick(InstanceRole::kBoth, r, 1);
  ASSERT_TRUE(retry);
  EXPECT_EQ(retry->id, 2u);
  (void)pool.eject(2, "down");
  EXPECT_FALSE(planner.pick(InstanceRole::kBoth, r, 1));
  (void)pool.eject(1, "down");
  EXPECT_FALSE(planner.plan(r));  // nothing healthy
}

TEST(RoutePlannerTest, LeastLoadCountsScrapedLoadAndRequestsInFlight) {
  InstancePool pool;
  pool.add_fixed({spec(InstanceRole::kBoth, 1), spec(InstanceRole::kBoth, 2)});
  all_up(pool);
  RoutePlanner planner(&pool, PlannerOptions{PolicyKind::kLeastLoad});
  pool.find(1)->load.running = 3;
  pool.find(2)->load.waiting = 1;
  EXPECT_EQ(planner.plan(completion("x"))->target_id, 2u);
  pool.acquire(2);
  pool.acquire(2);
  pool.acquire(2);  // 1 + 3 in flight > 3
  EXPECT_EQ(planner.plan(completion("x"))->target_id, 1u);
}

TEST(RoutePlannerTest, CacheAwareSendsARepeatedPromptBackToItsInstance) {
  InstancePool pool;
  pool.add_fixed({spec(InstanceRole::kBoth, 1), spec(InstanceRole::kBoth, 2)});
  all_up(pool);
  RoutePlanner planner(&pool, PlannerOptions{});
  const RoutedRequest a = completion(text(2000, 'a'));
  const RoutedRequest b = completion(text(2000, 'b'));
  const uint64_t first = planner.plan(a)->target_id;
  const uint64_t other = planner.plan(b)->target_id;
  EXPECT_NE(first, other);  // the second prompt goes to the empty index
  for (int i = 0; i < 4; ++i) {
    const auto p = planner.plan(a);
    EXPECT_EQ(p->target_id, first);
    EXPECT_EQ(p->rule, "cache_hit");
    EXPECT_EQ(p->matched_bytes, 2000u);
  }
  EXPECT_EQ(planner.plan(b)->target_id, other);
}

TEST(RoutePlannerTest, SessionsStayOnTheirInstanceWhileItIsHealthy) {
  InstancePool pool;
  pool.add_fixed({spec(InstanceRole::kBoth, 1), spec(InstanceRole::kBoth, 2)});
  all_up(pool);
  RoutePlanner planner(&pool, PlannerOptions{PolicyKind::kRoundRobin});
  const RoutedRequest turn = completion("hi", R"("session_id":"s",)");
  const auto first = planner.plan(turn);
  planner.served(turn, first->target_id);
  for (int i = 0; i < 3; ++i) {
    const auto p = planner.plan(turn);
    EXPECT_EQ(p->target_id, first->target_id);
    EXPECT_EQ(p->rule, "session");
  }
  (void)pool.eject(first->target_id, "gone");
  EXPECT_NE(planner.plan(turn)->target_id, first->target_id);
}

TEST(RoutePlannerTest, ContinuationsGoToTheInstanceThatStoresTheirPreviousResponse) {
  InstancePool pool;
  pool.add_fixed(
      {spec(InstanceRole::kPrefill, 1), spec(InstanceRole::kBoth, 2), spec(InstanceRole::kBoth, 3)});
  all_up(pool);
  RoutePlanner planner(&pool, PlannerOptions{PolicyKind::kRoundRobin});
  const auto next = [](const char* previous) {
    return *parse_routed_request(
        RouteEndpoint::kResponses,
        nlohmann::json{{"input", std::string(4000, 'x')}, {"previous_response_id", previous}}.dump(), "");
  };
  EXPECT_FALSE(planner.response_owner("resp_a"));
  EXPECT_NE(planner.plan(next("resp_a"))->rule, "response");  // unknown: the policy chooses
  planner.stored("resp_a", 3);
  EXPECT_EQ(planner.response_owner("resp_a"), 3u);
  for (int i = 0; i < 3; ++i) {  // round-robin would alternate
    const auto p = planner.plan(next("resp_a"));
    EXPECT_EQ(p->target_id, 3u);
    EXPECT_EQ(p->rule, "response");
    EXPECT_FALSE(p->disaggregated);  // a long prompt, but a Responses request
    EXPECT_EQ(p->decision.reason, "responses");
  }
  // Down, the instance still gets it: no other can continue the response.
  (void)pool.eject(3, "gone");
  EXPECT_EQ(planner.plan(next("resp_a"))->target_id, 3u);
  planner.forget_response("resp_a");
  EXPECT_EQ(planner.plan(next("resp_a"))->target_id, 2u);
  // An instance that leaves the fleet takes its responses with it.
  planner.stored("resp_b", 2);
  planner.forget_instance(2);
  EXPECT_FALSE(planner.response_owner("resp_b"));
}

TEST(RoutePlannerTest, DisaggregatesLongPromptsAcrossPrefillAndDecode) {
  InstancePool pool;
  pool.add_fixed(
      {spec(InstanceRole::kPrefill, 1), spec(InstanceRole::kDecode, 2), spec(InstanceRole::kDecode, 3)});
  all_up(pool);
  RoutePlanner planner(&pool, PlannerOptions{PolicyKind::kCacheAware, {}, 256});
  const RoutedRequest long_prompt = completion(text(4000));  // ~1000 tokens
  auto p = planner.plan(long_prompt);
  ASSERT_TRUE(p);
  EXPECT_TRUE(p->disaggregated);
  EXPECT_EQ(p->prefill_id, 1u);
  EXPECT_EQ(p->target_role, InstanceRole::kDecode);
  // The same prompt again: the prefill instance holds it, nothing is left to transfer.
  p = planner.plan(long_prompt);
  EXPECT_FALSE(p->disaggregated);
  EXPECT_EQ(p->decision.reason, "short_prompt");
  EXPECT_EQ(p->target_role, InstanceRole::kDecode);  // no both instance: a decode one answers
  // A short prompt, or a blocking field, goes direct.
  EXPECT_EQ(planner.plan(completion("hi"))->decision.reason, "short_prompt");
  EXPECT_EQ(planner.plan(completion(text(4000, 'c'), R"("n":2,)"))->decision.reason, "n");
  // Without a healthy prefill instance: direct.
  (void)pool.eject(1, "down");
  p = planner.plan(completion(text(4000, 'd')));
  EXPECT_FALSE(p->disaggregated);
  EXPECT_EQ(p->decision.reason, "no_prefill");
}

// ---- Load metrics -----------------------------------------------------------------------------

TEST(LoadMetricsTest, ReadsVllmNamedGaugesUnderAnyPrefix) {
  const InstanceLoad l = parse_load_metrics(
      "# HELP inferd:num_requests_running Number of requests in model execution batches.\n"
      "# TYPE inferd:num_requests_running gauge\n"
      "inferd:num_requests_running{model_name=\"m\"} 3\n"
      "inferd:num_requests_waiting{model_name=\"we}ird\"} 2.5e0\r\n"
      "inferd:kv_cache_usage_perc{model_name=\"m\"} 0.25\n"
      "inferd:num_requests_running_total 100\n"  // not the gauge
      "garbage line\n"
      "inferd:prefix_cache_hits_total{model_name=\"m\"} 9\n");
  EXPECT_DOUBLE_EQ(l.running, 3);
  EXPECT_DOUBLE_EQ(l.waiting, 2.5);
  EXPECT_DOUBLE_EQ(l.kv_usage, 0.25);
  EXPECT_TRUE(l.found_running && l.found_waiting && l.found_kv_usage);
  const InstanceLoad v =
      parse_load_metrics("vllm:gpu_cache_usage_perc 0.5\nvllm:num_requests_running 1 1700000000\n");
  EXPECT_DOUBLE_EQ(v.kv_usage, 0.5);
  EXPECT_DOUBLE_EQ(v.running, 1);
  EXPECT_FALSE(v.found_waiting);
  EXPECT_FALSE(parse_load_metrics("").found_running);
}

TEST(RouterMetricsTest, RendersTheRouterSeries) {
  RouterMetrics m;
  const InstanceSpec s = spec(InstanceRole::kBoth, 8001);
  m.routed(s);
  m.routed(s);
  m.set_up(s, true);
  m.decision(false, "short_prompt");
  m.prefix(64, 100);
  const std::string text = m.render();
  EXPECT_NE(text.find("inferd_router:requests_total{instance=\"http://127.0.0.1:8001\",role=\"both\"} 2"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("inferd_router:instance_up{instance=\"http://127.0.0.1:8001\",role=\"both\"} 1"),
            std::string::npos);
  EXPECT_NE(text.find("inferd_router:prefix_matched_chars_total 64"), std::string::npos);
  EXPECT_NE(text.find("inferd_router:disagg_decisions_total{decision=\"direct\",reason=\"short_prompt\"} 1"),
            std::string::npos);
}

}  // namespace
}  // namespace inferd
