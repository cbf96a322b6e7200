#include "server/http_server.h"

// Asio allocates coroutine frames with its recycling allocator (::operator new of a larger size)
// and frees them through the matching static operator delete; once GCC 12 inlines both at -O2 it
// reports the pair as mismatched. A false positive about Asio's internals, silenced here only.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif

#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <deque>
#include <mutex>
#include <optional>
#include <random>
#include <unordered_map>
#include <unordered_set>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "server/metrics.h"
#include "server/openai_api.h"
#include "tokenizer/chat_encoder.h"
#include "tokenizer/incremental_detokenizer.h"

namespace inferd {

namespace net = boost::asio;
namespace http = boost::beast::http;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;
using json = nlohmann::json;
template <typename T>
using awaitable = net::awaitable<T>;
using net::use_awaitable;

namespace {

double seconds(Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

std::string random_id(const char* prefix) {
  static thread_local std::mt19937_64 rng(std::random_device{}());
  char buf[40];
  std::snprintf(buf, sizeof buf, "%s%016llx", prefix, static_cast<unsigned long long>(rng()));
  return buf;
}

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// One client connection: the socket plus a deadline that a watchdog enforces by closing it.
struct Connection {
  explicit Connection(tcp::socket s) : socket(std::move(s)), deadline(socket.get_executor()) {
    deadline.expires_at(Clock::time_point::max());
  }
  void expire_after(double secs) {
    deadline.expires_after(std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(secs)));
  }
  void never_expire() { deadline.expires_at(Clock::time_point::max()); }
  tcp::socket socket;
  net::steady_timer deadline;
  bool client_gone = false;
  // A stream's body framing: chunked on HTTP/1.1; HTTP/1.0 has no chunked coding (RFC 9112
  // section 6.1), so its stream is the raw events, ended by closing the connection.
  bool chunked_stream = true;
};

// Outputs of one HTTP request's engine requests, handed from the engine thread to the I/O thread.
struct Channel {
  explicit Channel(net::any_io_executor ex) : wake(ex) { wake.expires_at(Clock::time_point::max()); }
  struct Item {
    size_t prompt;  // which prompt of the request
    StepOutput out;
    Clock::time_point at;
  };
  std::mutex mutex;
  std::deque<Item> items;  // guarded by mutex
  net::steady_timer wake;  // I/O thread only: cancelled to wake the handler
};

// Per choice (prompt x sample) state of a generation.
struct Choice {
  std::optional<IncrementalDetokenizer> detok;
  std::optional<ReasoningSplitter> splitter;
  std::string text, reasoning;
  std::vector<int32_t> ids;
  json logprobs = json::array();  // chat: content entries; completions: filled at the end
  std::string finish_reason;      // set once the choice is done
  std::string error;
  bool finished = false;   // its engine sample has finished (or was ended by a stop string)
  bool role_sent = false;  // streaming chat: the first chunk with the role went out
  Clock::time_point first_token{}, last_token{};
};

}  // namespace

struct HttpServer::Impl {
  explicit Impl(ServerOptions o) : options(std::move(o)), io(1), acceptor(io), signals(io, SIGTERM, SIGINT) {}

  ServerOptions options;
  net::io_context io;
  tcp::acceptor acceptor;
  net::signal_set signals;
  // I/O thread only from here on.
  bool ready = false;
  bool draining = false;
  int exit_code = 0;
  ServingContext ctx;
  std::unique_ptr<ServerMetrics> metrics;
  std::unordered_set<RequestId> active;  // engine requests in flight
  int64_t in_flight_http = 0;

  using Response = http::response<http::string_body>;

  // ---- plumbing -----------------------------------------------------------------------------

  awaitable<void> watchdog(std::shared_ptr<Connection> conn) {
    while (conn->socket.is_open()) {
      boost::system::error_code ec;
      co_await conn->deadline.async_wait(net::redirect_error(use_awaitable, ec));
      if (conn->deadline.expiry() <= Clock::now()) {
        conn->socket.close(ec);
        co_return;
      }
    }
  }

  // Sends a whole response; false when the client is gone or too slow.
  awaitable<bool> send(Connection& conn, Response& res) {
    res.prepare_payload();
    conn.expire_after(options.write_timeout_seconds);
    boost::system::error_code ec;
    co_await http::async_write(conn.socket, res, net::redirect_error(use_awaitable, ec));
    conn.never_expire();
    co_return !ec;
  }

  Response make_response(const http::request<http::string_body>& req, http::status status, std::string body,
                         const char* content_type = "application/json") {
    Response res{status, req.version()};
    res.set(http::field::server, "inferd");
    res.set(http::field::content_type, content_type);
    res.keep_alive(req.keep_alive());
    res.body() = std::move(body);
    return res;
  }

  Response error_response(const http::request<http::string_body>& req, const ApiError& e) {
    return make_response(req, static_cast<http::status>(e.status), error_body(e));
  }

  static ApiError not_ready_error(bool failed) {
    return ApiError{503, failed ? "the model failed to load" : "the model is loading", "service_unavailable",
                    "", ""};
  }

  // ---- connection loop ----------------------------------------------------------------------

