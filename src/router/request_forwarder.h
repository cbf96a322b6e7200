// RequestForwarder: one completions / chat request through the fleet, as the RoutePlanner
// planned it: the prefill leg when disaggregated (its kv_transfer_params handed to the decode
// leg; a failed prefill ejects the instance and the decode instance recomputes), then the
// answering leg, retried once on another instance of its kind when it fails before the client
// got a byte; streams passed through event by event as they arrive, and a stream that breaks
// after that ended with an error event and [DONE] (a Responses stream: an `error` event).
// /v1/responses continuations (previous_response_id) go to the instance that stores their
// predecessor, and so do GET / DELETE /v1/responses/{id}: the router remembers which instance
// answered each stored response, and asks the instances when it does not know (after a restart,
// or past its memory). I/O thread only (bodies are parsed on the parse executor, if set).
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <utility>  // before Asio's awaitable.hpp, which uses std::exchange
#include <vector>

#include <boost/asio/awaitable.hpp>
#include <boost/asio/thread_pool.hpp>
#include <nlohmann/json.hpp>

#include "router/client_connection.h"
#include "router/routed_request.h"
#include "router/router_state.h"
#include "router/upstream_client.h"

namespace inferd {

class RequestForwarder final {
 public:
  // state: not owned, outlives the forwarder.
  explicit RequestForwarder(RouterState* state) : state_(state) {}

  // Where request bodies are parsed (megabytes of JSON took the I/O thread 0.1-0.2 s, every other
  // request waiting meanwhile); without one, on the I/O thread. Not owned; it must stop before
  // the I/O context goes.
  void set_parse_executor(boost::asio::thread_pool::executor_type executor) { parse_executor_ = executor; }

  // Answers one request on `conn`; returns whether the connection may be kept.
  boost::asio::awaitable<bool> handle(std::shared_ptr<ClientConnection> conn, const ClientRequest& req,
                                      RouteEndpoint endpoint);
  // GET / DELETE /v1/responses/{id}, GET .../input_items, POST .../cancel: to the instance that
  // stores the response, else the first instance that does not answer 404; returns whether the
  // connection may be kept.
  boost::asio::awaitable<bool> stored_response(ClientConnection& conn, const ClientRequest& req,
                                               const std::string& target);

 private:
  // The answering leg: where it goes and with which body.
  struct Leg {
    uint64_t target_id = 0;
    InstanceRole role = InstanceRole::kBoth;
    std::string body;
    bool with_transfer = false;  // body carries a prefill's kv_transfer_params
    bool pinned = false;         // the one instance that stores the previous response: no retry
    std::string failures;        // "instance A: error; instance B: error" for the 502
    // The router's own time (overhead): accumulated up to each upstream write since `mark`.
    std::chrono::steady_clock::time_point mark;
    double overhead_seconds = 0;
  };
  enum class Outcome { kAnswered, kFailedBeforeBytes, kFailedMidStream, kClientGone };
  struct Attempt {
    Outcome outcome = Outcome::kAnswered;
    UpstreamFailure failure;
    bool keep = false;                       // the client connection may be kept
    std::optional<ResponseRecord> response;  // a /v1/responses answer's id
  };
  enum class PrefillOutcome { kTransfer, kRecompute, kClientError };
  struct Prefilled {
    PrefillOutcome outcome = PrefillOutcome::kRecompute;
    nlohmann::json kv_transfer_params;  // kTransfer
    UpstreamResponse reply;             // kClientError: the prefill instance's 4xx, for the client
  };

  boost::asio::awaitable<Prefilled> prefill(const ClientRequest& req, const RoutedRequest& request,
                                            uint64_t prefill_id, Leg& leg);
  boost::asio::awaitable<bool> answer(std::shared_ptr<ClientConnection> conn, const ClientRequest& req,
                                      const RoutedRequest& request, Leg& leg);
  boost::asio::awaitable<Attempt> attempt(const std::shared_ptr<ClientConnection>& conn,
                                          const ClientRequest& req, const RoutedRequest& request,
                                          const InstanceSpec& spec, Leg& leg);
  boost::asio::awaitable<Attempt> pass_stream(ClientConnection& conn, const ClientRequest& req,
                                              const RoutedRequest& request, const InstanceSpec& spec,
                                              UpstreamStream& upstream);
  // Asks the healthy instances (GET /v1/responses/{id}) which one stores a response the router
  // does not know of, and remembers it; none when no instance has it.
  boost::asio::awaitable<std::optional<uint64_t>> locate_response(const ClientRequest& req,
                                                                  const std::string& id);
  UpstreamRequest upstream_request(const ClientRequest& req, std::string body, bool stream) const;
  // The healthy instances that answer requests (both, then decode), in id order.
  std::vector<uint64_t> answering_instances() const;

  RouterState* state_;
  std::optional<boost::asio::thread_pool::executor_type> parse_executor_;
};

}  // namespace inferd
