#include "router/router_server.h"

// Asio's coroutine frames trip GCC 12's -Wmismatched-new-delete (see server/http_server.cpp).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif

#include <csignal>
#include <tuple>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <nlohmann/json.hpp>

#include "common/log.h"
#include "router/client_connection.h"
#include "router/health_monitor.h"
#include "router/request_forwarder.h"
#include "router/router_state.h"
#include "router/upstream_client.h"

// GCC 12 destroys a temporary passed to a coroutine twice (GCC bug 99576): every argument of a
// coroutine call in this file is a named object.

namespace inferd {

namespace net = boost::asio;
namespace http = boost::beast::http;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;
using json = nlohmann::json;
using net::awaitable;
using net::use_awaitable;

Status RouterOptions::validate() const {
  if (instances.empty() && instances_file.empty())
    return invalid_argument("no instance: give --instance, --prefill, --decode or --instances-file");
  if (!(health_interval_seconds > 0)) return invalid_argument("--health-interval must be positive");
  if (!(request_timeout_seconds > 0)) return invalid_argument("--request-timeout must be positive");
  if (planner.disagg_min_tokens < 0) return invalid_argument("--disagg-min-tokens must be 0 or more");
  if (prefix_index_chunks == 0) return invalid_argument("the prefix index needs room for a chunk");
  return Status::ok();
}

struct RouterServer::Impl {
  explicit Impl(RouterOptions o)
      : state(std::move(o)),
        forwarder(&state),
        monitor(&state),
        io(1),
        acceptor(io),
        signals(io, SIGTERM, SIGINT) {
    forwarder.set_parse_executor(parse_workers.get_executor());
  }

  RouterState state;
  RequestForwarder forwarder;
  HealthMonitor monitor;
  net::io_context io;
  tcp::acceptor acceptor;
  net::signal_set signals;
  // Parses request bodies (RequestForwarder::set_parse_executor); after `io`, so that it stops
  // and joins before `io` goes.
  net::thread_pool parse_workers{1};
  // I/O thread only from here on.
  bool draining = false;
  int64_t in_flight = 0;
  bool first_round_done = false;  // every instance listed at start has had one health check

  const RouterOptions& options() const { return state.options; }

  awaitable<void> accept_loop() {
    for (;;) {
      boost::system::error_code ec;
      tcp::socket socket = co_await acceptor.async_accept(net::redirect_error(use_awaitable, ec));
      if (ec) {
        if (!acceptor.is_open()) co_return;
        continue;
      }
      if (draining) continue;
      auto conn = std::make_shared<ClientConnection>(std::move(socket));
      net::co_spawn(io, watch_deadline(conn), net::detached);
      net::co_spawn(io, session(conn), net::detached);
    }
  }

  awaitable<void> session(std::shared_ptr<ClientConnection> conn) {
    boost::beast::flat_buffer buffer;
    const double write_timeout = options().write_timeout_seconds;
    for (;;) {
      boost::system::error_code ec;
      if (buffer.size() == 0) {  // wait (idle) for the first byte of the next request
        conn->expire_after(options().idle_timeout_seconds);
        co_await conn->socket.async_wait(tcp::socket::wait_read, net::redirect_error(use_awaitable, ec));
        if (ec || draining) break;
      }
      conn->expire_after(options().header_timeout_seconds);
      http::request_parser<http::string_body> parser;
      parser.header_limit(static_cast<std::uint32_t>(options().max_header_bytes));
      parser.body_limit(static_cast<std::uint64_t>(options().max_body_bytes));
      co_await http::async_read(conn->socket, buffer, parser, net::redirect_error(use_awaitable, ec));
      conn->never_expire();
      if (ec == http::error::end_of_stream || !conn->socket.is_open()) break;
      if (ec) {
        ClientRequest dummy;
        dummy.version(11);
        dummy.keep_alive(false);
        int status = 400;
        std::string message = "malformed HTTP request: " + ec.message();
        if (ec == http::error::body_limit) {
          status = 413;
          message = "the request body exceeds " + std::to_string(options().max_body_bytes) + " bytes";
        } else if (ec == http::error::header_limit) {
          status = 431;
          message = "the request headers exceed " + std::to_string(options().max_header_bytes) + " bytes";
        }
        ClientResponse res = make_error(dummy, status, message, "invalid_request_error");
        res.keep_alive(false);
        co_await send_response(*conn, res, write_timeout);
        break;
      }
      ClientRequest req = parser.release();
      ++in_flight;
      const bool keep = co_await route(conn, req);
      --in_flight;
      if (!keep || !req.keep_alive() || draining || !conn->socket.is_open()) break;
    }
    boost::system::error_code ignored;
    conn->socket.shutdown(tcp::socket::shutdown_both, ignored);
    conn->socket.close(ignored);
    conn->deadline.cancel();
  }