  awaitable<void> accept_loop() {
    for (;;) {
      boost::system::error_code ec;
      tcp::socket socket = co_await acceptor.async_accept(net::redirect_error(use_awaitable, ec));
      if (ec) {
        if (!acceptor.is_open()) co_return;
        continue;  // e.g. too many open files: keep serving the others
      }
      if (draining) continue;
      auto conn = std::make_shared<Connection>(std::move(socket));
      net::co_spawn(io, watchdog(conn), net::detached);
      net::co_spawn(io, session(conn), net::detached);
    }
  }

  awaitable<void> session(std::shared_ptr<Connection> conn) {
    boost::beast::flat_buffer buffer;
    for (;;) {
      boost::system::error_code ec;
      if (buffer.size() == 0) {  // wait (idle) for the first byte of the next request
        conn->expire_after(options.idle_timeout_seconds);
        co_await conn->socket.async_wait(tcp::socket::wait_read, net::redirect_error(use_awaitable, ec));
        if (ec || draining) break;
      }
      conn->expire_after(options.header_timeout_seconds);
      http::request_parser<http::string_body> parser;
      parser.header_limit(static_cast<std::uint32_t>(options.max_header_bytes));
      parser.body_limit(static_cast<std::uint64_t>(options.max_body_bytes));
      co_await http::async_read(conn->socket, buffer, parser, net::redirect_error(use_awaitable, ec));
      conn->never_expire();
      if (ec == http::error::end_of_stream || !conn->socket.is_open()) break;
      if (ec) {
        // Answer what we can name, then close: the stream position is unknown after a bad message.
        http::request<http::string_body> dummy;
        dummy.version(11);
        dummy.keep_alive(false);
        ApiError e{400, "malformed HTTP request: " + ec.message(), "invalid_request_error", "", ""};
        if (ec == http::error::body_limit) {
          e = ApiError{413, "the request body exceeds " + std::to_string(options.max_body_bytes) + " bytes",
                       "invalid_request_error", "", "request_too_large"};
        } else if (ec == http::error::header_limit) {
          e = ApiError{431,
                       "the request headers exceed " + std::to_string(options.max_header_bytes) + " bytes",
                       "invalid_request_error", "", ""};
        }
        Response res = error_response(dummy, e);
        res.keep_alive(false);
        co_await send(*conn, res);
        break;
      }
      http::request<http::string_body> req = parser.release();
      ++in_flight_http;
      const bool keep = co_await route(conn, req);
      --in_flight_http;
      if (!keep || !req.keep_alive() || draining || !conn->socket.is_open()) break;
    }
    boost::system::error_code ignored;
    conn->socket.shutdown(tcp::socket::shutdown_both, ignored);
    conn->socket.close(ignored);
    conn->deadline.cancel();
  }

  bool authorized(const http::request<http::string_body>& req) const {
    if (options.api_key.empty()) return true;
    auto it = req.find(http::field::authorization);
    return it != req.end() && it->value() == "Bearer " + options.api_key;
  }

  // Returns whether the connection may be kept.
  awaitable<bool> route(std::shared_ptr<Connection> conn, http::request<http::string_body>& req) {
    std::string target(req.target());
    if (auto q = target.find('?'); q != std::string::npos) target.resize(q);
    const bool get = req.method() == http::verb::get;
    const bool post = req.method() == http::verb::post;
    // Probes reach /health without a key (orchestrators send none); /metrics unless protected.
    const bool open_endpoint = target == "/health" || (target == "/metrics" && !options.protect_metrics);
    if (!open_endpoint && !authorized(req)) {
      Response res =
          error_response(req, ApiError{401, "a valid API key is required (Authorization: Bearer ...)",
                                       "authentication_error", "", "invalid_api_key"});
      res.set(http::field::www_authenticate, "Bearer");
      co_return co_await send(*conn, res);
    }
    auto method_not_allowed = [&]() -> awaitable<bool> {
      Response res = error_response(
          req, ApiError{405, "method not allowed for " + target, "invalid_request_error", "", ""});
      co_return co_await send(*conn, res);
    };
    if (target == "/health") {
      if (!get) co_return co_await method_not_allowed();
      Response res = ready ? make_response(req, http::status::ok, "{\"status\":\"ok\"}")
                           : error_response(req, not_ready_error(exit_code != 0));
      co_return co_await send(*conn, res);
    }
    if (target == "/metrics") {
      if (!get) co_return co_await method_not_allowed();
      if (!ready) {
        Response res = error_response(req, not_ready_error(exit_code != 0));
        co_return co_await send(*conn, res);
      }
      refresh_gauges();
      Response res =
          make_response(req, http::status::ok, metrics->render(), "text/plain; version=0.0.4; charset=utf-8");
      co_return co_await send(*conn, res);
    }
    const bool known = target == "/v1/models" || target == "/v1/chat/completions" ||
                       target == "/v1/completions" || target == "/tokenize" || target == "/detokenize";
    if (!known) {
      Response res = error_response(
          req, ApiError{404, "no such endpoint: " + target, "invalid_request_error", "", "not_found"});
      co_return co_await send(*conn, res);
    }
    if (!ready) {
      Response res = error_response(req, not_ready_error(exit_code != 0));
      co_return co_await send(*conn, res);
    }
    if (target == "/v1/models") {
      if (!get) co_return co_await method_not_allowed();
      json model = {{"id", options.served_model_name},
                    {"object", "model"},
                    {"created", unix_now()},
                    {"owned_by", "inferd"},
                    {"max_model_len", ctx.max_model_len}};
      Response res = make_response(req, http::status::ok,
                                   json{{"object", "list"}, {"data", json::array({model})}}.dump());
      co_return co_await send(*conn, res);
    }
    if (!post) co_return co_await method_not_allowed();
    if (target == "/tokenize") co_return co_await tokenize(*conn, req);
    if (target == "/detokenize") co_return co_await detokenize(*conn, req);
    co_return co_await generate(
        conn, req, target == "/v1/chat/completions" ? ApiEndpoint::kChat : ApiEndpoint::kCompletion);
  }

