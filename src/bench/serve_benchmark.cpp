#include "bench/serve_benchmark.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <deque>
#include <limits>
#include <memory>
#include <random>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <nlohmann/json.hpp>

#include "common/log.h"

namespace inferd {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using json = nlohmann::json;
using net::awaitable;
using net::use_awaitable;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;

Status ServeBenchOptions::validate() const {
  if (endpoint != "/v1/completions" && endpoint != "/v1/chat/completions")
    return invalid_argument("--endpoint '" + endpoint +
                            "' (expected /v1/completions or /v1/chat/completions)");
  if (!(request_rate > 0)) return invalid_argument("--request-rate must be positive or inf");
  if (!(burstiness > 0) || !std::isfinite(burstiness))
    return invalid_argument("--burstiness must be positive");
  if (max_concurrency < 0) return invalid_argument("--max-concurrency must be 0 (no limit) or positive");
  if (!(request_timeout > 0)) return invalid_argument("--request-timeout must be positive");
  auto target = HttpTarget::parse(base_url);
  if (!target) return target.status();
  return Status::ok();
}

Expected<HttpTarget> HttpTarget::parse(const std::string& url) {
  const std::string scheme = "http://";
  if (url.rfind(scheme, 0) != 0)
    return invalid_argument("--base-url '" + url + "': expected http://host:port (https is not supported)");
  std::string rest = url.substr(scheme.size());
  HttpTarget t;
  if (const auto slash = rest.find('/'); slash != std::string::npos) {
    t.path_prefix = rest.substr(slash);
    rest = rest.substr(0, slash);
    while (!t.path_prefix.empty() && t.path_prefix.back() == '/') t.path_prefix.pop_back();
  }
  t.port = "80";
  if (const auto colon = rest.rfind(':'); colon != std::string::npos) {
    t.port = rest.substr(colon + 1);
    rest = rest.substr(0, colon);
    if (t.port.empty() || t.port.find_first_not_of("0123456789") != std::string::npos)
      return invalid_argument("--base-url '" + url + "': bad port");
  }
  if (rest.empty()) return invalid_argument("--base-url '" + url + "': no host");
  t.host = rest;
  return t;
}

namespace {

// Hands out at most `limit` slots; waiters are woken in order (limit 0 = unlimited).
class AsyncSemaphore {
 public:
  explicit AsyncSemaphore(int64_t limit) : free_(limit), unlimited_(limit == 0) {}
  awaitable<void> acquire() {
    if (unlimited_) co_return;
    if (free_ > 0) {
      --free_;
      co_return;
    }
    auto timer =
        std::make_shared<net::steady_timer>(co_await net::this_coro::executor, Clock::time_point::max());
    waiters_.push_back(timer);
    boost::system::error_code ec;
    co_await timer->async_wait(net::redirect_error(use_awaitable, ec));  // cancelled = our turn
  }
  void release() {
    if (unlimited_) return;
    if (waiters_.empty()) {
      ++free_;
      return;
    }
    waiters_.front()->cancel();  // the slot passes straight to the first waiter
    waiters_.pop_front();
  }

