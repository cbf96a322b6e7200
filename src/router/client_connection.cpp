#include "router/client_connection.h"

// Asio's coroutine frames trip GCC 12's -Wmismatched-new-delete (see server/http_server.cpp).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif

#include <chrono>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <nlohmann/json.hpp>

namespace inferd {

namespace net = boost::asio;
namespace http = boost::beast::http;
using Clock = std::chrono::steady_clock;
using net::awaitable;
using net::use_awaitable;

ClientConnection::ClientConnection(net::ip::tcp::socket s)
    : socket(std::move(s)), deadline(socket.get_executor()) {
  deadline.expires_at(Clock::time_point::max());
}

void ClientConnection::expire_after(double seconds) {
  deadline.expires_after(std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds)));
}

void ClientConnection::never_expire() {
  deadline.expires_at(Clock::time_point::max());
}

awaitable<void> watch_deadline(std::shared_ptr<ClientConnection> conn) {
  while (conn->socket.is_open()) {
    boost::system::error_code ec;
    co_await conn->deadline.async_wait(net::redirect_error(use_awaitable, ec));
    if (conn->deadline.expiry() <= Clock::now()) {
      conn->socket.close(ec);
      co_return;
    }
  }
}

std::string error_body(int status, std::string_view message, std::string_view type) {
  const nlohmann::json err = {{"message", message}, {"type", type}, {"param", nullptr}, {"code", status}};
  return nlohmann::json{{"error", err}}.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string error_event(int status, std::string_view message, std::string_view type) {
  return "data: " + error_body(status, message, type) + "\n\n";
}

ClientResponse make_response(const ClientRequest& req, unsigned status, std::string body,
                             std::string_view content_type) {
  ClientResponse res{static_cast<http::status>(status), req.version()};
  res.set(http::field::server, "inferd-router");
  res.set(http::field::content_type,
          content_type.empty() ? std::string("application/json") : std::string(content_type));
  res.keep_alive(req.keep_alive());
  res.body() = std::move(body);
  return res;
}

ClientResponse make_error(const ClientRequest& req, int status, std::string_view message,
                          std::string_view type) {
  return make_response(req, static_cast<unsigned>(status), error_body(status, message, type));
}

awaitable<bool> send_response(ClientConnection& conn, ClientResponse& res, double write_timeout) {
  res.prepare_payload();
  conn.expire_after(write_timeout);
  boost::system::error_code ec;
  co_await http::async_write(conn.socket, res, net::redirect_error(use_awaitable, ec));
  conn.never_expire();
  if (ec) conn.client_gone = true;
  co_return !ec && res.keep_alive();
}

awaitable<bool> start_stream(ClientConnection& conn, const ClientRequest& req, unsigned status,
                             const std::string& content_type, double write_timeout) {
  http::response<http::empty_body> head{static_cast<http::status>(status), req.version()};
  head.set(http::field::server, "inferd-router");
  head.set(http::field::content_type, content_type.empty() ? "text/event-stream" : content_type);
  head.set(http::field::cache_control, "no-cache");
  conn.chunked_stream = req.version() >= 11;
  head.chunked(conn.chunked_stream);
  head.keep_alive(conn.chunked_stream && req.keep_alive());
  http::response_serializer<http::empty_body> sr{head};
  conn.expire_after(write_timeout);
  boost::system::error_code ec;
  co_await http::async_write_header(conn.socket, sr, net::redirect_error(use_awaitable, ec));
  conn.never_expire();
  if (ec) conn.client_gone = true;
  co_return !ec;
}

awaitable<bool> send_stream_bytes(ClientConnection& conn, const std::string& data, double write_timeout) {
  if (conn.client_gone) co_return false;
  if (data.empty()) co_return true;
  conn.expire_after(write_timeout);
  boost::system::error_code ec;
  if (conn.chunked_stream) {
    co_await net::async_write(conn.socket, http::make_chunk(net::buffer(data)),
                              net::redirect_error(use_awaitable, ec));
  } else {
    co_await net::async_write(conn.socket, net::buffer(data), net::redirect_error(use_awaitable, ec));
  }
  conn.never_expire();
  if (ec) conn.client_gone = true;
  co_return !ec;
}

awaitable<bool> finish_stream(ClientConnection& conn, double write_timeout) {
  if (conn.client_gone) co_return false;
  if (!conn.chunked_stream) co_return false;  // HTTP/1.0: the close ends the body
  conn.expire_after(write_timeout);
  boost::system::error_code ec;
  co_await net::async_write(conn.socket, http::make_chunk_last(), net::redirect_error(use_awaitable, ec));
  conn.never_expire();
  if (ec) conn.client_gone = true;
  co_return !ec;
}

}  // namespace inferd