  void refresh_gauges() {
    const auto blocks = ctx.engine->num_blocks();
    const double usage =
        blocks > 0 ? static_cast<double>(blocks - ctx.engine->num_free_blocks()) / static_cast<double>(blocks)
                   : 0.0;
    metrics->set_scheduler_state(ctx.engine->num_running(), ctx.engine->num_waiting(), usage);
    metrics->set_preemptions(ctx.engine->num_preemptions());
    metrics->set_prefix_cache(ctx.engine->prefix_query_tokens(), ctx.engine->prefix_hit_tokens());
    metrics->set_sessions(ctx.engine->num_sessions(), ctx.engine->num_pinned_blocks());
    metrics->set_revived_blocks(ctx.engine->num_revived_blocks());
    if (const KvOffloader* o = ctx.engine->offloader()) {
      std::vector<OffloadTierFigures> tiers;
      for (const auto& tier : o->tiers()) {
        const KvTierStats& st = tier->stats();
        tiers.push_back({tier->name(), st.writes.load(), st.write_bytes.load(), st.reads.load(),
                         st.read_bytes.load(), st.failures.load(), st.corrupt.load(), tier->up()});
      }
      metrics->set_offload(tiers, o->num_dropped_writes());
    }
  }

  // ---- /tokenize, /detokenize ---------------------------------------------------------------

  awaitable<bool> tokenize(Connection& conn, const http::request<http::string_body>& req) {
    ParsedTokenize p = parse_tokenize_request(req.body());
    if (!p.request) {
      Response res = error_response(req, p.error);
      co_return co_await send(conn, res);
    }
    if (ctx.tokenizer == nullptr) {
      Response res =
          error_response(req, ApiError{400, "the model has no tokenizer", "invalid_request_error", "", ""});
      co_return co_await send(conn, res);
    }
    std::vector<int32_t> ids;
    if (!p.request->messages.is_null()) {
      if (ctx.chat_template == nullptr) {
        Response res = error_response(
            req, ApiError{400, "the model has no chat template", "invalid_request_error", "messages", ""});
        co_return co_await send(conn, res);
      }
      auto chat = encode_chat(*ctx.tokenizer, *ctx.chat_template, p.request->messages, ChatOptions{});
      if (!chat) {
        Response res = error_response(
            req, ApiError{400, chat.status().message(), "invalid_request_error", "messages", ""});
        co_return co_await send(conn, res);
      }
      ids = std::move(chat->ids);
    } else {
      ids = p.request->add_special_tokens ? ctx.tokenizer->encode_prompt(p.request->prompt, true)
                                          : ctx.tokenizer->encode(p.request->prompt, true);
    }
    json body = {{"tokens", ids}, {"count", ids.size()}, {"max_model_len", ctx.max_model_len}};
    Response res = make_response(req, http::status::ok, body.dump());
    co_return co_await send(conn, res);
  }

  awaitable<bool> detokenize(Connection& conn, const http::request<http::string_body>& req) {
    ParsedDetokenize p = parse_detokenize_request(req.body());
    if (p.tokens && ctx.tokenizer == nullptr)
      p = ParsedDetokenize{std::nullopt,
                           ApiError{400, "the model has no tokenizer", "invalid_request_error", "", ""}};
    if (p.tokens) {
      for (int32_t t : *p.tokens) {
        if (t >= ctx.tokenizer->vocab_size()) {
          p = ParsedDetokenize{std::nullopt,
                               ApiError{400, "token id " + std::to_string(t) + " is outside the vocabulary",
                                        "invalid_request_error", "tokens", ""}};
          break;
        }
      }
    }
    if (!p.tokens) {
      Response res = error_response(req, p.error);
      co_return co_await send(conn, res);
    }
    json body = {{"prompt", ctx.tokenizer->decode(*p.tokens)}};
    Response res =
        make_response(req, http::status::ok, body.dump(-1, ' ', false, json::error_handler_t::replace));
    co_return co_await send(conn, res);
  }

  // ---- generation ---------------------------------------------------------------------------