  bool authorized(const ClientRequest& req) const {
    if (options().api_key.empty()) return true;
    auto it = req.find(http::field::authorization);
    return it != req.end() && it->value() == "Bearer " + options().api_key;
  }

  // Returns whether the connection may be kept.
  awaitable<bool> route(std::shared_ptr<ClientConnection> conn, const ClientRequest& req) {
    const double write_timeout = options().write_timeout_seconds;
    std::string target(req.target());
    if (auto q = target.find('?'); q != std::string::npos) target.resize(q);
    const bool get = req.method() == http::verb::get;
    const bool post = req.method() == http::verb::post;
    const bool stored = target.rfind("/v1/responses/", 0) == 0;  // its verbs are the instance's to check
    const bool known = target == "/health" || target == "/metrics" || target == "/v1/models" ||
                       target == "/v1/completions" || target == "/v1/chat/completions" ||
                       target == "/v1/responses" || stored || pooling_path(target);
    const bool open_endpoint = target == "/health" || target == "/metrics";
    if (known && !open_endpoint && !authorized(req)) {
      state.metrics.error("unauthorized");
      ClientResponse res = make_error(req, 401, "a valid API key is required (Authorization: Bearer ...)",
                                      "authentication_error");
      res.set(http::field::www_authenticate, "Bearer");
      co_return co_await send_response(*conn, res, write_timeout);
    }
    if (!known) {
      ClientResponse res = make_error(req, 404, "no such endpoint: " + target, "invalid_request_error");
      co_return co_await send_response(*conn, res, write_timeout);
    }
    if (stored) co_return co_await forwarder.stored_response(*conn, req, target);
    const bool generate = target == "/v1/completions" || target == "/v1/chat/completions" ||
                          target == "/v1/responses" || pooling_path(target);
    if (generate ? !post : !get) {
      ClientResponse res = make_error(req, 405, "method not allowed for " + target, "invalid_request_error");
      co_return co_await send_response(*conn, res, write_timeout);
    }
    if (target == "/health") {
      ClientResponse res = health(req);
      co_return co_await send_response(*conn, res, write_timeout);
    }
    if (target == "/metrics") {
      state.refresh_gauges();
      ClientResponse res =
          make_response(req, 200, state.metrics.render(), "text/plain; version=0.0.4; charset=utf-8");
      co_return co_await send_response(*conn, res, write_timeout);
    }
    if (target == "/v1/models") co_return co_await models(*conn, req);
    if (pooling_path(target)) co_return co_await embeddings(*conn, req, target);
    const RouteEndpoint endpoint = target == "/v1/chat/completions" ? RouteEndpoint::kChat
                                   : target == "/v1/responses"      ? RouteEndpoint::kResponses
                                                                    : RouteEndpoint::kCompletions;
    co_return co_await forwarder.handle(conn, req, endpoint);
  }

