#include "router/upstream_client.h"

// Asio's coroutine frames trip GCC 12's -Wmismatched-new-delete (see server/http_server.cpp).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <limits>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

namespace inferd {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using net::awaitable;
using net::use_awaitable;

namespace {

std::chrono::steady_clock::duration duration_of(double seconds) {
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(seconds));
}

std::string format_seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", s);
  return buf;
}

UpstreamFailure failure(const boost::system::error_code& ec, const char* what, double timeout) {
  if (ec == beast::error::timeout)
    return {UpstreamFailure::Kind::kTimeout,
            std::string(what) + " timed out after " + format_seconds(timeout) + " s"};
  const bool connect = std::string_view(what) == "connect" || std::string_view(what) == "resolve";
  return {connect ? UpstreamFailure::Kind::kConnect : UpstreamFailure::Kind::kBroken,
          std::string(what) + ": " + ec.message()};
}

http::request<http::string_body> make_request(const InstanceSpec& instance, const UpstreamRequest& r) {
  const http::verb verb = r.method == "GET"      ? http::verb::get
                          : r.method == "DELETE" ? http::verb::delete_
                                                 : http::verb::post;
  http::request<http::string_body> req{verb, r.target, 11};
  req.set(http::field::host, instance.host + ":" + instance.port);
  req.set(http::field::user_agent, "inferd-router");
  if (!r.authorization.empty()) req.set(http::field::authorization, r.authorization);
  if (!r.session_header.empty()) req.set("X-Session-Id", r.session_header);
  if (r.accept_stream) req.set(http::field::accept, "text/event-stream");
  if (verb == http::verb::post) {
    req.set(http::field::content_type, "application/json");
    req.body() = r.body;
  }
  req.keep_alive(false);
  req.prepare_payload();
  return req;
}

// Resolves and connects `stream` within the timeout (connecting gets at most 10 s of it).
awaitable<std::optional<UpstreamFailure>> connect(beast::tcp_stream& stream, const InstanceSpec& instance,
                                                  double timeout) {
  tcp::resolver resolver(stream.get_executor());
  boost::system::error_code ec;
  const double connect_timeout = std::min(timeout, 10.0);
  auto endpoints =
      co_await resolver.async_resolve(instance.host, instance.port, net::redirect_error(use_awaitable, ec));
  if (ec) co_return failure(ec, "resolve", connect_timeout);
  stream.expires_after(duration_of(connect_timeout));
  co_await stream.async_connect(endpoints, net::redirect_error(use_awaitable, ec));
  if (ec) co_return failure(ec, "connect", connect_timeout);
  co_return std::nullopt;
}

}  // namespace

const char* failure_kind_name(UpstreamFailure::Kind kind) {
  switch (kind) {
    case UpstreamFailure::Kind::kConnect: return "connect";
    case UpstreamFailure::Kind::kTimeout: return "timeout";
    case UpstreamFailure::Kind::kBroken: return "broken";
    case UpstreamFailure::Kind::kServerError: return "upstream_5xx";
  }
  return "connect";
}

awaitable<FetchResult> fetch(const InstanceSpec& instance, const UpstreamRequest& request,
                             double timeout_seconds) {
  beast::tcp_stream stream(co_await net::this_coro::executor);
  if (std::optional<UpstreamFailure> f = co_await connect(stream, instance, timeout_seconds)) co_return *f;
  http::request<http::string_body> req = make_request(instance, request);
  boost::system::error_code ec;
  stream.expires_after(duration_of(timeout_seconds));
  co_await http::async_write(stream, req, net::redirect_error(use_awaitable, ec));
  if (ec) co_return failure(ec, "send", timeout_seconds);
  const auto written_at = std::chrono::steady_clock::now();
  beast::flat_buffer buffer;
  http::response_parser<http::string_body> parser;
  parser.body_limit(std::uint64_t{256} << 20);
  co_await http::async_read(stream, buffer, parser, net::redirect_error(use_awaitable, ec));
  if (ec) co_return failure(ec, "read", timeout_seconds);
  UpstreamResponse out;
  out.written_at = written_at;
  out.status = parser.get().result_int();
  if (auto it = parser.get().find(http::field::content_type); it != parser.get().end())
    out.content_type = std::string(it->value());
  out.body = std::move(parser.get().body());
  stream.socket().shutdown(tcp::socket::shutdown_both, ec);
  co_return out;
}

UpstreamStream::UpstreamStream(net::any_io_executor executor) : stream_(executor) {
  // Not boost::none: Boost 1.74 compares a Content-Length against an empty limit as exceeded.
  parser_.body_limit(std::numeric_limits<std::uint64_t>::max());
}

awaitable<std::optional<UpstreamFailure>> UpstreamStream::open(const InstanceSpec& instance,
                                                               const UpstreamRequest& request,
                                                               double timeout_seconds) {
  if (std::optional<UpstreamFailure> f = co_await connect(stream_, instance, timeout_seconds)) co_return f;
  http::request<http::string_body> req = make_request(instance, request);
  boost::system::error_code ec;
  stream_.expires_after(duration_of(timeout_seconds));
  co_await http::async_write(stream_, req, net::redirect_error(use_awaitable, ec));
  if (ec) co_return failure(ec, "send", timeout_seconds);
  written_at_ = std::chrono::steady_clock::now();
  co_await http::async_read_header(stream_, buffer_, parser_, net::redirect_error(use_awaitable, ec));
  if (ec) co_return failure(ec, "read", timeout_seconds);
  co_return std::nullopt;
}

std::string UpstreamStream::content_type() const {
  auto it = parser_.get().find(http::field::content_type);
  return it == parser_.get().end() ? std::string() : std::string(it->value());
}

awaitable<std::variant<std::string, UpstreamFailure>> UpstreamStream::read_some(double timeout_seconds) {
  char chunk[16384];
  while (!parser_.is_done()) {
    parser_.get().body().data = chunk;
    parser_.get().body().size = sizeof chunk;
    boost::system::error_code ec;
    stream_.expires_after(duration_of(timeout_seconds));
    co_await http::async_read_some(stream_, buffer_, parser_, net::redirect_error(use_awaitable, ec));
    if (ec == http::error::need_buffer) ec = {};
    if (ec) co_return failure(ec, "read", timeout_seconds);
    const size_t n = sizeof chunk - parser_.get().body().size;
    if (n > 0) co_return std::string(chunk, n);
  }
  co_return std::string();
}

void UpstreamStream::close() {
  boost::system::error_code ec;
  stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
  stream_.close();
}

}  // namespace inferd