  json token_entry(int32_t id, float logprob) const {
    const std::string& bytes = ctx.tokenizer != nullptr ? ctx.tokenizer->token_bytes(id) : std::string();
    json b = json::array();
    for (unsigned char c : bytes) b.push_back(c);
    return json{
        {"token", ctx.tokenizer != nullptr ? bytes : std::to_string(id)}, {"logprob", logprob}, {"bytes", b}};
  }

  // What one engine output adds to a choice.
  struct Delta {
    std::string content, reasoning;
    json logprobs = json::array();  // chat-style entries of the new tokens
  };

  // Applies an engine output to its choice: token ids, logprobs, detokenized text (a stop string
  // ends the choice and aborts its sample), reasoning split, finish reason, metrics.
  Delta apply_output(Choice& c, const Channel::Item& item, RequestId engine_id) {
    Delta d;
    std::string text;
    for (size_t k = 0; k < item.out.new_tokens.size() && !c.finished; ++k) {
      const int32_t t = item.out.new_tokens[k];
      if (c.ids.empty()) {
        c.first_token = item.at;
      } else {
        metrics->observe_inter_token(seconds(item.at - c.last_token));
      }
      c.last_token = item.at;
      c.ids.push_back(t);
      if (k < item.out.logprobs.size()) {
        json e = token_entry(t, item.out.logprobs[k]);
        json top = json::array();
        for (const auto& alt : item.out.top_logprobs[k]) top.push_back(token_entry(alt.first, alt.second));
        e["top_logprobs"] = top;
        d.logprobs.push_back(e);
      }
      if (c.detok) {
        auto piece = c.detok->push(t);
        text += piece.text;
        if (piece.stopped) {
          c.finished = true;
          c.finish_reason = "stop";
          ctx.engine->abort(engine_id, item.out.index);
        }
      } else {
        text += (c.ids.size() > 1 ? " " : "") + std::to_string(t);
      }
    }
    if (item.out.finished && !c.finished) {
      c.finished = true;
      c.finish_reason = finish_reason_name(item.out.finish_reason);
      c.error = item.out.error;
      if (c.detok) text += c.detok->finish().text;
    }
    metrics->add_generation_tokens(static_cast<int64_t>(item.out.new_tokens.size()));
    if (c.splitter) {
      auto parts = c.splitter->feed(text);
      if (c.finished) {
        auto rest = c.splitter->finish();
        parts.reasoning += rest.reasoning;
        parts.content += rest.content;
      }
      d.content = std::move(parts.content);
      d.reasoning = std::move(parts.reasoning);
    } else {
      d.content = std::move(text);
    }
    c.text += d.content;
    c.reasoning += d.reasoning;
    for (const auto& e : d.logprobs) c.logprobs.push_back(e);
    return d;
  }

  static std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

  // Everything a generation needs before it is submitted.
  struct Prepared {
    GenerateRequest g;
    std::vector<std::vector<int32_t>> prompts;
    bool prompt_opens_think = false;
    int64_t total_prompt_tokens = 0;
  };

