// The router's HTTP client of its instances (Boost.Beast over Asio coroutines, one connection
// per request): `fetch` reads a whole response (health checks, /metrics scrapes, /v1/models,
// prefill legs, non-streamed answers); `UpstreamStream` reads a response piece by piece as it
// arrives, for streams passed through to the client. Each read and write has a deadline.
// Runs on the caller's executor; an object belongs to the coroutine that made it.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>  // before Asio's awaitable.hpp, which uses std::exchange
#include <variant>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/buffer_body.hpp>
#include <boost/beast/http/parser.hpp>

#include "router/instance_spec.h"

namespace inferd {

struct UpstreamRequest {
  std::string method = "POST";  // GET, POST or DELETE
  std::string target;           // "/v1/completions"
  std::string body;             // JSON, POST only
  std::string authorization;    // the client's Authorization header, forwarded; empty: none
  std::string session_header;   // X-Session-Id, forwarded; empty: none
  bool accept_stream = false;   // Accept: text/event-stream
};

// Why an instance gave no usable answer.
struct UpstreamFailure {
  enum class Kind { kConnect, kTimeout, kBroken, kServerError };
  Kind kind = Kind::kConnect;
  std::string message;  // "connection refused", "timed out after 30 s", "HTTP 500: ..."
};

// The metrics label of a failure kind: connect, timeout, broken, upstream_5xx.
const char* failure_kind_name(UpstreamFailure::Kind kind);

struct UpstreamResponse {
  unsigned status = 0;
  std::string content_type;
  std::string body;
  std::chrono::steady_clock::time_point written_at{};  // the request written: the router's part ends
};

// A whole response, or why none came. A 5xx is a response here: the caller decides.
using FetchResult = std::variant<UpstreamResponse, UpstreamFailure>;
boost::asio::awaitable<FetchResult> fetch(const InstanceSpec& instance, const UpstreamRequest& request,
                                          double timeout_seconds);

// One streamed response: open() sends the request and reads the head; read_some() returns the
// body bytes that arrived since (empty once done()).
class UpstreamStream final {
 public:
  explicit UpstreamStream(boost::asio::any_io_executor executor);

  // Connects, writes the request, reads the response head.
  boost::asio::awaitable<std::optional<UpstreamFailure>> open(const InstanceSpec& instance,
                                                              const UpstreamRequest& request,
                                                              double timeout_seconds);
  unsigned status() const { return parser_.get().result_int(); }
  // When the request was written (the router's overhead ends there).
  std::chrono::steady_clock::time_point written_at() const { return written_at_; }
  std::string content_type() const;
  bool done() const { return parser_.is_done(); }
  // The next bytes of the body (at least one unless done), or a failure.
  boost::asio::awaitable<std::variant<std::string, UpstreamFailure>> read_some(double timeout_seconds);
  // Closes the connection (the instance sees the hang-up and aborts the request).
  void close();

 private:
  boost::beast::tcp_stream stream_;
  boost::beast::flat_buffer buffer_;
  boost::beast::http::response_parser<boost::beast::http::buffer_body> parser_;
  std::chrono::steady_clock::time_point written_at_{};
};

}  // namespace inferd