 private:
  int64_t free_;
  bool unlimited_;
  std::deque<std::shared_ptr<net::steady_timer>> waiters_;
};

struct RunContext {
  const ServeBenchOptions& options;
  HttpTarget target;
  std::string model;
  Clock::time_point t0;
  AsyncSemaphore slots;
  int64_t total = 0, done = 0, failed = 0;
  bool finished = false;
};

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::string describe(const boost::system::error_code& ec, const char* what, double timeout) {
  if (ec == beast::error::timeout)
    return "timed out after " + std::to_string(static_cast<int>(timeout)) + " s";
  return std::string(what) + ": " + ec.message();
}

// What one streamed request produced.
struct Streamed {
  std::string text;  // the generated text (multi-turn resends it)
  bool usage_seen = false;
  int64_t chunks = 0;
};

// Feeds one SSE event's data payload into the record. Returns false at [DONE].
bool take_event(const std::string& payload, Clock::time_point start, Clock::time_point* last,
                RequestRecord* rec, Streamed* out) {
  if (payload == "[DONE]") return false;
  const json j = json::parse(payload, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    rec->error = "malformed stream event: " + payload.substr(0, 200);
    return true;
  }
  if (j.contains("error")) {
    const auto& e = j["error"];
    rec->error = "stream error: " + (e.is_object() && e.contains("message") ? e["message"].dump() : e.dump());
    return true;
  }
  if (j.contains("choices") && j["choices"].is_array() && !j["choices"].empty()) {
    const auto now = Clock::now();
    if (out->chunks == 0) {
      rec->ttft = std::chrono::duration<double>(now - start).count();
    } else {
      rec->itl.push_back(std::chrono::duration<double>(now - *last).count());
    }
    *last = now;
    ++out->chunks;
    const auto& c = j["choices"][0];
    if (c.contains("text") && c["text"].is_string()) out->text += c["text"].get<std::string>();
    if (c.contains("delta") && c["delta"].is_object() && c["delta"].contains("content") &&
        c["delta"]["content"].is_string())
      out->text += c["delta"]["content"].get<std::string>();
  }
  if (j.contains("usage") && j["usage"].is_object()) {
    const auto& u = j["usage"];
    if (u.contains("completion_tokens") && u["completion_tokens"].is_number_integer()) {
      rec->output_tokens = u["completion_tokens"].get<int64_t>();
      out->usage_seen = true;
    }
    if (u.contains("prompt_tokens") && u["prompt_tokens"].is_number_integer())
      rec->prompt_tokens = u["prompt_tokens"].get<int64_t>();
  }
  return true;
}

// Sends `body` to `path` and reads the whole response; for a 200 SSE stream every event goes
// through take_event as it arrives. Fills rec->latency and rec->error; rec->start is the caller's.
awaitable<void> stream_one(RunContext& ctx, const std::string& path, const std::string& body,
                           RequestRecord* rec, Streamed* out) {
  const auto start = Clock::now();
  const auto deadline = start + std::chrono::duration_cast<Clock::duration>(
                                    std::chrono::duration<double>(ctx.options.request_timeout));
  auto ex = co_await net::this_coro::executor;
  tcp::resolver resolver(ex);
  beast::tcp_stream stream(ex);
  boost::system::error_code ec;
  auto finish = [&](std::string error) {
    rec->latency = std::chrono::duration<double>(Clock::now() - start).count();
    if (!error.empty() && rec->error.empty()) rec->error = std::move(error);
  };
  stream.expires_at(deadline);
  auto endpoints = co_await resolver.async_resolve(ctx.target.host, ctx.target.port,
                                                   net::redirect_error(use_awaitable, ec));
  if (ec) co_return finish(describe(ec, "resolve", ctx.options.request_timeout));
  co_await stream.async_connect(endpoints, net::redirect_error(use_awaitable, ec));
  if (ec) co_return finish(describe(ec, "connect", ctx.options.request_timeout));
  http::request<http::string_body> req{http::verb::post, ctx.target.path_prefix + path, 11};
  req.set(http::field::host, ctx.target.host);
  req.set(http::field::content_type, "application/json");
  req.set(http::field::accept, "text/event-stream");
  if (!ctx.options.api_key.empty()) req.set(http::field::authorization, "Bearer " + ctx.options.api_key);
  req.body() = body;
  req.prepare_payload();
  stream.expires_at(deadline);
  co_await http::async_write(stream, req, net::redirect_error(use_awaitable, ec));
  if (ec) co_return finish(describe(ec, "send", ctx.options.request_timeout));

  beast::flat_buffer buffer;
  http::response_parser<http::buffer_body> parser;
  // Not boost::none: Boost 1.74 compares a Content-Length against an empty limit as exceeded.
  parser.body_limit(std::numeric_limits<std::uint64_t>::max());
  stream.expires_at(deadline);
  co_await http::async_read_header(stream, buffer, parser, net::redirect_error(use_awaitable, ec));
  if (ec) co_return finish(describe(ec, "read", ctx.options.request_timeout));
  const unsigned status = parser.get().result_int();
  std::string pending, error_body;
  Clock::time_point last{};
  bool done = false;
  char chunk[16384];
  while (!parser.is_done()) {
    parser.get().body().data = chunk;
    parser.get().body().size = sizeof chunk;
    stream.expires_at(deadline);
    co_await http::async_read_some(stream, buffer, parser, net::redirect_error(use_awaitable, ec));
    if (ec == http::error::need_buffer) ec = {};
    if (ec && done) break;  // [DONE] seen: how the server then closes does not matter
    if (ec) co_return finish(describe(ec, "read", ctx.options.request_timeout));
    const size_t n = sizeof chunk - parser.get().body().size;
    if (status != 200) {
      if (error_body.size() < 4096) error_body.append(chunk, n);
      continue;
    }
    pending.append(chunk, n);
    // CRLF line ends become LF (JSON payloads never hold a raw CR): events end with "\n\n".
    pending.erase(std::remove(pending.begin(), pending.end(), '\r'), pending.end());
    // Events end with a blank line; "data:" lines carry the payload.
    for (size_t end; !done && (end = pending.find("\n\n")) != std::string::npos;) {
      std::string event = pending.substr(0, end);
      pending.erase(0, end + 2);
      size_t at = 0;
      while (at <= event.size() && !done) {
        size_t eol = event.find('\n', at);
        if (eol == std::string::npos) eol = event.size();
        std::string line = event.substr(at, eol - at);
        at = eol + 1;
        if (line.rfind("data:", 0) != 0) continue;
        std::string payload = line.substr(5);
        if (!payload.empty() && payload[0] == ' ') payload.erase(0, 1);
        done = !take_event(payload, start, &last, rec, out);
      }
    }
  }
  if (status != 200) co_return finish("HTTP " + std::to_string(status) + ": " + error_body.substr(0, 300));
  if (!done && rec->error.empty()) co_return finish("the stream ended without [DONE]");
  if (out->chunks == 0 && rec->error.empty()) co_return finish("no tokens were streamed");
  finish("");
}

json request_body(const RunContext& ctx, const BenchItem& item, const json& messages, size_t turn,
                  size_t conversation) {
  json body = {{"model", ctx.model},
               {"max_tokens", item.output_len},
               {"stream", true},
               {"stream_options", {{"include_usage", true}}},
               {"temperature", 0.0}};
  if (ctx.options.ignore_eos) body["ignore_eos"] = true;
  if (ctx.options.session_ids)
    body["session_id"] = "bench-" + std::to_string(ctx.options.seed) + "-" + std::to_string(conversation);
  if (ctx.options.endpoint == "/v1/chat/completions") {
    body["messages"] = messages;
  } else {
    body["prompt"] = item.system + item.turns[turn];
  }
  return body;
}

// One conversation: waits for its arrival time and a slot, then sends its turns in order.
awaitable<void> conversation(RunContext& ctx, const BenchItem& item, size_t index, double at,
                             RequestRecord* records) {
  net::steady_timer timer(co_await net::this_coro::executor);
  timer.expires_at(ctx.t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(at)));
  boost::system::error_code ec;
  co_await timer.async_wait(net::redirect_error(use_awaitable, ec));
  co_await ctx.slots.acquire();
  json messages = json::array();
  if (!item.messages_json.empty()) {
    messages = json::parse(item.messages_json);
  } else if (!item.system.empty()) {
    messages.push_back({{"role", "system"}, {"content", item.system}});
  }
  const size_t turns = item.messages_json.empty() ? item.turns.size() : 1;
  for (size_t t = 0; t < turns; ++t) {
    RequestRecord& rec = records[t];
    rec.expected_output_tokens = item.output_len;
    rec.prompt_tokens = t == 0 ? item.prompt_tokens : 0;
    if (t > 0 && !records[t - 1].success) {
      rec.error = "an earlier turn of this conversation failed";
      ++ctx.done;
      ++ctx.failed;
      continue;
    }
    if (item.messages_json.empty()) messages.push_back({{"role", "user"}, {"content", item.turns[t]}});
    const std::string body = request_body(ctx, item, messages, t, index).dump();
    const std::string path = ctx.options.endpoint;
    rec.start = seconds_since(ctx.t0);
    Streamed out;
    co_await stream_one(ctx, path, body, &rec, &out);
    rec.success = rec.error.empty();
    if (rec.success && !out.usage_seen)
      rec.output_tokens = out.chunks;  // no usage chunk: one token per chunk
    if (rec.success) messages.push_back({{"role", "assistant"}, {"content", out.text}});
    ++ctx.done;
    if (!rec.success) ++ctx.failed;
  }
  ctx.slots.release();
}

// A progress bar redrawn in place on a terminal (a display, not a log: it goes straight to the
// terminal), else a log line at each tenth of the run.
awaitable<void> progress(RunContext& ctx) {
  const bool tty = ::isatty(STDERR_FILENO) != 0;
  net::steady_timer timer(co_await net::this_coro::executor);
  int64_t last_tenth = -1;
  while (!ctx.finished) {
    const int64_t tenth = ctx.total > 0 ? ctx.done * 10 / ctx.total : 10;
    if (tty) {
      const int width = 30;
      const auto filled = static_cast<int>(ctx.total > 0 ? ctx.done * width / ctx.total : width);
      std::fprintf(stderr, "\r[%s%s] %lld/%lld requests, %lld failed, %.1f s ",
                   std::string(static_cast<size_t>(filled), '=').c_str(),
                   std::string(static_cast<size_t>(width - filled), ' ').c_str(),
                   static_cast<long long>(ctx.done), static_cast<long long>(ctx.total),
                   static_cast<long long>(ctx.failed), seconds_since(ctx.t0));
    } else if (tenth != last_tenth) {
      log_info("bench progress", {{"done", ctx.done},
                                  {"total", ctx.total},
                                  {"failed", ctx.failed},
                                  {"elapsed_s", seconds_since(ctx.t0)}});
    }
    last_tenth = tenth;
    std::fflush(stderr);
    timer.expires_after(std::chrono::milliseconds(500));
    boost::system::error_code ec;
    co_await timer.async_wait(net::redirect_error(use_awaitable, ec));
  }
  if (tty) std::fprintf(stderr, "\n");
}

}  // namespace