  // Parses, renders and tokenizes a generation request and checks it against the context window
  // and the queue limit (a plain function: no temporaries cross a co_await, see generate()).
  std::optional<ApiError> prepare_generate(ApiEndpoint endpoint, const std::string& raw_body, Prepared* out) {
    ParsedRequest parsed = parse_generate_request(endpoint, raw_body);
    if (!parsed.request) return parsed.error;
    out->g = std::move(*parsed.request);
    GenerateRequest& g = out->g;
    auto& prompts = out->prompts;
    bool& prompt_opens_think = out->prompt_opens_think;
    int64_t& total_prompt_tokens = out->total_prompt_tokens;
    auto fail = [](ApiError e) { return std::optional<ApiError>(std::move(e)); };
    if (!g.model.empty() && g.model != options.served_model_name)
      return fail(ApiError{404,
                           "the model '" + g.model + "' does not exist (this server serves '" +
                               options.served_model_name + "')",
                           "invalid_request_error", "model", "model_not_found"});
    // Prompts to token ids.
    if (endpoint == ApiEndpoint::kChat) {
      if (ctx.tokenizer == nullptr || ctx.chat_template == nullptr)
        return fail(ApiError{400, "the model has no chat template: use /v1/completions",
                             "invalid_request_error", "messages", ""});
      auto chat = encode_chat(*ctx.tokenizer, *ctx.chat_template, g.messages, ChatOptions{});
      if (!chat) return fail(ApiError{400, chat.status().message(), "invalid_request_error", "messages", ""});
      const size_t last = chat->text.find_last_not_of(" \t\r\n");
      prompt_opens_think =
          last != std::string::npos && last + 1 >= 7 && chat->text.compare(last + 1 - 7, 7, "<think>") == 0;
      prompts.push_back(std::move(chat->ids));
    } else {
      if (static_cast<int64_t>(g.prompts.size()) > options.max_prompts)
        return fail(ApiError{400,
                             "the request has " + std::to_string(g.prompts.size()) + " prompts; at most " +
                                 std::to_string(options.max_prompts) + " are accepted in one request",
                             "invalid_request_error", "prompt", ""});
      for (const PromptInput& in : g.prompts) {
        if (in.is_ids) {
          prompts.push_back(in.ids);
        } else {
          if (ctx.tokenizer == nullptr)
            return fail(ApiError{400, "the model has no tokenizer: give the prompt as token ids",
                                 "invalid_request_error", "prompt", ""});
          prompts.push_back(ctx.tokenizer->encode_prompt(in.text, true));
        }
      }
    }
    int64_t max_tokens = 0;
    for (const auto& p : prompts) {
      const auto len = static_cast<int64_t>(p.size());
      total_prompt_tokens += len;
      if (len == 0) return fail(ApiError{400, "the prompt is empty", "invalid_request_error", "prompt", ""});
      for (int32_t t : p) {
        if (t < 0 || t >= ctx.vocab_size)
          return fail(ApiError{400,
                               "token id " + std::to_string(t) + " is outside the vocabulary of " +
                                   std::to_string(ctx.vocab_size),
                               "invalid_request_error", "prompt", ""});
      }
      const int64_t want = g.max_tokens.value_or(std::max<int64_t>(1, ctx.max_model_len - len));
      if (len + want > ctx.max_model_len) {
        const char* param =
            g.max_tokens ? "max_tokens" : (endpoint == ApiEndpoint::kChat ? "messages" : "prompt");
        return fail(ApiError{400,
                             "this model's maximum context length is " + std::to_string(ctx.max_model_len) +
                                 " tokens, but the prompt has " + std::to_string(len) +
                                 " tokens and max_tokens is " + std::to_string(want) + " (" +
                                 std::to_string(len + want) + " in total)",
                             "invalid_request_error", param, "context_length_exceeded"});
      }
      max_tokens = std::max(max_tokens, want);
    }
    // The queue limit counts sequences: every prompt, times n.
    const int64_t sequences = static_cast<int64_t>(prompts.size()) * g.n;
    if (sequences > options.max_queue)
      return fail(ApiError{400,
                           "the request needs " + std::to_string(sequences) +
                               " sequences (prompts x n), more than " + "the server ever queues (" +
                               std::to_string(options.max_queue) + ")",
                           "invalid_request_error", endpoint == ApiEndpoint::kChat ? "n" : "prompt", ""});
    const int64_t queued = ctx.engine->num_queued_sequences();
    if (queued + sequences > options.max_queue)
      return fail(ApiError{429,
                           "the server is at capacity (" + std::to_string(queued) + " of " +
                               std::to_string(options.max_queue) +
                               " queue places taken, this request needs " + std::to_string(sequences) +
                               "); retry later",
                           "rate_limit_error", "", "queue_full"});
    return std::nullopt;
  }

