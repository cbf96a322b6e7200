// libFuzzer target: what the router reads from its clients and instances: request bodies of the
// three generate endpoints (and the prefill / decode bodies made from them), a Responses answer's
// id from a body or a stream's first events, event sequence numbers, an instance's /metrics text,
// instance URLs and the instances file.
#include <cstdint>
#include <string>

#include "router/instance_spec.h"
#include "router/load_metrics.h"
#include "router/routed_request.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  for (inferd::RouteEndpoint endpoint : {inferd::RouteEndpoint::kCompletions, inferd::RouteEndpoint::kChat,
                                         inferd::RouteEndpoint::kResponses}) {
    auto r = inferd::parse_routed_request(endpoint, text, "session");
    if (r) {
      (void)r->estimated_prompt_tokens();
      (void)inferd::prefill_body(*r);
      (void)inferd::decode_body(*r, nlohmann::json{{"transfer_id", "x"}});
    }
  }
  (void)inferd::response_record(text);
  (void)inferd::last_sequence_number(text);
  (void)inferd::responses_error_event(static_cast<int64_t>(size), text);
  (void)inferd::parse_load_metrics(text);
  (void)inferd::parse_instance_url(inferd::InstanceRole::kBoth, text, "fuzz");
  (void)inferd::parse_instances_file(text, "fuzz.txt");
  return 0;
}