  // 200 once every instance listed at start has had its first check and while one that can
  // answer (both, or decode) is up; the instances either way. Before that first round a request
  // could go direct only because its prefill instance was not asked yet. The gate is passed
  // once: an instance added later to the file does not turn a running router unready.
  ClientResponse health(const ClientRequest& req) {
    json instances = json::array();
    for (const auto& [id, s] : state.pool.instances()) {
      if (s.retired) continue;
      instances.push_back({{"url", s.spec.url},
                           {"role", role_name(s.spec.role)},
                           {"up", s.up},
                           {"checked", s.checked},
                           {"in_flight", s.in_flight},
                           {"error", s.up ? "" : s.last_error}});
    }
    if (!first_round_done) first_round_done = state.pool.all_checked();
    if (!first_round_done) {
      json body = json::parse(error_body(503, "starting: not every instance has had its first health check",
                                         "service_unavailable"));
      body["instances"] = instances;
      return make_response(req, 503, body.dump(-1, ' ', false, json::error_handler_t::replace));
    }
    const bool ok =
        state.pool.any_healthy(InstanceRole::kBoth) || state.pool.any_healthy(InstanceRole::kDecode);
    if (!ok) {
      json body = json::parse(
          error_body(503, "no instance of role both or decode is healthy", "service_unavailable"));
      body["instances"] = instances;
      return make_response(req, 503, body.dump(-1, ' ', false, json::error_handler_t::replace));
    }
    const json body = {{"status", "ok"}, {"instances", instances}};
    return make_response(req, 200, body.dump(-1, ' ', false, json::error_handler_t::replace));
  }

  // GET /v1/models of a healthy instance (both or decode first), passed through.
  awaitable<bool> models(ClientConnection& conn, const ClientRequest& req) {
    const double write_timeout = options().write_timeout_seconds;
    std::vector<InstanceState*> candidates = state.pool.healthy(InstanceRole::kBoth);
    for (InstanceRole role : {InstanceRole::kDecode, InstanceRole::kPrefill}) {
      for (InstanceState* s : state.pool.healthy(role)) candidates.push_back(s);
    }
    if (candidates.empty()) {
      state.metrics.error("no_instance");
      ClientResponse res = make_error(req, 503, "no healthy instance", "service_unavailable");
      co_return co_await send_response(conn, res, write_timeout);
    }
    const InstanceSpec spec = candidates.front()->spec;
    UpstreamRequest up;
    up.method = "GET";
    up.target = std::string(req.target());
    if (auto it = req.find(http::field::authorization); it != req.end())
      up.authorization = std::string(it->value());
    const double timeout = std::min(options().request_timeout_seconds, 30.0);
    FetchResult result = co_await fetch(spec, up, timeout);
    if (auto* f = std::get_if<UpstreamFailure>(&result)) {
      state.metrics.error(failure_kind_name(f->kind));
      ClientResponse res =
          make_error(req, 502, "instance " + spec.url + " failed: " + f->message, "server_error");
      co_return co_await send_response(conn, res, write_timeout);
    }
    UpstreamResponse& r = std::get<UpstreamResponse>(result);
    ClientResponse res = make_response(req, r.status, std::move(r.body), r.content_type);
    co_return co_await send_response(conn, res, write_timeout);
  }

  // The endpoints answered from pooled hidden states: /v1/embeddings, /score, /rerank, /classify
  // (vLLM's paths).
  static bool pooling_path(const std::string& target) {
    return target == "/v1/embeddings" || target == "/score" || target == "/v1/score" || target == "/rerank" ||
           target == "/v1/rerank" || target == "/v2/rerank" || target == "/classify" ||
           target == "/v1/classify";
  }