  // GCC 12 destroys a temporary passed to a coroutine twice (GCC bug 99576): every argument of a
  // coroutine call in this file is a named object.
  awaitable<bool> generate(std::shared_ptr<Connection> conn, const http::request<http::string_body>& req,
                           ApiEndpoint endpoint) {
    const auto arrival = Clock::now();
    Prepared prepared;
    if (std::optional<ApiError> error = prepare_generate(endpoint, req.body(), &prepared)) {
      Response res = error_response(req, *error);
      if (error->status == 429) res.set(http::field::retry_after, "1");
      co_return co_await send(*conn, res);
    }
    GenerateRequest& g = prepared.g;
    const auto& prompts = prepared.prompts;
    const bool prompt_opens_think = prepared.prompt_opens_think;
    const int64_t total_prompt_tokens = prepared.total_prompt_tokens;

    // Submit every prompt; outputs flow into the channel.
    auto channel = std::make_shared<Channel>(io.get_executor());
    const size_t n = static_cast<size_t>(g.n);
    std::vector<Choice> choices(prompts.size() * n);
    for (auto& c : choices) {
      if (ctx.tokenizer != nullptr) c.detok.emplace(*ctx.tokenizer, g.stop);
      if (options.reasoning_parser && endpoint == ApiEndpoint::kChat) c.splitter.emplace(prompt_opens_think);
    }
    std::vector<RequestId> ids;
    std::vector<int32_t> stop_ids = g.stop_token_ids;
    if (ctx.tokenizer != nullptr) {
      const auto& s = ctx.tokenizer->vocab().stop_ids;
      stop_ids.insert(stop_ids.end(), s.begin(), s.end());
    }
    // Session context pool: the body's session_id, or the X-Session-Id header.
    std::string session = g.session_id.value_or("");
    if (session.empty()) {
      if (auto h = req.find("X-Session-Id"); h != req.end()) session = std::string(h->value());
    }
    for (size_t p = 0; p < prompts.size(); ++p) {
      RequestSpec spec;
      spec.prompt = prompts[p];
      spec.sampling = g.sampling;
      spec.limits.max_tokens =
          g.max_tokens.value_or(ctx.max_model_len - static_cast<int64_t>(prompts[p].size()));
      spec.limits.stop_token_ids = stop_ids;
      spec.limits.ignore_eos = g.ignore_eos;
      spec.priority = g.priority;
      spec.n = g.n;
      spec.session_id = session;
      auto ex = io.get_executor();
      const RequestId id = ctx.engine->submit(std::move(spec), [channel, p, ex](const StepOutput& out) {
        {
          std::lock_guard<std::mutex> lock(channel->mutex);
          channel->items.push_back({p, out, Clock::now()});
        }
        net::post(ex, [channel] { channel->wake.cancel(); });
      });
      ids.push_back(id);
      active.insert(id);
    }
    metrics->add_prompt_tokens(total_prompt_tokens);

    // Watch for the client hanging up while we wait: abort at once so its blocks free.
    auto stop_watch = std::make_shared<bool>(false);
    net::co_spawn(io, watch_disconnect(conn, channel, ids, stop_watch), net::detached);

    const std::string id_str = random_id(endpoint == ApiEndpoint::kChat ? "chatcmpl-" : "cmpl-");
    const int64_t created = unix_now();
    const char* object = endpoint == ApiEndpoint::kChat ? "chat.completion" : "text_completion";
    const char* chunk_object = endpoint == ApiEndpoint::kChat ? "chat.completion.chunk" : "text_completion";
    bool stream_ok = true;
    if (g.stream) {
      http::response<http::empty_body> head{http::status::ok, req.version()};
      head.set(http::field::server, "inferd");
      head.set(http::field::content_type, "text/event-stream");
      head.set(http::field::cache_control, "no-cache");
      conn->chunked_stream = req.version() >= 11;
      head.chunked(conn->chunked_stream);
      head.keep_alive(conn->chunked_stream && req.keep_alive());
      http::response_serializer<http::empty_body> sr{head};
      conn->expire_after(options.write_timeout_seconds);
      boost::system::error_code ec;
      co_await http::async_write_header(conn->socket, sr, net::redirect_error(use_awaitable, ec));
      conn->never_expire();
      stream_ok = !ec;
    }
    auto chunk_of = [&](size_t index, json delta_or_text, const json& logprobs, const json& finish) {
      json c = {{"index", index}};
      if (endpoint == ApiEndpoint::kChat) {
        c["delta"] = std::move(delta_or_text);
      } else {
        c["text"] = std::move(delta_or_text);
      }
      c["logprobs"] = logprobs;
      c["finish_reason"] = finish;
      return json{{"id", id_str},
                  {"object", chunk_object},
                  {"created", created},
                  {"model", options.served_model_name},
                  {"choices", json::array({c})}};
    };

    size_t unfinished = choices.size();
    while (unfinished > 0) {
      std::deque<Channel::Item> batch;
      {
        std::lock_guard<std::mutex> lock(channel->mutex);
        batch.swap(channel->items);
      }
      if (batch.empty()) {
        boost::system::error_code ec;
        co_await channel->wake.async_wait(net::redirect_error(use_awaitable, ec));
        continue;
      }
      for (Channel::Item& item : batch) {
        const size_t ci = item.prompt * n + static_cast<size_t>(item.out.index);
        Choice& c = choices.at(ci);
        if (c.finished) continue;  // ended by a stop string: later tokens are dropped
        const Delta d = apply_output(c, item, ids[item.prompt]);
        const std::string& new_text = d.content;
        const std::string& reasoning_delta = d.reasoning;
        const json& new_logprobs = d.logprobs;
        if (g.stream) {
          if (endpoint == ApiEndpoint::kChat && !c.role_sent) {
            c.role_sent = true;
            const std::string event = sse(chunk_of(ci, role_delta(), nullptr, nullptr));
            co_await send_event(*conn, event, stream_ok, ids);
          }
          const bool has_delta = !new_text.empty() || !reasoning_delta.empty() || !new_logprobs.empty();
          if (has_delta) {
            json lp = nullptr;
            if (g.logprobs) {
              lp = endpoint == ApiEndpoint::kChat ? json{{"content", new_logprobs}}
                                                  : completion_logprobs(new_logprobs);
            }
            json delta;
            if (endpoint == ApiEndpoint::kChat) {
              delta = json::object();
              if (!reasoning_delta.empty()) delta["reasoning_content"] = reasoning_delta;
              if (!new_text.empty() || reasoning_delta.empty()) delta["content"] = new_text;
            } else {
              delta = new_text;
            }
            const std::string event = sse(chunk_of(ci, delta, lp, nullptr));
            co_await send_event(*conn, event, stream_ok, ids);
          }
          if (c.finished && c.error.empty()) {
            const std::string event = sse(chunk_of(
                ci, endpoint == ApiEndpoint::kChat ? json::object() : json(""), nullptr, c.finish_reason));
            co_await send_event(*conn, event, stream_ok, ids);
          }
        }
        if (c.finished) {
          --unfinished;
          record(c, arrival, item.out.first_scheduled, static_cast<int64_t>(prompts[item.prompt].size()));
        }
      }
    }
    *stop_watch = true;
    boost::system::error_code ignored;
    if (conn->socket.is_open()) conn->socket.cancel(ignored);  // ends the disconnect watch
    for (RequestId rid : ids) active.erase(rid);

    int64_t completion_tokens = 0;
    for (const auto& c : choices) completion_tokens += static_cast<int64_t>(c.ids.size());
    const json usage = {{"prompt_tokens", total_prompt_tokens},
                        {"completion_tokens", completion_tokens},
                        {"total_tokens", total_prompt_tokens + completion_tokens}};
    // An engine-side failure (e.g. more KV than exists) is the request's error.
    for (const auto& c : choices) {
      if (!c.error.empty()) {
        if (g.stream) {
          if (stream_ok && !conn->client_gone) {
            const std::string event = sse(stream_error(c.error));
            co_await send_event(*conn, event, stream_ok, ids);
            co_return co_await finish_stream(*conn, stream_ok);
          }
          co_return false;
        }
        Response res = error_response(req, ApiError{400, c.error, "invalid_request_error", "", ""});
        co_return co_await send(*conn, res);
      }
    }
    if (conn->client_gone) co_return false;
    if (g.stream) {
      if (g.include_usage) {
        const std::string event = sse(usage_event(id_str, chunk_object, created, usage));
        co_await send_event(*conn, event, stream_ok, ids);
      }
      co_return co_await finish_stream(*conn, stream_ok);
    }
    json out_choices = json::array();
    for (size_t i = 0; i < choices.size(); ++i) {
      Choice& c = choices[i];
      json lp = nullptr;
      if (g.logprobs)
        lp = endpoint == ApiEndpoint::kChat ? json{{"content", c.logprobs}} : completion_logprobs(c.logprobs);
      if (endpoint == ApiEndpoint::kChat) {
        json message = {{"role", "assistant"}, {"content", c.text}};
        if (c.splitter)
          message["reasoning_content"] = c.reasoning.empty() ? json(nullptr) : json(c.reasoning);
        out_choices.push_back(
            {{"index", i}, {"message", message}, {"logprobs", lp}, {"finish_reason", c.finish_reason}});
      } else {
        out_choices.push_back(
            {{"index", i}, {"text", c.text}, {"logprobs", lp}, {"finish_reason", c.finish_reason}});
      }
    }
    json body = {{"id", id_str},           {"object", object},
                 {"created", created},     {"model", options.served_model_name},
                 {"choices", out_choices}, {"usage", usage}};
    Response res = make_response(req, http::status::ok, dump(body));
    co_return co_await send(*conn, res);
  }