std::vector<double> arrival_times(size_t n, double rate, double burstiness, uint64_t seed) {
  std::vector<double> at(n, 0.0);
  if (std::isinf(rate)) return at;
  std::mt19937_64 rng(seed);
  std::gamma_distribution<double> gap(burstiness, 1.0 / (rate * burstiness));
  for (size_t i = 1; i < n; ++i) at[i] = at[i - 1] + gap(rng);
  return at;
}

Expected<ServeRun> run_serve_benchmark(const ServeBenchOptions& options,
                                       const std::vector<BenchItem>& items) {
  INFERD_RETURN_IF_ERROR(options.validate());
  INFERD_ASSIGN_OR_RETURN(HttpTarget target, HttpTarget::parse(options.base_url));
  std::string model = options.model;
  if (model.empty()) {
    INFERD_ASSIGN_OR_RETURN(model, first_served_model(options));
  }
  const bool chat = options.endpoint == "/v1/chat/completions";
  std::vector<size_t> first_record;
  size_t total = 0;
  for (const BenchItem& item : items) {
    if (!item.messages_json.empty() && !chat)
      return invalid_argument("dataset items with \"messages\" need --endpoint /v1/chat/completions");
    if (item.turns.size() > 1 && !chat)
      return invalid_argument("--dataset multi-turn needs --endpoint /v1/chat/completions");
    first_record.push_back(total);
    total += item.messages_json.empty() ? item.turns.size() : 1;
  }
  ServeRun run;
  run.records.resize(total);
  net::io_context io;
  RunContext ctx{options, target, model, Clock::now(), AsyncSemaphore(options.max_concurrency)};
  ctx.total = static_cast<int64_t>(total);
  const std::vector<double> at =
      arrival_times(items.size(), options.request_rate, options.burstiness, options.seed);
  ctx.t0 = Clock::now();
  for (size_t i = 0; i < items.size(); ++i) {
    RequestRecord* records = run.records.data() + first_record[i];
    const BenchItem& item = items[i];
    const double when = at[i];
    net::co_spawn(io, conversation(ctx, item, i, when, records), net::detached);
  }
  if (options.progress) net::co_spawn(io, progress(ctx), net::detached);
  // Run until every conversation is done (the progress line then stops at its next tick).
  while (ctx.done < ctx.total && io.run_one() > 0) {
  }
  run.duration = seconds_since(ctx.t0);
  ctx.finished = true;
  io.run();
  return run;
}