  // POST of an embedding, score or rerank: to the least loaded healthy instance that computes
  // prompts (both, then decode), passed through. It has no prefix worth routing by and no stream;
  // an instance that fails before answering is ejected and the next one is tried (embedding is
  // idempotent), so only the last failure reaches the client.
  awaitable<bool> embeddings(ClientConnection& conn, const ClientRequest& req, const std::string& target) {
    const double write_timeout = options().write_timeout_seconds;
    std::vector<std::tuple<int, double, uint64_t>> order;  // (role: both first, load, id), least loaded first
    for (InstanceRole role : {InstanceRole::kBoth, InstanceRole::kDecode}) {
      for (const InstanceState* s : state.pool.healthy(role))
        order.emplace_back(role == InstanceRole::kBoth ? 0 : 1, s->load_score(), s->id);
    }
    std::sort(order.begin(), order.end());
    UpstreamRequest up;
    up.target = target;
    up.body = req.body();
    if (auto it = req.find(http::field::authorization); it != req.end())
      up.authorization = std::string(it->value());
    std::string failure = "no healthy instance";
    for (const auto& [role, load, id] : order) {
      const InstanceState* s = state.pool.find(id);
      if (s == nullptr || !s->up) continue;
      const InstanceSpec spec = s->spec;
      state.pool.acquire(id);
      FetchResult result = co_await fetch(spec, up, options().request_timeout_seconds);
      state.pool.release(id);
      if (auto* f = std::get_if<UpstreamFailure>(&result)) {
        state.metrics.error(failure_kind_name(f->kind));
        state.eject(id, spec, f->message);
        failure = "instance " + spec.url + " failed: " + f->message;
        continue;
      }
      UpstreamResponse& r = std::get<UpstreamResponse>(result);
      ClientResponse res = make_response(req, r.status, std::move(r.body), r.content_type);
      co_return co_await send_response(conn, res, write_timeout);
    }
    state.metrics.error("no_instance");
    ClientResponse res = make_error(req, order.empty() ? 503 : 502, failure,
                                    order.empty() ? "service_unavailable" : "server_error");
    co_return co_await send_response(conn, res, write_timeout);
  }

  awaitable<void> on_signal() {
    boost::system::error_code ec;
    co_await signals.async_wait(net::redirect_error(use_awaitable, ec));
    if (ec) co_return;
    log_info("router shutting down: draining requests",
             {{"requests", in_flight}, {"grace_s", options().shutdown_grace_seconds}});
    draining = true;
    acceptor.close(ec);
    net::steady_timer timer(io);
    const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                             std::chrono::duration<double>(options().shutdown_grace_seconds));
    while (in_flight > 0 && Clock::now() < deadline) {
      timer.expires_after(std::chrono::milliseconds(50));
      co_await timer.async_wait(net::redirect_error(use_awaitable, ec));
    }
    io.stop();
  }
};

RouterServer::RouterServer(RouterOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {}
RouterServer::~RouterServer() = default;

Status RouterServer::listen() {
  RouterState& st = impl_->state;
  st.pool.add_fixed(st.options.instances);
  INFERD_RETURN_IF_ERROR(impl_->monitor.reload_instances_file());
  for (const auto& [id, s] : st.pool.instances()) st.metrics.set_up(s.spec, false);
  boost::system::error_code ec;
  const auto address = net::ip::make_address(st.options.host, ec);
  if (ec) return invalid_argument("--host " + st.options.host + ": not an IP address");
  const tcp::endpoint endpoint(address, st.options.port);
  auto& acceptor = impl_->acceptor;
  acceptor.open(endpoint.protocol(), ec);
  if (!ec) acceptor.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) acceptor.bind(endpoint, ec);
  if (!ec) acceptor.listen(net::socket_base::max_listen_connections, ec);
  if (ec)
    return invalid_argument("cannot listen on " + st.options.host + ":" + std::to_string(st.options.port) +
                            ": " + ec.message());
  return Status::ok();
}

uint16_t RouterServer::port() const {
  return impl_->acceptor.local_endpoint().port();
}

int RouterServer::run() {
  std::signal(SIGPIPE, SIG_IGN);
  net::co_spawn(impl_->io, impl_->accept_loop(), net::detached);
  net::co_spawn(impl_->io, impl_->monitor.run(impl_->draining), net::detached);
  net::co_spawn(impl_->io, impl_->on_signal(), net::detached);
  impl_->io.run();
  return 0;
}

}  // namespace inferd