  static json role_delta() { return json{{"role", "assistant"}, {"content", ""}}; }
  static json stream_error(const std::string& message) {
    return json{
        {"error", json::parse(error_body(ApiError{400, message, "invalid_request_error", "", ""}))["error"]}};
  }
  json usage_event(const std::string& id, const char* object, int64_t created, const json& usage) const {
    return json{{"id", id},
                {"object", object},
                {"created", created},
                {"model", options.served_model_name},
                {"choices", json::array()},
                {"usage", usage}};
  }

  // Completions' logprobs shape from chat-style entries.
  static json completion_logprobs(const json& entries) {
    json tokens = json::array(), lps = json::array(), tops = json::array();
    for (const auto& e : entries) {
      tokens.push_back(e["token"]);
      lps.push_back(e["logprob"]);
      json top = json::object();
      for (const auto& t : e["top_logprobs"]) top[t["token"].get<std::string>()] = t["logprob"];
      tops.push_back(top);
    }
    return json{{"tokens", tokens}, {"token_logprobs", lps}, {"top_logprobs", tops}};
  }

  // Writes one SSE event; on failure the client is treated as gone and `ids` are aborted.
  awaitable<void> send_event(Connection& conn, const std::string& data, bool& ok,
                             const std::vector<RequestId>& ids) {
    if (!ok || conn.client_gone) co_return;
    conn.expire_after(options.write_timeout_seconds);
    boost::system::error_code ec;
    if (conn.chunked_stream) {
      co_await net::async_write(conn.socket, http::make_chunk(net::buffer(data)),
                                net::redirect_error(use_awaitable, ec));
    } else {
      co_await net::async_write(conn.socket, net::buffer(data), net::redirect_error(use_awaitable, ec));
    }
    conn.never_expire();
    if (ec) {
      ok = false;
      conn.client_gone = true;
      for (RequestId rid : ids) ctx.engine->abort(rid);
    }
  }

  static std::string sse(const json& chunk) { return "data: " + dump(chunk) + "\n\n"; }

  awaitable<bool> finish_stream(Connection& conn, bool ok) {
    if (!ok || conn.client_gone) co_return false;
    const std::string done = "data: [DONE]\n\n";
    conn.expire_after(options.write_timeout_seconds);
    boost::system::error_code ec;
    if (!conn.chunked_stream) {  // HTTP/1.0: the close ends the body
      co_await net::async_write(conn.socket, net::buffer(done), net::redirect_error(use_awaitable, ec));
      conn.never_expire();
      co_return false;
    }
    co_await net::async_write(conn.socket, http::make_chunk(net::buffer(done)),
                              net::redirect_error(use_awaitable, ec));
    if (!ec)
      co_await net::async_write(conn.socket, http::make_chunk_last(), net::redirect_error(use_awaitable, ec));
    conn.never_expire();
    co_return !ec;
  }