Expected<std::string> first_served_model(const ServeBenchOptions& options) {
  INFERD_ASSIGN_OR_RETURN(HttpTarget target, HttpTarget::parse(options.base_url));
  try {
    net::io_context io;
    tcp::resolver resolver(io);
    beast::tcp_stream stream(io);
    stream.expires_after(std::chrono::seconds(30));
    stream.connect(resolver.resolve(target.host, target.port));
    http::request<http::empty_body> req{http::verb::get, target.path_prefix + "/v1/models", 11};
    req.set(http::field::host, target.host);
    if (!options.api_key.empty()) req.set(http::field::authorization, "Bearer " + options.api_key);
    http::write(stream, req);
    beast::flat_buffer buffer;
    http::response<http::string_body> res;
    http::read(stream, buffer, res);
    const json j = json::parse(res.body(), nullptr, false);
    if (res.result_int() != 200 || j.is_discarded() || !j.contains("data") || !j["data"].is_array() ||
        j["data"].empty() || !j["data"][0].contains("id") || !j["data"][0]["id"].is_string())
      return invalid_argument("GET " + options.base_url + "/v1/models gave no model id (HTTP " +
                              std::to_string(res.result_int()) + "); pass --model");
    return j["data"][0]["id"].get<std::string>();
  } catch (const std::exception& e) {
    return io_error("cannot reach " + options.base_url + ": " + e.what());
  }
}

}  // namespace inferd
