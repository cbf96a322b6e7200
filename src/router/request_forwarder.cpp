#include "router/request_forwarder.h"

// Asio's coroutine frames trip GCC 12's -Wmismatched-new-delete (see server/http_server.cpp).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif

#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <vector>

#include <boost/asio.hpp>
#include <boost/beast/http.hpp>

#include "common/log.h"

// GCC 12 destroys a temporary passed to a coroutine twice (GCC bug 99576): every argument of a
// coroutine call in this file is a named object.

namespace inferd {

namespace net = boost::asio;
namespace http = boost::beast::http;
using Clock = std::chrono::steady_clock;
using net::awaitable;
using json = nlohmann::json;

namespace {

double seconds(Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

// Where `pending` may be cut so that only whole SSE events go out: after its last blank line.
size_t event_boundary(const std::string& pending) {
  const size_t lf = pending.rfind("\n\n");
  const size_t crlf = pending.rfind("\r\n\r\n");
  size_t cut = 0;
  if (lf != std::string::npos) cut = lf + 2;
  if (crlf != std::string::npos) cut = std::max(cut, crlf + 4);
  return cut;
}

constexpr size_t kMaxBufferedBody = size_t{256} << 20;

// One attempt's watch of its client's socket.
struct HangupWatch {
  bool stop = false;
  UpstreamStream* upstream = nullptr;  // closed on a hang-up; null once the attempt ended
};

// Waits until the client's side of the socket reports end of stream while the router waits for
// an instance; then marks the client gone and closes the upstream connection.
awaitable<void> watch_hangup(std::shared_ptr<ClientConnection> conn, std::shared_ptr<HangupWatch> watch) {
  for (;;) {
    boost::system::error_code ec;
    co_await conn->socket.async_wait(net::ip::tcp::socket::wait_read,
                                     net::redirect_error(net::use_awaitable, ec));
    if (watch->stop || !conn->socket.is_open()) co_return;
    if (ec) {
      if (ec == net::error::operation_aborted) co_return;
    } else {
      char byte;
      const ssize_t got = ::recv(conn->socket.native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
      if (got > 0) co_return;  // a pipelined request, not a hang-up: stop watching
      if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) continue;
    }
    conn->client_gone = true;
    if (watch->upstream != nullptr) watch->upstream->close();
    co_return;
  }
}

// Ends the watch when the attempt's frame goes (its wait is cancelled; no other operation is
// pending on the client socket then).
struct StopWatching {
  ClientConnection* conn;
  HangupWatch* watch;
  ~StopWatching() {
    watch->stop = true;
    watch->upstream = nullptr;
    boost::system::error_code ec;
    if (conn->socket.is_open()) conn->socket.cancel(ec);
  }
};

}  // namespace

UpstreamRequest RequestForwarder::upstream_request(const ClientRequest& req, std::string body,
                                                   bool stream) const {
  UpstreamRequest up;
  up.method = "POST";
  up.target = std::string(req.target());
  up.body = std::move(body);
  if (auto it = req.find(http::field::authorization); it != req.end())
    up.authorization = std::string(it->value());
  if (auto it = req.find("X-Session-Id"); it != req.end()) up.session_header = std::string(it->value());
  up.accept_stream = stream;
  return up;
}

std::vector<uint64_t> RequestForwarder::answering_instances() const {
  std::vector<uint64_t> ids;
  for (InstanceRole role : {InstanceRole::kBoth, InstanceRole::kDecode}) {
    for (const InstanceState* s : state_->pool.healthy(role)) ids.push_back(s->id);
  }
  return ids;
}

awaitable<bool> RequestForwarder::handle(std::shared_ptr<ClientConnection> conn, const ClientRequest& req,
                                         RouteEndpoint endpoint) {
  RouterState& st = *state_;
  const double write_timeout = st.options.write_timeout_seconds;
  Leg leg;
  leg.mark = Clock::now();
  std::string session_header;
  if (auto it = req.find("X-Session-Id"); it != req.end()) session_header = std::string(it->value());
  std::optional<Expected<RoutedRequest>> parsing;
  if (parse_executor_) {
    // Posted, not co_spawn'ed: GCC 12 destroys a coroutine lambda's captures twice (bug 99576).
    // The body is copied: at shutdown this frame may go before the parse is done.
    struct ParseWait {
      explicit ParseWait(net::any_io_executor ex) : wake(ex) { wake.expires_at(Clock::time_point::max()); }
      std::optional<Expected<RoutedRequest>> result;  // I/O thread only
      net::steady_timer wake;
    };
    auto wait = std::make_shared<ParseWait>(co_await net::this_coro::executor);
    net::post(*parse_executor_, [wait, endpoint, body = req.body(), session_header] {
      Expected<RoutedRequest> r = parse_routed_request(endpoint, body, session_header);
      net::post(wait->wake.get_executor(), [wait, r = std::move(r)]() mutable {
        wait->result.emplace(std::move(r));
        wait->wake.cancel();
      });
    });
    while (!wait->result) {
      boost::system::error_code ec;
      co_await wait->wake.async_wait(net::redirect_error(net::use_awaitable, ec));
    }
    parsing = std::move(wait->result);
  } else {
    parsing = parse_routed_request(endpoint, req.body(), session_header);
  }
  Expected<RoutedRequest>& parsed = *parsing;
  if (!parsed) {
    st.metrics.error("bad_request");
    ClientResponse res = make_error(req, 400, parsed.status().message(), "invalid_request_error");
    co_return co_await send_response(*conn, res, write_timeout);
  }
  const RoutedRequest& request = *parsed;
  if (!request.previous_response_id.empty() && !st.planner.response_owner(request.previous_response_id)) {
    const std::string& previous = request.previous_response_id;
    (void)co_await locate_response(req, previous);
  }
  const std::optional<RoutePlan> plan = st.planner.plan(request);
  if (!plan) {
    st.metrics.error("no_instance");
    ClientResponse res =
        make_error(req, 503, "no healthy instance can serve the request (none of role both or decode is up)",
                   "service_unavailable");
    co_return co_await send_response(*conn, res, write_timeout);
  }
  st.metrics.decision(plan->disaggregated, plan->decision.reason);
  st.metrics.prefix(plan->matched_bytes, request.prompt_key.size());
  leg.target_id = plan->target_id;
  leg.role = plan->target_role;
  leg.pinned = plan->rule == "response";
  leg.body = req.body();
  if (plan->disaggregated) {
    const uint64_t prefill_id = plan->prefill_id;
    Prefilled pre = co_await prefill(req, request, prefill_id, leg);
    if (pre.outcome == PrefillOutcome::kClientError) {
      ClientResponse res =
          make_response(req, pre.reply.status, std::move(pre.reply.body), pre.reply.content_type);
      co_return co_await send_response(*conn, res, write_timeout);
    }
    if (pre.outcome == PrefillOutcome::kTransfer) {
      leg.body = decode_body(request, pre.kv_transfer_params);
      leg.with_transfer = true;
    }
  }
  co_return co_await answer(conn, req, request, leg);
}

// The prefill leg: the client's body with "stream": false and do_remote_decode; its reply's
// kv_transfer_params go to the decode leg. A failure (connection, timeout, 5xx) ejects the
// instance and the decode instance computes the prompt itself; a 4xx is the client's answer.
awaitable<RequestForwarder::Prefilled> RequestForwarder::prefill(const ClientRequest& req,
                                                                 const RoutedRequest& request,
                                                                 uint64_t prefill_id, Leg& leg) {
  RouterState& st = *state_;
  Prefilled out;
  const InstanceState* s = st.pool.find(prefill_id);
  if (s == nullptr) co_return out;
  const InstanceSpec spec = s->spec;
  const UpstreamRequest up = upstream_request(req, prefill_body(request), false);
  const double timeout = st.options.request_timeout_seconds;
  st.pool.acquire(prefill_id);
  st.metrics.routed(spec);
  const auto sent = Clock::now();
  FetchResult result = co_await fetch(spec, up, timeout);
  st.pool.release(prefill_id);
  st.metrics.prefill_round_trip(seconds(Clock::now() - sent));
  std::string error;
  if (auto* f = std::get_if<UpstreamFailure>(&result)) {
    st.metrics.error(failure_kind_name(f->kind));
    error = f->message;
  } else {
    UpstreamResponse& reply = std::get<UpstreamResponse>(result);
    leg.overhead_seconds += seconds(reply.written_at - leg.mark);
    if (reply.status >= 500) {
      st.metrics.error("upstream_5xx");
      error = "HTTP " + std::to_string(reply.status) + ": " + reply.body.substr(0, 300);
    } else if (reply.status >= 400) {
      out.outcome = PrefillOutcome::kClientError;
      out.reply = std::move(reply);
      co_return out;
    } else {
      const json j = json::parse(reply.body, nullptr, false);
      leg.mark = Clock::now();
      if (j.is_object()) {
        if (auto it = j.find("kv_transfer_params"); it != j.end() && it->is_object()) {
          out.outcome = PrefillOutcome::kTransfer;
          out.kv_transfer_params = *it;
          if (auto b = it->find("bytes"); b != it->end() && b->is_number())
            st.metrics.transfer_bytes(b->get<double>());
        }
        co_return out;  // no kv_transfer_params: the decode instance computes the prompt
      }
      st.metrics.error("prefill_bad_reply");
      log_warning("prefill reply is not a JSON object: the decode instance computes the prompt",
                  {{"instance", spec.url}});
      co_return out;
    }
  }
  st.eject(prefill_id, spec, error);
  log_warning("prefill failed: the decode instance computes the prompt",
              {{"instance", spec.url}, {"error", error}});
  leg.mark = Clock::now();
  co_return out;
}

// The answering leg, retried once on another instance of its kind when it fails before any
// byte reached the client; then a 502 naming the instances and their errors.
awaitable<bool> RequestForwarder::answer(std::shared_ptr<ClientConnection> conn, const ClientRequest& req,
                                         const RoutedRequest& request, Leg& leg) {
  RouterState& st = *state_;
  for (int tries = 0;; ++tries) {
    const uint64_t id = leg.target_id;
    const InstanceState* s = st.pool.find(id);
    Attempt a;
    InstanceSpec spec;
    if (s == nullptr) {  // left the fleet since it was chosen
      a.outcome = Outcome::kFailedBeforeBytes;
      a.failure = {UpstreamFailure::Kind::kConnect, "the instance left the fleet"};
    } else {
      spec = s->spec;
      st.pool.acquire(id);
      st.metrics.routed(spec);
      a = co_await attempt(conn, req, request, spec, leg);
      st.pool.release(id);
    }
    if (conn->client_gone && a.outcome != Outcome::kAnswered) a.outcome = Outcome::kClientGone;
    switch (a.outcome) {
      case Outcome::kAnswered:
        st.planner.served(request, id);
        if (a.response && a.response->stored) st.planner.stored(a.response->id, id);
        co_return a.keep;
      case Outcome::kClientGone: st.metrics.error("client_gone"); co_return false;
      case Outcome::kFailedMidStream:
        st.metrics.error("mid_stream");
        st.eject(id, spec, a.failure.message);
        co_return false;
      case Outcome::kFailedBeforeBytes: break;
    }
    st.metrics.error(failure_kind_name(a.failure.kind));
    if (s != nullptr) st.eject(id, spec, a.failure.message);
    if (!leg.failures.empty()) leg.failures += "; ";
    leg.failures += "instance " + spec.url + " failed: " + a.failure.message;
    const std::optional<InstancePick> next =
        tries == 0 && !leg.pinned ? st.planner.pick(leg.role, request, id) : std::nullopt;
    if (!next) {
      std::string message = leg.failures;
      if (leg.pinned) {
        message += "; it stores previous_response_id '" + request.previous_response_id +
                   "', which no other instance can continue";
      } else if (tries == 0) {
        message += std::string("; no other healthy ") + role_name(leg.role) + " instance";
      }
      ClientResponse res = make_error(req, 502, message, "server_error");
      co_return co_await send_response(*conn, res, st.options.write_timeout_seconds);
    }
    st.metrics.retried();
    log_warning("retrying on another instance", {{"failed", spec.url}, {"error", a.failure.message}});
    leg.target_id = next->id;
    if (leg.with_transfer) {  // the transfer may be spent: the next instance computes the prompt
      leg.body = req.body();
      leg.with_transfer = false;
    }
    leg.mark = Clock::now();
  }
}

// One try on one instance: a non-streamed answer (or an error status) is read whole, then sent;
// a 200 stream is passed through.
awaitable<RequestForwarder::Attempt> RequestForwarder::attempt(const std::shared_ptr<ClientConnection>& conn,
                                                               const ClientRequest& req,
                                                               const RoutedRequest& request,
                                                               const InstanceSpec& spec, Leg& leg) {
  RouterState& st = *state_;
  const double timeout = st.options.request_timeout_seconds;
  UpstreamStream upstream(co_await net::this_coro::executor);
  // While the instance works, a client hang-up closes the upstream connection (the instance
  // then aborts the request): the watch ends with this attempt.
  auto watch = std::make_shared<HangupWatch>();
  watch->upstream = &upstream;
  net::co_spawn(co_await net::this_coro::executor, watch_hangup(conn, watch), net::detached);
  const StopWatching stop_watching{conn.get(), watch.get()};
  ClientConnection& client = *conn;
  const UpstreamRequest up = upstream_request(req, leg.body, request.stream);
  if (std::optional<UpstreamFailure> f = co_await upstream.open(spec, up, timeout))
    co_return Attempt{Outcome::kFailedBeforeBytes, *f, false};
  leg.overhead_seconds += seconds(upstream.written_at() - leg.mark);
  st.metrics.overhead(leg.overhead_seconds);
  const unsigned status = upstream.status();
  if (request.stream && status == 200) co_return co_await pass_stream(client, req, request, spec, upstream);
  std::string body;
  while (!upstream.done()) {
    auto piece = co_await upstream.read_some(timeout);
    if (auto* f = std::get_if<UpstreamFailure>(&piece))
      co_return Attempt{Outcome::kFailedBeforeBytes, *f, false};
    body += std::get<std::string>(piece);
    if (body.size() > kMaxBufferedBody)
      co_return Attempt{
          Outcome::kFailedBeforeBytes, {UpstreamFailure::Kind::kBroken, "the answer is too large"}, false};
  }
  if (status >= 500) {
    co_return Attempt{
        Outcome::kFailedBeforeBytes,
        {UpstreamFailure::Kind::kServerError, "HTTP " + std::to_string(status) + ": " + body.substr(0, 300)},
        false};
  }
  std::optional<ResponseRecord> record;
  if (request.endpoint == RouteEndpoint::kResponses && status == 200) record = response_record(body);
  ClientResponse res = make_response(req, status, std::move(body), upstream.content_type());
  const bool keep = co_await send_response(client, res, st.options.write_timeout_seconds);
  co_return Attempt{
      client.client_gone ? Outcome::kClientGone : Outcome::kAnswered, {}, keep, std::move(record)};
}

// Passes the instance's events to the client as they arrive (whole events: a partial one waits
// for its end). The head goes out with the first event, so a failure before it is retried.
awaitable<RequestForwarder::Attempt> RequestForwarder::pass_stream(ClientConnection& conn,
                                                                   const ClientRequest& req,
                                                                   const RoutedRequest& request,
                                                                   const InstanceSpec& spec,
                                                                   UpstreamStream& upstream) {
  const RouterState& st = *state_;
  const double timeout = st.options.request_timeout_seconds;
  const double write_timeout = st.options.write_timeout_seconds;
  const std::string content_type = upstream.content_type();
  const unsigned status = upstream.status();
  const bool responses = request.endpoint == RouteEndpoint::kResponses;
  std::optional<ResponseRecord> record;
  int64_t next_sequence = 0;  // a Responses stream's next event number
  std::string pending;
  bool head_sent = false;
  for (;;) {
    auto piece = co_await upstream.read_some(timeout);
    if (auto* f = std::get_if<UpstreamFailure>(&piece)) {
      if (conn.client_gone) co_return Attempt{Outcome::kClientGone, *f, false};
      if (!head_sent) co_return Attempt{Outcome::kFailedBeforeBytes, *f, false};
      upstream.close();
      const std::string message = "instance " + spec.url + " failed mid-stream: " + f->message;
      const std::string tail = responses ? responses_error_event(next_sequence, message)
                                         : error_event(502, message, "server_error") + "data: [DONE]\n\n";
      log_warning("instance failed mid-stream", {{"instance", spec.url}, {"error", f->message}});
      if (co_await send_stream_bytes(conn, tail, write_timeout))
        (void)co_await finish_stream(conn, write_timeout);
      co_return Attempt{Outcome::kFailedMidStream, *f, false};
    }
    std::string& bytes = std::get<std::string>(piece);
    const bool end = bytes.empty();
    pending += bytes;
    const size_t cut = end ? pending.size() : event_boundary(pending);
    if ((cut > 0 || end) && !head_sent) {
      const bool ok = co_await start_stream(conn, req, status, content_type, write_timeout);
      if (!ok) {
        upstream.close();
        co_return Attempt{Outcome::kClientGone, {}, false};
      }
      head_sent = true;
    }
    if (cut > 0) {
      const std::string out = pending.substr(0, cut);
      pending.erase(0, cut);
      if (responses) {
        if (!record) record = response_record(out);
        if (const std::optional<int64_t> last = last_sequence_number(out)) next_sequence = *last + 1;
      }
      const bool ok = co_await send_stream_bytes(conn, out, write_timeout);
      if (!ok) {
        upstream.close();  // the instance sees the hang-up and aborts the request
        co_return Attempt{Outcome::kClientGone, {}, false};
      }
    }
    if (end) {
      const bool keep = co_await finish_stream(conn, write_timeout);
      co_return Attempt{Outcome::kAnswered, {}, keep && req.keep_alive(), std::move(record)};
    }
  }
}

awaitable<std::optional<uint64_t>> RequestForwarder::locate_response(const ClientRequest& req,
                                                                     const std::string& id) {
  RouterState& st = *state_;
  // The id goes into a request line: only ids made of URL-safe characters are looked up (the
  // server's are "resp_" and hex digits); any other one no instance stores.
  const bool safe = !id.empty() && id.size() <= 256 && std::all_of(id.begin(), id.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
  });
  if (!safe) co_return std::nullopt;
  UpstreamRequest up = upstream_request(req, "", false);
  up.method = "GET";
  up.target = "/v1/responses/" + id;
  const double timeout = std::min(st.options.request_timeout_seconds, 30.0);
  for (uint64_t candidate : answering_instances()) {
    const InstanceState* s = st.pool.find(candidate);
    if (s == nullptr || !s->serving()) continue;
    const InstanceSpec spec = s->spec;
    FetchResult result = co_await fetch(spec, up, timeout);
    const auto* reply = std::get_if<UpstreamResponse>(&result);
    if (reply == nullptr || reply->status != 200) continue;
    st.planner.stored(id, candidate);
    st.metrics.response_located();
    co_return candidate;
  }
  co_return std::nullopt;
}

awaitable<bool> RequestForwarder::stored_response(ClientConnection& conn, const ClientRequest& req,
                                                  const std::string& target) {
  RouterState& st = *state_;
  const double write_timeout = st.options.write_timeout_seconds;
  std::string id = target.substr(std::string("/v1/responses/").size());
  id.resize(std::min(id.find('/'), id.size()));
  const http::verb verb = req.method();
  UpstreamRequest up = upstream_request(req, req.body(), false);
  up.method = verb == http::verb::get ? "GET" : verb == http::verb::delete_ ? "DELETE" : "POST";
  // The instance that stores it, else every healthy one until one does not answer 404.
  const std::optional<uint64_t> owner = st.planner.response_owner(id);
  const std::vector<uint64_t> ids = owner ? std::vector<uint64_t>{*owner} : answering_instances();
  std::optional<UpstreamResponse> not_found;
  std::string failures;
  for (uint64_t candidate : ids) {
    const InstanceState* s = st.pool.find(candidate);
    if (s == nullptr) continue;
    const InstanceSpec spec = s->spec;
    st.pool.acquire(candidate);
    FetchResult result = co_await fetch(spec, up, st.options.request_timeout_seconds);
    st.pool.release(candidate);
    if (auto* f = std::get_if<UpstreamFailure>(&result)) {
      st.metrics.error(failure_kind_name(f->kind));
      if (!failures.empty()) failures += "; ";
      failures += "instance " + spec.url + " failed: " + f->message;
      continue;
    }
    UpstreamResponse& reply = std::get<UpstreamResponse>(result);
    if (reply.status == 404 && !owner) {
      not_found = std::move(reply);
      continue;
    }
    if (reply.status == 200 && verb == http::verb::delete_) {
      st.planner.forget_response(id);
    } else if (reply.status == 200 && !owner) {
      st.planner.stored(id, candidate);
      st.metrics.response_located();
    }
    ClientResponse res = make_response(req, reply.status, std::move(reply.body), reply.content_type);
    co_return co_await send_response(conn, res, write_timeout);
  }
  if (not_found && failures.empty()) {
    ClientResponse res =
        make_response(req, not_found->status, std::move(not_found->body), not_found->content_type);
    co_return co_await send_response(conn, res, write_timeout);
  }
  if (ids.empty()) {
    st.metrics.error("no_instance");
    ClientResponse res = make_error(req, 503, "no healthy instance", "service_unavailable");
    co_return co_await send_response(conn, res, write_timeout);
  }
  // The instance that stores it failed; or it was not found where the instances answered and
  // some did not: it may be on one that failed.
  const std::string where = owner ? "; it stores response '" + id + "'"
                                  : "; response '" + id + "' was not found on any other instance";
  ClientResponse res = make_error(req, 502, failures + where, "server_error");
  co_return co_await send_response(conn, res, write_timeout);
}

}  // namespace inferd
