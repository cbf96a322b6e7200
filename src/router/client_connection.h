// ClientConnection: one client's connection to the router (the socket and a deadline that a
// watchdog enforces by closing it), and the writes the router makes on it: a whole response,
// or a stream's head, chunks and end (chunked on HTTP/1.1, raw and ended by the close on
// HTTP/1.0). OpenAI-style error bodies. Owned by the connection's coroutines on the I/O thread.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>  // before Asio's awaitable.hpp, which uses std::exchange

#include <boost/asio/awaitable.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/http/empty_body.hpp>
#include <boost/beast/http/message.hpp>
#include <boost/beast/http/string_body.hpp>

namespace inferd {

using ClientRequest = boost::beast::http::request<boost::beast::http::string_body>;
using ClientResponse = boost::beast::http::response<boost::beast::http::string_body>;

struct ClientConnection {
  explicit ClientConnection(boost::asio::ip::tcp::socket s);
  void expire_after(double seconds);
  void never_expire();

  boost::asio::ip::tcp::socket socket;
  boost::asio::steady_timer deadline;
  bool client_gone = false;
  bool chunked_stream = true;  // a stream's framing: chunked on HTTP/1.1
};

// Closes the socket once its deadline passes; ends when the socket closes.
boost::asio::awaitable<void> watch_deadline(std::shared_ptr<ClientConnection> conn);

// {"error": {"message", "type", "param": null, "code": status}}.
std::string error_body(int status, std::string_view message, std::string_view type);
// The error as one SSE event ("data: {...}\n\n").
std::string error_event(int status, std::string_view message, std::string_view type);

ClientResponse make_response(const ClientRequest& req, unsigned status, std::string body,
                             std::string_view content_type = "application/json");
ClientResponse make_error(const ClientRequest& req, int status, std::string_view message,
                          std::string_view type);

// Writes a whole response within write_timeout; false when the client is gone or too slow.
boost::asio::awaitable<bool> send_response(ClientConnection& conn, ClientResponse& res, double write_timeout);
// A stream's head (status and content type as the instance gave them).
boost::asio::awaitable<bool> start_stream(ClientConnection& conn, const ClientRequest& req, unsigned status,
                                          const std::string& content_type, double write_timeout);
// Bytes of the stream's body; false (and client_gone) when the write fails.
boost::asio::awaitable<bool> send_stream_bytes(ClientConnection& conn, const std::string& data,
                                               double write_timeout);
// The end of the stream's body; returns whether the connection may be kept.
boost::asio::awaitable<bool> finish_stream(ClientConnection& conn, double write_timeout);

}  // namespace inferd