  void record(const Choice& c, Clock::time_point arrival, Clock::time_point first_scheduled,
              int64_t prompt_tokens) {
    RequestTimings t;
    const auto end = Clock::now();
    const bool scheduled = first_scheduled != Clock::time_point{};
    t.queue_seconds = seconds((scheduled ? first_scheduled : end) - arrival);
    t.has_first_token = !c.ids.empty();
    if (t.has_first_token) {
      t.ttft_seconds = seconds(c.first_token - arrival);
      t.prefill_seconds = seconds(c.first_token - (scheduled ? first_scheduled : arrival));
      t.decode_seconds = seconds(c.last_token - c.first_token);
    }
    t.e2e_seconds = seconds(end - arrival);
    t.prompt_tokens = prompt_tokens;
    t.generation_tokens = static_cast<int64_t>(c.ids.size());
    t.finished_reason = c.error.empty() ? c.finish_reason : "error";
    metrics->observe_finished(t);
  }

  // Waits until the client's side of the socket reports end of stream (it hung up) while the
  // request is in flight; then aborts the request's engine requests and wakes the handler.
  awaitable<void> watch_disconnect(std::shared_ptr<Connection> conn, std::shared_ptr<Channel> channel,
                                   std::vector<RequestId> ids, std::shared_ptr<bool> stop) {
    for (;;) {
      boost::system::error_code ec;
      co_await conn->socket.async_wait(tcp::socket::wait_read, net::redirect_error(use_awaitable, ec));
      if (*stop || !conn->socket.is_open()) co_return;
      if (ec) {
        if (ec == net::error::operation_aborted) co_return;
      } else {
        char byte;
        const ssize_t got = ::recv(conn->socket.native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
        if (got > 0) co_return;  // a pipelined request, not a hang-up: stop watching
        if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) continue;
      }
      conn->client_gone = true;
      for (RequestId id : ids) ctx.engine->abort(id);
      channel->wake.cancel();
      co_return;
    }
  }

  // ---- shutdown -----------------------------------------------------------------------------

  awaitable<void> on_signal() {
    boost::system::error_code ec;
    co_await signals.async_wait(net::redirect_error(use_awaitable, ec));
    if (ec) co_return;
    std::fprintf(stderr, "inferd: shutting down: draining %zu requests (grace %.0f s)\n", active.size(),
                 options.shutdown_grace_seconds);
    draining = true;
    acceptor.close(ec);
    net::steady_timer timer(io);
    const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                             std::chrono::duration<double>(options.shutdown_grace_seconds));
    while (!active.empty() && Clock::now() < deadline) {
      timer.expires_after(std::chrono::milliseconds(50));
      co_await timer.async_wait(net::redirect_error(use_awaitable, ec));
    }
    if (!active.empty()) {
      std::fprintf(stderr, "inferd: grace period over: aborting %zu requests\n", active.size());
      for (RequestId id : active) ctx.engine->abort(id);
      const auto hard = Clock::now() + std::chrono::seconds(5);
      while (!active.empty() && Clock::now() < hard) {
        timer.expires_after(std::chrono::milliseconds(20));
        co_await timer.async_wait(net::redirect_error(use_awaitable, ec));
      }
    }
    // Let the last responses flush.
    timer.expires_after(std::chrono::milliseconds(100));
    co_await timer.async_wait(net::redirect_error(use_awaitable, ec));
    io.stop();
  }
};

HttpServer::HttpServer(ServerOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {}
HttpServer::~HttpServer() = default;

Status HttpServer::listen() {
  boost::system::error_code ec;
  const auto address = net::ip::make_address(impl_->options.host, ec);
  if (ec) return invalid_argument("--host " + impl_->options.host + ": not an IP address");
  const tcp::endpoint endpoint(address, impl_->options.port);
  impl_->acceptor.open(endpoint.protocol(), ec);
  if (!ec) impl_->acceptor.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) impl_->acceptor.bind(endpoint, ec);
  if (!ec) impl_->acceptor.listen(net::socket_base::max_listen_connections, ec);
  if (ec)
    return invalid_argument("cannot listen on " + impl_->options.host + ":" +
                            std::to_string(impl_->options.port) + ": " + ec.message());
  return Status::ok();
}

uint16_t HttpServer::port() const {
  return impl_->acceptor.local_endpoint().port();
}

void HttpServer::set_ready(const ServingContext& context) {
  net::post(impl_->io, [impl = impl_.get(), context] {
    impl->ctx = context;
    impl->metrics = std::make_unique<ServerMetrics>(impl->options.metrics_prefix,
                                                    impl->options.served_model_name, context.max_model_len);
    impl->ready = true;
  });
}

void HttpServer::set_failed(const std::string& message) {
  net::post(impl_->io, [impl = impl_.get(), message] {
    std::fprintf(stderr, "inferd: error: %s\n", message.c_str());
    impl->exit_code = 1;
    impl->io.stop();
  });
}

int HttpServer::run() {
  std::signal(SIGPIPE, SIG_IGN);
  net::co_spawn(impl_->io, impl_->accept_loop(), net::detached);
  net::co_spawn(impl_->io, impl_->on_signal(), net::detached);
  impl_->io.run();
  return impl_->exit_code;
}

}  // namespace inferd
