#include "server/http_server.h"

// Asio allocates coroutine frames with its recycling allocator (::operator new of a larger size)
// and frees them through the matching static operator delete; once GCC 12 inlines both at -O2 it
// reports the pair as mismatched. A false positive about Asio's internals, silenced here only.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif

#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <deque>
#include <mutex>
#include <optional>
#include <random>
#include <type_traits>
#include <unordered_map>
#include <unordered_set>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "common/log.h"
#include "common/text.h"
#include "engine/beam_search.h"
#include "server/cross_encoder.h"
#include "server/metrics.h"
#include "server/openai_api.h"
#include "server/responses_api.h"
#include "server/triton_api.h"
#include "server/webui_assets.h"
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

uint64_t random_u64() {
  static thread_local std::mt19937_64 rng(std::random_device{}());
  return rng();
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

  // The items posted so far, once there is one (I/O thread).
  awaitable<std::deque<Item>> take() {
    for (;;) {
      std::deque<Item> out;
      {
        std::lock_guard<std::mutex> lock(mutex);
        out.swap(items);
      }
      if (!out.empty()) co_return out;
      boost::system::error_code ec;
      co_await wake.async_wait(net::redirect_error(use_awaitable, ec));
    }
  }
};

// The result of work done on another thread (the LoRA loader, an input worker) for one handler:
// the work's result is set and `wake` cancelled on the I/O thread.
template <class T>
struct LoaderWait {
  explicit LoaderWait(net::any_io_executor ex) : wake(ex) { wake.expires_at(Clock::time_point::max()); }
  std::optional<T> result;  // I/O thread only
  net::steady_timer wake;
};

}  // namespace

struct HttpServer::Impl {
  explicit Impl(ServerOptions o) : options(std::move(o)), io(1), acceptor(io), signals(io, SIGTERM, SIGINT) {}

  ServerOptions options;
  net::io_context io;
  tcp::acceptor acceptor;
  net::signal_set signals;
  net::thread_pool lora_loader{1};  // loads LoRA adapters that are not resident
  // Run the input side of generation requests (chat template, tokenizer, grammar compilation):
  // a large prompt or grammar takes up to seconds, during which the I/O thread goes on streaming.
  net::thread_pool input_workers{2};
  // I/O thread only from here on.
  bool ready = false;
  bool draining = false;
  int exit_code = 0;
  ServingContext ctx;
  std::unique_ptr<ServerMetrics> metrics;
  // The front end's input side, once the model is loaded; shared with the input workers.
  std::shared_ptr<const InputProcessor> inputs;
  std::unordered_set<RequestId> active;  // engine requests in flight
  // Beam searches in flight (each runs a changing set of engine requests of its own).
  std::unordered_set<std::shared_ptr<BeamSearch>> beam_searches;
  // Finished /v1/responses answers kept for previous_response_id and GET (input workers read it).
  std::shared_ptr<ResponseStore> stored_responses = std::make_shared<ResponseStore>(
      static_cast<size_t>(std::max<int64_t>(options.max_stored_responses, 0)));
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

  // Counts the error (metrics exist once the model is loaded).
  void count_error(int status) {
    if (metrics != nullptr) metrics->add_error_response(status);
  }

  Response error_response(const http::request<http::string_body>& req, const ApiError& e) {
    count_error(e.status);
    return make_response(req, static_cast<http::status>(e.status), error_body(e));
  }

  // Triton's error shape, {"error": message}, with `status`.
  Response triton_error(const http::request<http::string_body>& req, int status, const std::string& message) {
    count_error(status);
    return make_response(req, static_cast<http::status>(status), triton_error_body(message));
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

  // The web UI file served at `target` ("/index.html" is "/"), or null.
  static const WebAsset* find_asset(const std::string& target) {
    const std::string_view path = target == "/index.html" ? std::string_view("/") : std::string_view(target);
    for (const WebAsset& a : webui_assets())
      if (a.path == path) return &a;
    return nullptr;
  }

  // Returns whether the connection may be kept.
  awaitable<bool> route(std::shared_ptr<Connection> conn, http::request<http::string_body>& req) {
    std::string target(req.target());
    if (auto q = target.find('?'); q != std::string::npos) target.resize(q);
    const bool get = req.method() == http::verb::get;
    const bool post = req.method() == http::verb::post;
    // Probes reach /health without a key (orchestrators send none); /metrics unless protected.
    // The web UI's files hold no secrets: the page asks for the key and sends it with its API calls.
    const WebAsset* asset = options.webui ? find_asset(target) : nullptr;
    const bool open_endpoint = target == "/health" || target == "/v2/health/live" ||
                               target == "/v2/health/ready" || asset != nullptr ||
                               (target == "/metrics" && !options.protect_metrics);
    if (!open_endpoint && !authorized(req)) {
      const ApiError e{401, "a valid API key is required (Authorization: Bearer ...)", "authentication_error",
                       "", "invalid_api_key"};
      Response res = parse_triton_target(target) && !pooling_endpoint(target)
                         ? triton_error(req, e.status, e.message)
                         : error_response(req, e);
      res.set(http::field::www_authenticate, "Bearer");
      co_return co_await send(*conn, res);
    }
    auto method_not_allowed = [&]() -> awaitable<bool> {
      Response res = error_response(
          req, ApiError{405, "method not allowed for " + target, "invalid_request_error", "", ""});
      co_return co_await send(*conn, res);
    };
    if (asset != nullptr) {
      if (!get) co_return co_await method_not_allowed();
      Response res =
          make_response(req, http::status::ok, std::string(asset->body), asset->content_type.data());
      res.set(http::field::cache_control, "no-cache");
      // Only this server's own scripts, styles and API: no inline code, no other origin.
      res.set("Content-Security-Policy", "default-src 'self'; frame-ancestors 'none'");
      res.set("X-Content-Type-Options", "nosniff");
      co_return co_await send(*conn, res);
    }
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
    if (std::optional<TritonRoute> v2 = parse_triton_target(target); v2 && !pooling_endpoint(target))
      co_return co_await triton_request(conn, req, *v2);
    const bool lora_admin = target == "/v1/load_lora_adapter" || target == "/v1/unload_lora_adapter";
    const bool known = target == "/v1/models" || target == "/v1/chat/completions" ||
                       target == "/v1/completions" || target == "/tokenize" || target == "/detokenize" ||
                       target == "/v1/embeddings" || pooling_endpoint(target).has_value() || lora_admin ||
                       target == "/v1/responses" || target.rfind("/v1/responses/", 0) == 0;
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
      const int64_t now = unix_now();
      json models = json::array({json{{"id", options.served_model_name},
                                      {"object", "model"},
                                      {"created", now},
                                      {"owned_by", "inferd"},
                                      {"root", options.served_model_name},
                                      {"parent", nullptr},
                                      {"max_model_len", ctx.max_model_len}}});
      if (ctx.lora != nullptr) {
        for (const LoraModuleInfo& m : ctx.lora->list())  // as vLLM lists them: root = path
          models.push_back({{"id", m.name},
                            {"object", "model"},
                            {"created", now},
                            {"owned_by", "inferd"},
                            {"root", m.path},
                            {"parent", options.served_model_name},
                            {"max_model_len", ctx.max_model_len}});
      }
      Response res = make_response(req, http::status::ok, json{{"object", "list"}, {"data", models}}.dump());
      co_return co_await send(*conn, res);
    }
    if (target.rfind("/v1/responses/", 0) == 0) co_return co_await stored_response(*conn, req, target);
    if (!post) co_return co_await method_not_allowed();
    if (ctx.classifier != nullptr &&
        (target == "/v1/responses" || target == "/v1/chat/completions" || target == "/v1/completions")) {
      Response res = error_response(req, classifier_refusal());
      co_return co_await send(*conn, res);
    }
    if (target == "/v1/responses") co_return co_await generate(conn, req, ApiEndpoint::kChat, nullptr, true);
    if (lora_admin) co_return co_await lora_admin_request(*conn, req, target == "/v1/load_lora_adapter");
    if (target == "/tokenize") co_return co_await tokenize(*conn, req);
    if (target == "/detokenize") co_return co_await detokenize(*conn, req);
    if (target == "/v1/embeddings") co_return co_await embed(conn, req, EmbeddingEndpoint::kEmbeddings);
    if (std::optional<EmbeddingEndpoint> e = pooling_endpoint(target))
      co_return co_await embed(conn, req, *e);
    co_return co_await generate(
        conn, req, target == "/v1/chat/completions" ? ApiEndpoint::kChat : ApiEndpoint::kCompletion);
  }

  // GET /v1/responses/{id} (the stored response), GET /v1/responses/{id}/input_items, DELETE
  // /v1/responses/{id}; POST /v1/responses/{id}/cancel answers that only background responses
  // (which this server does not run) can be cancelled.
  awaitable<bool> stored_response(Connection& conn, const http::request<http::string_body>& req,
                                  const std::string& target) {
    std::string id = target.substr(std::string("/v1/responses/").size());
    std::string what;
    if (auto slash = id.find('/'); slash != std::string::npos) {
      what = id.substr(slash + 1);
      id.resize(slash);
    }
    const http::verb verb = req.method();
    const bool allowed = what.empty()            ? verb == http::verb::get || verb == http::verb::delete_
                         : what == "input_items" ? verb == http::verb::get
                         : what == "cancel"      ? verb == http::verb::post
                                                 : true;
    Response res;
    std::optional<json> found = stored_responses->response(id);
    if (what != "" && what != "input_items" && what != "cancel") {
      res = error_response(
          req, ApiError{404, "no such endpoint: " + target, "invalid_request_error", "", "not_found"});
    } else if (!allowed) {
      res = error_response(
          req, ApiError{405, "method not allowed for " + target, "invalid_request_error", "", ""});
    } else if (!found) {
      res = error_response(req, ApiError{404, "no stored response with id '" + id + "'",
                                         "invalid_request_error", "response_id", "not_found"});
    } else if (what == "cancel") {
      res = error_response(
          req, ApiError{400, "only background responses can be cancelled, and '" + id + "' has finished",
                        "invalid_request_error", "response_id", ""});
    } else if (what == "input_items") {
      json items = stored_responses->input_items(id).value_or(json::array());
      json body = {{"object", "list"},
                   {"data", items},
                   {"first_id", items.empty() ? json() : items.front()["id"]},
                   {"last_id", items.empty() ? json() : items.back()["id"]},
                   {"has_more", false}};
      res = make_response(req, http::status::ok, body.dump(-1, ' ', false, json::error_handler_t::replace));
    } else if (verb == http::verb::delete_) {
      stored_responses->erase(id);
      res = make_response(req, http::status::ok,
                          json{{"id", id}, {"object", "response"}, {"deleted", true}}.dump());
    } else {
      res = make_response(req, http::status::ok, found->dump(-1, ' ', false, json::error_handler_t::replace));
    }
    co_return co_await send(conn, res);
  }

  // The KServe v2 / Triton endpoints (server/triton_api.h): health, model metadata and readiness,
  // and the generate extension, run as a completions request answered in Triton's shapes.
  awaitable<bool> triton_request(std::shared_ptr<Connection> conn, http::request<http::string_body>& req,
                                 const TritonRoute& route) {
    using K = TritonRoute::Kind;
    const bool get = req.method() == http::verb::get;
    const bool generate_kind = route.kind == K::kGenerate || route.kind == K::kGenerateStream;
    Response res;
    if (route.kind == K::kUnknown) {
      res = triton_error(req, 404, "no such endpoint: " + std::string(req.target()));
    } else if (generate_kind ? req.method() != http::verb::post : !get) {
      res = triton_error(req, 405, "method not allowed for " + std::string(req.target()));
    } else if (route.kind == K::kLive) {
      res = make_response(req, http::status::ok, "{\"live\":true}");
    } else if (route.kind == K::kReady) {
      res = make_response(req, ready ? http::status::ok : http::status::service_unavailable,
                          ready ? "{\"ready\":true}" : "{\"ready\":false}");
    } else if (route.kind == K::kServerMetadata) {
      res = make_response(req, http::status::ok, triton_server_metadata(options.version));
    } else if (route.model != options.served_model_name &&
               (ctx.lora == nullptr || !ctx.lora->contains(route.model))) {
      res = triton_error(
          req, 404,
          "unknown model '" + route.model + "' (this server serves '" + options.served_model_name + "')");
    } else if (!route.version.empty() && route.version != kTritonModelVersion) {
      res = triton_error(req, 404,
                         "unknown version '" + route.version + "' of model '" + route.model +
                             "' (the only version is " + kTritonModelVersion + ")");
    } else if (route.kind == K::kModelReady) {
      res = make_response(req, ready ? http::status::ok : http::status::service_unavailable,
                          json{{"name", route.model}, {"ready", ready}}.dump());
    } else if (route.kind == K::kModelMetadata) {
      res = make_response(req, http::status::ok, triton_model_metadata(route.model));
    } else if (!ready) {
      res = triton_error(req, 503, not_ready_error(exit_code != 0).message);
    } else if (ctx.classifier != nullptr) {
      res = triton_error(req, 400, classifier_refusal().message);
    } else {
      // Its body becomes a completions body on the input worker (generate()).
      TritonAnswer answer{route.model, "", route.kind == K::kGenerateStream};
      TritonAnswer* triton = &answer;
      const ApiEndpoint endpoint = ApiEndpoint::kCompletion;
      co_return co_await generate(conn, req, endpoint, triton);
    }
    co_return co_await send(*conn, res);
  }

  void refresh_gauges() {
    const auto blocks = ctx.engine->num_blocks();
    const double usage =
        blocks > 0 ? static_cast<double>(blocks - ctx.engine->num_free_blocks()) / static_cast<double>(blocks)
                   : 0.0;
    metrics->set_scheduler_state(ctx.engine->num_running(), ctx.engine->num_waiting(), usage);
    metrics->set_batch_window(ctx.engine->batch_window_seconds(), ctx.engine->arrival_rate());
    metrics->set_preemptions(ctx.engine->num_preemptions());
    metrics->set_prefix_cache(ctx.engine->prefix_query_tokens(), ctx.engine->prefix_hit_tokens());
    metrics->set_sessions(ctx.engine->num_sessions(), ctx.engine->num_pinned_blocks());
    metrics->set_revived_blocks(ctx.engine->num_revived_blocks());
    if (ctx.lora != nullptr) metrics->set_lora_residency(ctx.lora->num_resident(), ctx.lora->max_loras());
    if (const KvOffloader* o = ctx.engine->offloader()) {
      std::vector<OffloadTierFigures> tiers;
      for (const auto& tier : o->tiers()) {
        const KvTierStats& st = tier->stats();
        tiers.push_back({tier->name(), st.writes.load(), st.write_bytes.load(), st.reads.load(),
                         st.read_bytes.load(), st.failures.load(), st.corrupt.load(), tier->up()});
      }
      metrics->set_offload(tiers, o->num_dropped_writes());
    }
    metrics->set_kv_loads(ctx.engine->num_kv_load_failures(), ctx.engine->num_kv_load_timeouts());
    metrics->set_spec_decode(ctx.engine->num_spec_drafts(), ctx.engine->num_spec_draft_tokens(),
                             ctx.engine->num_spec_accepted_tokens());
    auto transfer = [&](const char* side, const KvTransferStats& st) {
      metrics->set_transfer({side, st.pulls.load(), st.blocks.load(), st.bytes.load(), st.failures.load(),
                             st.corrupt.load(), st.micros.load()});
    };
    if (ctx.kv_server_stats != nullptr) transfer("prefill", *ctx.kv_server_stats);
    if (const KvTransferStats* st = ctx.engine->remote_kv_stats()) transfer("decode", *st);
    if (ctx.kv_export != nullptr) {
      const KvExportStats& e = ctx.kv_export->stats();
      metrics->set_kv_export(ctx.kv_export->num_entries(), ctx.kv_export->bytes(), e.expired.load(),
                             e.refused.load());
    }
  }

  // ---- /tokenize, /detokenize ---------------------------------------------------------------

  // ---- /v1/load_lora_adapter, /v1/unload_lora_adapter (vLLM's bodies and answers) ------------

  // The error of a LoRA admin request, or nullopt with the adapter's name (and path) in `out`.
  std::optional<ApiError> parse_lora_admin(const std::string& body, bool load, std::string* name,
                                           std::string* path, bool* replace) const {
    auto bad = [](const std::string& m, const char* param) {
      return ApiError{400, m, "invalid_request_error", param, ""};
    };
    if (ctx.lora == nullptr)
      return bad("LoRA adapters are not enabled (start the server with --enable-lora)", "");
    if (json_nests_deeper_than(body))
      return bad("the request body nests arrays and objects deeper than " + std::to_string(kMaxJsonDepth) +
                     " levels",
                 "");
    json j = json::parse(body, nullptr, false);
    if (!j.is_object()) return bad("the body must be a JSON object", "");
    for (const auto& [key, value] : j.items()) {
      if (key != "lora_name" && !(load && (key == "lora_path" || key == "load_inplace")))
        return bad("unknown field '" + key + "'", key.c_str());
    }
    if (!j.contains("lora_name") || !j["lora_name"].is_string() || j["lora_name"].get<std::string>().empty())
      return bad("'lora_name' (a non-empty string) is required", "lora_name");
    *name = j["lora_name"].get<std::string>();
    if (load) {
      if (!j.contains("lora_path") || !j["lora_path"].is_string() ||
          j["lora_path"].get<std::string>().empty())
        return bad("'lora_path' (a non-empty string) is required", "lora_path");
      *path = j["lora_path"].get<std::string>();
      if (j.contains("load_inplace") && !j["load_inplace"].is_boolean())
        return bad("'load_inplace' must be a boolean", "load_inplace");
      // load_inplace: replace an adapter of that name once the new one loaded (vLLM); otherwise
      // a taken name is an error.
      *replace = j.value("load_inplace", false);
    }
    return std::nullopt;
  }

  // Starts `work` on `pool` (the LoRA loader: adapter files are read and checked; an input
  // worker: a request's input side) while the I/O thread and the engine go on; its result lands
  // in the returned wait, on the I/O thread.
  template <class F>
  std::shared_ptr<LoaderWait<std::invoke_result_t<F>>> start_on(net::thread_pool& pool, F work) {
    using T = std::invoke_result_t<F>;
    auto wait = std::make_shared<LoaderWait<T>>(io.get_executor());
    net::post(pool, [wait, work = std::move(work)]() mutable {
      T result = work();
      net::post(wait->wake.get_executor(), [wait, result = std::move(result)]() mutable {
        wait->result.emplace(std::move(result));
        wait->wake.cancel();
      });
    });
    return wait;
  }
  // Resumes once `wait` holds its result.
  template <class T>
  static awaitable<void> until_done(LoaderWait<T>& wait) {
    while (!wait.result) {
      boost::system::error_code ec;
      co_await wait.wake.async_wait(net::redirect_error(use_awaitable, ec));
    }
  }

  awaitable<bool> lora_admin_request(Connection& conn, const http::request<http::string_body>& req,
                                     bool load) {
    std::string name, path;
    bool replace = false;
    std::optional<ApiError> error = parse_lora_admin(req.body(), load, &name, &path, &replace);
    if (!error) {
      // The files are read and checked on the loader thread: neither the I/O thread nor the
      // engine waits for them.
      auto wait = start_on(
          lora_loader, [registry = ctx.lora, load, replace, name, path, base = options.served_model_name] {
            return load ? registry->add(name, path, base, replace) : registry->remove(name);
          });
      co_await until_done(*wait);
      const Status s = *wait->result;
      if (!s.is_ok())
        error = ApiError{s.code() == StatusCode::kNotFound && !load ? 404 : 400, s.message(),
                         "invalid_request_error", load ? "lora_path" : "lora_name", ""};
      else
        log_info(std::string(load ? "LoRA adapter loaded: " : "LoRA adapter unloaded: ") + name +
                 (load ? " (" + path + ")" : ""));
    }
    if (error) {
      Response res = error_response(req, *error);
      co_return co_await send(conn, res);
    }
    const std::string text =
        "Success: LoRA adapter '" + name + "' " + (load ? "added" : "removed") + " successfully.";
    Response res = make_response(req, http::status::ok, text, "text/plain; charset=utf-8");
    co_return co_await send(conn, res);
  }

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
    if (const GenerationRequest& chat = p.request->chat; !chat.messages.is_null()) {
      ChatPrompt prompt;
      if (auto e = inputs->render_chat(chat, !chat.tools.is_null(), &prompt)) {
        Response res = error_response(req, ApiError{400, e->message, "invalid_request_error", e->field, ""});
        co_return co_await send(conn, res);
      }
      ids = std::move(prompt.ids);
    } else {
      ids = p.request->add_special_tokens.value_or(true)
                ? ctx.tokenizer->encode_prompt(p.request->prompt, true)
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

  // ---- embeddings ---------------------------------------------------------------------------

  // The answer's id from the X-Request-Id header when the body named none; an error when the
  // header is not a request id.
  static std::optional<ApiError> take_request_id_header(const std::string& header, std::string* request_id) {
    if (!request_id->empty() || header.empty()) return std::nullopt;
    if (!is_request_id(header))
      return ApiError{400, "the X-Request-Id header must be 1-128 letters, digits or . _ : -",
                      "invalid_request_error", "X-Request-Id", ""};
    *request_id = header;
    return std::nullopt;
  }

  // What a classification model's server answers to a generation request (as vLLM's pooling
  // runner, it generates nothing).
  ApiError classifier_refusal() const {
    return ApiError{400,
                    "this server runs a classification model (its head: " + ctx.classifier->origin +
                        "); it serves /classify, /score, /rerank and /v1/embeddings, not generation",
                    "invalid_request_error", "model", ""};
  }
  CrossEncoder cross_encoder() const {
    return CrossEncoder{ctx.classifier, ctx.tokenizer, ctx.rerank_template, ctx.max_model_len};
  }

  // The endpoints answered from pooled final hidden states: embeddings, and (kClassify, and
  // kScore / kRerank of a classification model) a classifier head's logits.
  enum class EmbeddingEndpoint { kEmbeddings, kScore, kRerank, kClassify };
  // vLLM's paths: /score and /v1/score; /rerank, /v1/rerank and /v2/rerank (Jina's and Cohere's);
  // /classify and /v1/classify.
  static std::optional<EmbeddingEndpoint> pooling_endpoint(std::string_view target) {
    if (target == "/score" || target == "/v1/score") return EmbeddingEndpoint::kScore;
    if (target == "/rerank" || target == "/v1/rerank" || target == "/v2/rerank")
      return EmbeddingEndpoint::kRerank;
    if (target == "/classify" || target == "/v1/classify") return EmbeddingEndpoint::kClassify;
    return std::nullopt;
  }
  struct ReadEmbedding {
    std::optional<ApiError> error;
    EmbeddingRequest api;
    std::optional<ScoreRequest> score;  // kScore, kRerank: what to answer from the embeddings
    bool head = false;                  // the answer is read through the classifier head
    InputProcessed processed;
  };
  // On an input worker: parses the body and runs the input side with the server's pooling (a
  // classifier head reads the last token's state, unnormalized).
  static ReadEmbedding read_embedding(const InputProcessor& inputs, EmbeddingEndpoint endpoint,
                                      const std::string& body, const std::string& request_id_header,
                                      Pooling pooling, const CrossEncoder& cross) {
    ReadEmbedding out;
    if (endpoint == EmbeddingEndpoint::kEmbeddings || endpoint == EmbeddingEndpoint::kClassify) {
      ParsedEmbedding parsed = parse_embedding_request(body, endpoint == EmbeddingEndpoint::kClassify);
      if (!parsed.request) {
        out.error = parsed.error;
        return out;
      }
      out.api = std::move(*parsed.request);
    } else {
      ParsedScore parsed = parse_score_request(endpoint == EmbeddingEndpoint::kRerank, body);
      if (!parsed.request) {
        out.error = parsed.error;
        return out;
      }
      out.api = parsed.request->embedding;
      out.score = std::move(*parsed.request);
    }
    out.error = take_request_id_header(request_id_header, &out.api.request_id);
    if (out.error) return out;
    out.head = cross.head != nullptr && endpoint != EmbeddingEndpoint::kEmbeddings;
    if (endpoint == EmbeddingEndpoint::kClassify && cross.head == nullptr) {
      out.error =
          ApiError{400,
                   "this model has no classification head: /classify serves a sequence-classification "
                   "model (a *ForSequenceClassification checkpoint, a GGUF of pooling type rank, or "
                   "--hf-overrides with classifier_from_token)",
                   "invalid_request_error", "model", ""};
      return out;
    }
    if (out.score && !out.head && out.api.use_activation) {
      out.error = ApiError{
          400, "'use_activation' is for a classification model; this one scores by cosine similarity",
          "invalid_request_error", "use_activation", ""};
      return out;
    }
    if (out.score && out.head) {
      if (cross.head->score_rule == ClassifierHead::ScoreRule::kNone) {
        out.error =
            ApiError{400,
                     "the model's classifier has " + std::to_string(cross.head->num_labels()) +
                         " labels and no relevance score: /score and /rerank need a one-label head; use "
                         "/classify",
                     "invalid_request_error", "model", ""};
        return out;
      }
      out.error = make_pair_prompts(cross, &*out.score);
      if (out.error) return out;
      out.api.generation = out.score->embedding.generation;
    }
    GenerationRequest generation = out.api.generation;
    generation.pooling = out.head ? Pooling::kLast : pooling;
    generation.normalize_embedding = out.head ? false : out.api.normalize.value_or(true);
    out.processed = inputs.process(std::move(generation));
    if (!out.processed.input && out.processed.error.field == "prompt")
      out.processed.error.field =
          endpoint == EmbeddingEndpoint::kEmbeddings || endpoint == EmbeddingEndpoint::kClassify ? "input"
          : endpoint == EmbeddingEndpoint::kScore                                                ? "text_1"
                                                  : "documents";
    return out;
  }

  // The checks after the input side: the model, dimensions, the queue. An error or nothing.
  std::optional<ApiError> check_embedding(const ReadEmbedding& read) {
    const EmbeddingRequest& api = read.api;
    if (!api.model.empty() && api.model != options.served_model_name &&
        (ctx.lora == nullptr || !ctx.lora->contains(api.model)))
      return ApiError{404,
                      "the model '" + api.model + "' does not exist (this server serves '" +
                          options.served_model_name + "'" +
                          (ctx.lora != nullptr ? " and its LoRA adapters" : "") + ")",
                      "invalid_request_error", "model", "model_not_found"};
    if (!read.processed.input) return api_error(read.processed.error, ApiEndpoint::kCompletion);
    if (api.dimensions) {
      if (std::optional<std::string> why = check_dimensions(*api.dimensions, ctx.hidden_size, ctx.matryoshka))
        return ApiError{400, *why, "invalid_request_error", "dimensions", ""};
    }
    return check_queue(read.processed.input->num_sequences(), "input");
  }

  // The queue limit counts sequences (every prompt, times n): a request that needs more than the
  // server ever queues is a 400 naming `param`, one that does not fit now a 429.
  std::optional<ApiError> check_queue(int64_t sequences, const char* param) {
    if (sequences > options.max_queue)
      return ApiError{400,
                      "the request needs " + std::to_string(sequences) +
                          " sequences (prompts x n), more than " + "the server ever queues (" +
                          std::to_string(options.max_queue) + ")",
                      "invalid_request_error", param, ""};
    const int64_t queued = ctx.engine->num_queued_sequences();
    if (queued + sequences > options.max_queue)
      return ApiError{429,
                      "the server is at capacity (" + std::to_string(queued) + " of " +
                          std::to_string(options.max_queue) + " queue places taken, this request needs " +
                          std::to_string(sequences) + "); retry later",
                      "rate_limit_error", "", "queue_full"};
    return std::nullopt;
  }

  // POST /v1/embeddings: every input is one engine request that ends with its pooled final
  // hidden state (Pooling); the answer lists them in input order. /score and /rerank embed every
  // text the same way and answer the pairs' cosine similarities.
  awaitable<bool> embed(std::shared_ptr<Connection> conn, const http::request<http::string_body>& req,
                        EmbeddingEndpoint endpoint) {
    const auto arrival = Clock::now();
    std::string request_id_header;
    if (auto h = req.find("X-Request-Id"); h != req.end()) request_id_header = std::string(h->value());
    auto read = start_on(input_workers, [inputs = inputs, endpoint, body = req.body(), request_id_header,
                                         pooling = ctx.pooling, cross = cross_encoder()] {
      return read_embedding(*inputs, endpoint, body, request_id_header, pooling, cross);
    });
    co_await until_done(*read);
    ReadEmbedding& r = *read->result;
    std::optional<ApiError> error = r.error;
    if (!error) error = check_embedding(r);
    if (error) {
      Response res = error_response(req, *error);
      if (error->status == 429) res.set(http::field::retry_after, "1");
      co_return co_await send(*conn, res);
    }
    ProcessedInput& input = *r.processed.input;
    const bool adapter = !r.api.model.empty() && r.api.model != options.served_model_name;
    if (adapter) {  // a LoRA adapter's embeddings: loaded off the I/O thread when not resident
      auto wait = start_on(lora_loader,
                           [registry = ctx.lora, name = r.api.model] { return registry->acquire(name); });
      co_await until_done(*wait);
      const Expected<std::shared_ptr<const LoraAdapter>>& loaded = *wait->result;
      if (!loaded.has_value()) {
        const Status& s = loaded.status();
        const bool missing = s.code() == StatusCode::kNotFound;
        Response res = error_response(req, ApiError{missing ? 404 : 500, s.message(), "invalid_request_error",
                                                    "model", missing ? "model_not_found" : ""});
        co_return co_await send(*conn, res);
      }
      for (RequestSpec& spec : input.requests) spec.lora = loaded.value();
    }
    const size_t count = input.requests.size();
    auto channel = std::make_shared<Channel>(io.get_executor());
    const std::vector<RequestId> ids = submit(input, channel);
    metrics->add_prompt_tokens(input.num_prompt_tokens);
    auto stop_watch = std::make_shared<bool>(false);
    net::co_spawn(io, watch_disconnect(conn, channel, ids, {}, stop_watch), net::detached);
    std::vector<std::vector<float>> embeddings(count);
    std::string failure;
    bool internal = false;
    std::optional<Clock::time_point> first_scheduled;
    for (size_t unfinished = count; unfinished > 0;) {
      std::deque<Channel::Item> batch = co_await channel->take();
      for (Channel::Item& item : batch) {
        if (!item.out.embedding.empty()) embeddings.at(item.prompt) = std::move(item.out.embedding);
        if (item.out.first_scheduled && (!first_scheduled || *item.out.first_scheduled < *first_scheduled))
          first_scheduled = item.out.first_scheduled;
        if (!item.out.finished) continue;
        --unfinished;
        if (failure.empty() && !item.out.error.empty()) {
          failure = item.out.error;
          internal = item.out.internal;
        } else if (failure.empty() && embeddings[item.prompt].empty()) {
          failure = "the request was aborted";
        }
      }
    }
    *stop_watch = true;
    boost::system::error_code ignored;
    if (conn->socket.is_open()) conn->socket.cancel(ignored);  // ends the disconnect watch
    for (RequestId rid : ids) active.erase(rid);
    const char* prefix = endpoint == EmbeddingEndpoint::kEmbeddings ? "embd-"
                         : endpoint == EmbeddingEndpoint::kScore    ? "score-"
                         : endpoint == EmbeddingEndpoint::kRerank   ? "rerank-"
                                                                    : "classify-";
    const std::string id = r.api.request_id.empty() ? random_id(prefix) : prefix + r.api.request_id;
    RequestTimings t;
    const auto end = Clock::now();
    t.queue_seconds = seconds(first_scheduled.value_or(end) - arrival);
    t.e2e_seconds = seconds(end - arrival);
    t.prompt_tokens = input.num_prompt_tokens;
    t.finished_reason = failure.empty() ? "stop" : "error";
    metrics->observe_finished(t);
    std::vector<LogField> fields = {{"id", id},
                                    {"prompt_tokens", input.num_prompt_tokens},
                                    {"inputs", static_cast<int64_t>(count)},
                                    {"e2e_s", t.e2e_seconds}};
    if (!failure.empty()) fields.push_back({"error", failure});
    log_info("embedding finished", fields);
    if (conn->client_gone) co_return false;
    if (!failure.empty()) {
      Response res = error_response(req, internal ? ApiError{500, failure, "server_error", "", ""}
                                                  : ApiError{400, failure, "invalid_request_error", "", ""});
      co_return co_await send(*conn, res);
    }
    if (!r.head && r.api.dimensions &&
        *r.api.dimensions < ctx.hidden_size) {  // a Matryoshka model's shorter embedding
      for (std::vector<float>& v : embeddings)
        shorten_embedding(&v, *r.api.dimensions, r.api.normalize.value_or(true));
    }
    const std::string& model = adapter ? r.api.model : options.served_model_name;
    std::string body;
    if (r.head) {  // the states become the head's logits
      for (std::vector<float>& v : embeddings) v = ctx.classifier->logits(v);
      const bool activation = r.api.use_activation.value_or(true);
      body = r.score
                 ? score_body(id, model, *r.score, head_scores(*ctx.classifier, embeddings, activation),
                              input.num_prompt_tokens)
                 : classify_body(id, model, *ctx.classifier, embeddings, activation, input.num_prompt_tokens);
    } else {
      body = r.score ? score_body(id, model, *r.score, cosine_scores(*r.score, embeddings),
                                  input.num_prompt_tokens)
                     : embedding_body(id, model, embeddings, r.api.base64, input.num_prompt_tokens);
    }
    Response res = make_response(req, http::status::ok, body);
    co_return co_await send(*conn, res);
  }

  // ---- generation ---------------------------------------------------------------------------

  // The front end's refusal in OpenAI's terms.
  static ApiError api_error(const InputError& e, ApiEndpoint endpoint) {
    // Chat clients set the number of alternatives as top_logprobs.
    std::string param = endpoint == ApiEndpoint::kChat && e.field == "logprobs" ? "top_logprobs" : e.field;
    return ApiError{400, e.message, "invalid_request_error", std::move(param),
                    e.kind == InputError::Kind::kContextLength ? "context_length_exceeded" : ""};
  }

  // A request parsed and processed by the front end, ready to submit.
  // A Triton / KServe generate request (triton_request): answered in Triton's shapes.
  struct TritonAnswer {
    std::string model;    // as the URL names it
    std::string id;       // the request's "id", returned with the answer (set by generate())
    bool stream = false;  // generate_stream
  };

  struct Prepared {
    GenerateRequest api;
    ProcessedInput input;
    uint64_t kv_export_id = 0;            // prefill: the transfer id its answer names
    std::string lora_name;                // the adapter the request picked by `model` (empty: the base)
    int32_t slo_class = -1;               // its SLO class (-1: classes are off)
    int64_t retry_after_seconds = 1;      // a 429's Retry-After
    std::optional<double> ttft_estimate;  // SLO classes: the estimated TTFT it was admitted with
  };

  // The SLO class (the body's slo_class, else the X-SLO-Class header, else the class `priority`
  // maps to) onto the engine requests; refuses (429) a request whose class's time to first token
  // the current load would miss.
  std::optional<ApiError> apply_slo_class(const http::request<http::string_body>& req, Prepared* p) {
    const SloClasses& slo = ctx.engine->slo_classes();
    std::string name = p->api.slo_class;
    if (name.empty()) {
      if (auto h = req.find("X-SLO-Class"); h != req.end()) name = std::string(h->value());
    }
    if (slo.empty()) {
      if (name.empty()) return std::nullopt;
      return ApiError{400,
                      "slo_class '" + name + "': this server has no SLO classes (inferd serve --slo-class)",
                      "invalid_request_error", "slo_class", ""};
    }
    std::optional<size_t> c = name.empty() ? std::optional<size_t>() : slo.find(name);
    if (!name.empty() && !c)
      return ApiError{400,
                      "slo_class '" + name + "' is not one of this server's classes (" + slo.names() + ")",
                      "invalid_request_error", "slo_class", ""};
    if (!c) c = slo.class_of(-1, p->api.generation.priority);
    p->slo_class = static_cast<int32_t>(*c);
    int64_t tokens = 0;
    for (RequestSpec& spec : p->input.requests) {
      spec.slo_class = p->slo_class;
      tokens += static_cast<int64_t>(spec.prompt.size()) * num_finished_outputs(spec);
    }
    const SloClass& cls = slo.at(*c);
    if (!std::isfinite(cls.ttft_seconds)) return std::nullopt;
    const std::optional<double> wait = ctx.engine->estimated_ttft_seconds(*c, tokens);
    p->ttft_estimate = wait;
    if (!wait || *wait <= cls.ttft_seconds) return std::nullopt;
    metrics->observe_slo_refused(*c);
    p->retry_after_seconds = std::max<int64_t>(1, static_cast<int64_t>(std::ceil(*wait - cls.ttft_seconds)));
    char text[160];
    std::snprintf(text, sizeof text,
                  "the server can not meet the '%s' class's time to first token (%.3g s) at the current load "
                  "(estimated %.3g s); retry later",
                  cls.name.c_str(), cls.ttft_seconds, *wait);
    return ApiError{429, text, "rate_limit_error", "", "slo_unattainable"};
  }

  // kv_transfer_params onto the engine request (docs/disaggregation.md); an error when this
  // instance's role cannot serve it.
  std::optional<ApiError> apply_kv_transfer(Prepared* p) {
    const KvTransferParams& kv = *p->api.kv_transfer;
    auto refuse = [](const std::string& message) {
      return ApiError{400, message, "invalid_request_error", "kv_transfer_params", ""};
    };
    if (p->input.requests.size() != 1) return refuse("kv_transfer_params needs a single prompt");
    RequestSpec& spec = p->input.requests[0];
    if (kv.do_remote_decode) {
      if (ctx.kv_export == nullptr)
        return refuse(
            "kv_transfer_params.do_remote_decode needs an instance started with --role prefill (this one "
            "runs --role " +
            ctx.role + ")");
      if (spec.n != 1)
        return ApiError{400, "'n' must be 1 with kv_transfer_params", "invalid_request_error", "n", ""};
      spec.limits.max_tokens = 1;  // the first token; the decode instance samples the rest
      while (p->kv_export_id == 0) p->kv_export_id = random_u64();
      spec.kv_export_id = p->kv_export_id;
      return std::nullopt;
    }
    if (ctx.role != "decode")
      return refuse(
          "kv_transfer_params naming a prefill's KV needs an instance started with --role decode (this one "
          "runs --role " +
          ctx.role + ")");
    if (p->input.grammar || p->input.tool_calls)
      return refuse("kv_transfer_params cannot be combined with structured output or tools");
    spec.remote_kv = kv.remote;
    spec.first_token = kv.first_token;
    if (kv.remote->num_tokens != static_cast<int64_t>(spec.prompt.size()))
      log_warning("kv_transfer_params.num_tokens " + std::to_string(kv.remote->num_tokens) +
                  " but the prompt has " + std::to_string(spec.prompt.size()) +
                  " tokens here: computing it instead of pulling");
    return std::nullopt;
  }

  // The prefill answer's handle: where and what to pull (absent when the KV was not kept).
  std::optional<json> kv_handle(const Prepared& p, const std::vector<OutputProcessor>& choices) {
    int64_t blocks = 0, bytes = 0;
    if (p.kv_export_id == 0 || ctx.kv_export == nullptr || choices.empty() ||
        choices[0].token_ids().empty() || !ctx.kv_export->describe(p.kv_export_id, &blocks, &bytes))
      return std::nullopt;
    return json{{"remote_host", ctx.kv_host},
                {"remote_port", ctx.kv_port},
                {"transfer_id", transfer_id_text(p.kv_export_id)},
                {"num_tokens", p.input.num_prompt_tokens},
                {"first_token", choices[0].token_ids()[0]},
                {"num_blocks", blocks},
                {"bytes", bytes},
                {"lease_seconds", ctx.kv_export->lease_seconds()}};
  }

  // Preparing a generation request, in three steps (plain functions: no temporaries cross a
  // co_await, see generate()): on an input worker, read_generate() parses the body and runs the
  // input side (validation, template, tokenizer, context window, grammar); then, on the I/O
  // thread, check_model() picks the model (a 404 before any error of the input side, as if it ran
  // first) and finish_generate() applies the KV transfer, the queue limit and the SLO class. The I/O
  // thread never parses a body: megabytes of JSON (a large guided_choice or schema) took it
  // hundreds of milliseconds, and every stream stood still meanwhile.
  struct ReadGeneration {
    std::optional<ApiError> error;  // the body did not parse
    GenerateRequest api;
    InputProcessed processed;
    std::string triton_id;                      // a Triton body's "id"
    std::optional<ResponsesRequest> responses;  // a /v1/responses body
  };
  // `triton`: the body is a Triton generate body for that model (triton_to_completion()).
  static ReadGeneration read_generate(const InputProcessor& inputs, ApiEndpoint endpoint,
                                      const std::string& body, const std::string& session_header,
                                      const std::string& request_id_header,
                                      const std::optional<TritonAnswer>& triton,
                                      const std::shared_ptr<const ResponseStore>& responses) {
    ReadGeneration out;
    std::string completion;
    if (triton) {
      Expected<json> converted = triton_to_completion(body, triton->model, triton->stream, &out.triton_id);
      if (!converted) {
        out.error = ApiError{400, converted.status().message(), "invalid_request_error", "", ""};
        return out;
      }
      completion = converted->dump();
    }
    if (responses) {
      ParsedResponses parsed = parse_responses_request(
          body, [&responses](const std::string& id) { return responses->conversation(id); });
      if (!parsed.request) {
        out.error = parsed.error;
        return out;
      }
      out.api = parsed.request->generate;
      out.responses = std::move(parsed.request);
    } else {
      ParsedRequest parsed = parse_generate_request(endpoint, triton ? completion : body);
      if (!parsed.request) {
        out.error = parsed.error;
        return out;
      }
      out.api = std::move(*parsed.request);
    }
    // The answer's id: the body's request_id, or the X-Request-Id header.
    out.error = take_request_id_header(request_id_header, &out.api.request_id);
    if (out.error) return out;
    GenerationRequest generation = out.api.generation;
    // The session context pool: the body's session_id, or the header.
    if (generation.session_id.empty()) generation.session_id = session_header;
    out.processed = inputs.process(std::move(generation));
    return out;
  }

  std::optional<ApiError> check_model(ReadGeneration& read, Prepared* out) {
    out->api = std::move(read.api);
    const GenerateRequest& api = out->api;
    if (!api.model.empty() && api.model != options.served_model_name) {
      if (ctx.lora == nullptr || !ctx.lora->contains(api.model))
        return ApiError{404,
                        "the model '" + api.model + "' does not exist (this server serves '" +
                            options.served_model_name + "'" +
                            (ctx.lora != nullptr ? " and its LoRA adapters" : "") + ")",
                        "invalid_request_error", "model", "model_not_found"};
      out->lora_name = api.model;
    }
    return std::nullopt;
  }

  std::optional<ApiError> finish_generate(ApiEndpoint endpoint, const http::request<http::string_body>& req,
                                          InputProcessed& processed, Prepared* out) {
    if (!processed.input) return api_error(processed.error, endpoint);
    out->input = std::move(*processed.input);
    const GenerateRequest& api = out->api;
    if (api.kv_transfer) {
      if (std::optional<ApiError> e = apply_kv_transfer(out)) return e;
    }
    if (std::optional<ApiError> e =
            check_queue(out->input.num_sequences(), endpoint == ApiEndpoint::kChat ? "n" : "prompt"))
      return e;
    return apply_slo_class(req, out);
  }

  // Submits every prompt of the request; outputs flow into `channel`. Returns the engine ids.
  std::vector<RequestId> submit(ProcessedInput& input, const std::shared_ptr<Channel>& channel) {
    std::vector<RequestId> ids;
    auto ex = io.get_executor();
    for (size_t p = 0; p < input.requests.size(); ++p) {
      const RequestId id =
          ctx.engine->submit(std::move(input.requests[p]), [channel, p, ex](const StepOutput& out) {
            {
              std::lock_guard<std::mutex> lock(channel->mutex);
              channel->items.push_back({p, out, Clock::now()});
            }
            net::post(ex, [channel] { channel->wake.cancel(); });
          });
      ids.push_back(id);
      active.insert(id);
    }
    return ids;
  }

  // Beam search instead of submitting: one BeamSearch per prompt; at its end each beam becomes
  // one finished output of its prompt (index = rank), as if the engine had sampled it.
  std::vector<std::shared_ptr<BeamSearch>> start_beam_searches(ProcessedInput& input, float length_penalty,
                                                               const std::shared_ptr<Channel>& channel) {
    std::vector<std::shared_ptr<BeamSearch>> searches;
    auto ex = io.get_executor();
    AsyncEngine* engine = ctx.engine;
    for (size_t p = 0; p < input.requests.size(); ++p) {
      RequestSpec& spec = input.requests[p];
      BeamSearchParams params;
      params.width = spec.n;
      params.max_tokens = spec.limits.max_tokens;
      params.length_penalty = length_penalty;
      if (!spec.limits.ignore_eos) params.stop_token_ids = spec.limits.stop_token_ids;
      params.logprobs = spec.sampling.logprobs;
      const int32_t width = spec.n;
      auto done = [channel, p, ex, width](std::vector<Beam> beams, const std::string& error, bool internal) {
        {
          std::lock_guard<std::mutex> lock(channel->mutex);
          for (int32_t k = 0; k < width; ++k) {
            StepOutput out;
            out.index = k;
            out.finished = true;
            if (!error.empty() || static_cast<size_t>(k) >= beams.size()) {
              out.error = error.empty() ? "beam search ended with fewer beams than n" : error;
              out.internal = internal || error.empty();
            } else {
              Beam& beam = beams[static_cast<size_t>(k)];
              out.new_tokens = std::move(beam.tokens);
              out.logprobs = std::move(beam.token_logprobs);
              out.top_logprobs = std::move(beam.top_logprobs);
              out.finish_reason = beam.complete ? FinishReason::kStop : FinishReason::kLength;
            }
            channel->items.push_back({p, std::move(out), Clock::now()});
          }
        }
        net::post(ex, [channel] { channel->wake.cancel(); });
      };
      auto search = BeamSearch::start(
          std::move(spec), params,
          [engine](RequestSpec step, BeamSearch::OutputCallback cb) {
            return engine->submit(std::move(step), std::move(cb));
          },
          [engine](RequestId id) { engine->abort(id); }, std::move(done));
      beam_searches.insert(search);
      searches.push_back(std::move(search));
    }
    return searches;
  }

  // Writes the stream's head; false when the client is gone.
  awaitable<bool> start_stream(Connection& conn, const http::request<http::string_body>& req) {
    http::response<http::empty_body> head{http::status::ok, req.version()};
    head.set(http::field::server, "inferd");
    head.set(http::field::content_type, "text/event-stream");
    head.set(http::field::cache_control, "no-cache");
    conn.chunked_stream = req.version() >= 11;
    head.chunked(conn.chunked_stream);
    head.keep_alive(conn.chunked_stream && req.keep_alive());
    http::response_serializer<http::empty_body> sr{head};
    conn.expire_after(options.write_timeout_seconds);
    boost::system::error_code ec;
    co_await http::async_write_header(conn.socket, sr, net::redirect_error(use_awaitable, ec));
    conn.never_expire();
    co_return !ec;
  }

  // GCC 12 destroys a temporary passed to a coroutine twice (GCC bug 99576): every argument of a
  // coroutine call in this file is a named object.
  //
  // One generation: prepare (input side), submit, then apply each engine output to its choice's
  // OutputProcessor (output side) and stream the events or send the body. Over ~80 lines because
  // it is one coroutine whose locals live across every co_await; its steps are the helpers above.
  awaitable<bool> generate(std::shared_ptr<Connection> conn, const http::request<http::string_body>& req,
                           ApiEndpoint endpoint, TritonAnswer* triton = nullptr, bool responses = false) {
    const auto arrival = Clock::now();
    Prepared prepared;
    std::string session_header;
    if (auto h = req.find("X-Session-Id"); h != req.end()) session_header = std::string(h->value());
    std::string request_id_header;
    if (auto h = req.find("X-Request-Id"); h != req.end()) request_id_header = std::string(h->value());
    // The body is copied for the worker (milliseconds for megabytes): this coroutine's frame may
    // be gone, at shutdown, before the worker is done with it.
    std::optional<TritonAnswer> triton_body;
    if (triton != nullptr) triton_body = *triton;
    std::shared_ptr<const ResponseStore> store = responses ? stored_responses : nullptr;
    auto read = start_on(input_workers, [inputs = inputs, endpoint, body = req.body(), session_header,
                                         request_id_header, triton_body, store] {
      return read_generate(*inputs, endpoint, body, session_header, request_id_header, triton_body, store);
    });
    co_await until_done(*read);
    if (triton != nullptr) triton->id = read->result->triton_id;
    std::optional<ApiError> error = read->result->error;
    if (!error) error = check_model(*read->result, &prepared);
    if (!error) error = finish_generate(endpoint, req, read->result->processed, &prepared);
    if (error && responses) error = responses_error(*error);
    if (error) {
      Response res =
          triton != nullptr ? triton_error(req, error->status, error->message) : error_response(req, *error);
      if (error->status == 429)
        res.set(http::field::retry_after, std::to_string(prepared.retry_after_seconds));
      co_return co_await send(*conn, res);
    }
    if (!prepared.lora_name.empty()) {
      // The adapter, loaded on another thread when it is not resident (a cold adapter's
      // requests wait for it; the I/O thread and the engine go on).
      auto wait = start_on(
          lora_loader, [registry = ctx.lora, name = prepared.lora_name] { return registry->acquire(name); });
      co_await until_done(*wait);
      const Expected<std::shared_ptr<const LoraAdapter>>& adapter = *wait->result;
      if (!adapter.has_value()) {
        const Status& s = adapter.status();
        const ApiError error{s.code() == StatusCode::kNotFound ? 404 : 500, s.message(),
                             "invalid_request_error", "model",
                             s.code() == StatusCode::kNotFound ? "model_not_found" : ""};
        Response res =
            triton != nullptr ? triton_error(req, error.status, error.message) : error_response(req, error);
        co_return co_await send(*conn, res);
      }
      for (RequestSpec& spec : prepared.input.requests) spec.lora = adapter.value();
    }
    const GenerateRequest& api = prepared.api;
    ProcessedInput& input = prepared.input;
    const size_t n = static_cast<size_t>(input.requests.at(0).n);
    std::vector<int64_t> prompt_tokens;
    for (const auto& r : input.requests) prompt_tokens.push_back(static_cast<int64_t>(r.prompt.size()));
    const bool split = options.reasoning_parser && endpoint == ApiEndpoint::kChat;
    OutputOptions output_options;
    output_options.stop = input.stop;
    output_options.include_stop_str_in_output = input.include_stop_str_in_output;
    if (split) output_options.reasoning = options.reasoning_parser;
    output_options.prompt_opens_think = input.prompt_opens_think;
    output_options.tool_calls = input.tool_calls;
    output_options.max_tool_calls = input.max_tool_calls;
    output_options.skip_special_tokens = input.skip_special_tokens;
    output_options.min_tokens = input.min_tokens;
    std::vector<OutputProcessor> choices;
    for (size_t p = 0; p < input.requests.size(); ++p) {
      output_options.echo = p < input.echo.size() ? input.echo[p] : std::string();
      output_options.prompt_head = input.requests[p].prompt.front();
      for (size_t k = 0; k < n; ++k) choices.emplace_back(ctx.tokenizer, output_options);
    }
    std::vector<bool> seen(choices.size(), false);
    const char* id_prefix = responses ? "resp_" : endpoint == ApiEndpoint::kChat ? "chatcmpl-" : "cmpl-";
    const std::string model_name =
        prepared.lora_name.empty() ? options.served_model_name : prepared.lora_name;
    const int64_t created = unix_now();
    OpenAiAnswer answer(endpoint, api.request_id.empty() ? random_id(id_prefix) : id_prefix + api.request_id,
                        created, model_name, ctx.tokenizer, api.logprobs, split);
    std::optional<ResponsesAnswer> response;
    if (responses)
      response.emplace(answer.id(), created, model_name, *read->result->responses, ctx.tokenizer);
    answer.set_tokens_as_ids(api.return_tokens_as_token_ids);
    answer.set_legacy_functions(api.legacy_functions);
    answer.set_prompt_logprobs(api.prompt_logprobs_field, api.generation.echo && api.logprobs);

    auto channel = std::make_shared<Channel>(io.get_executor());
    std::vector<std::shared_ptr<BeamSearch>> searches;
    if (input.beam_length_penalty) searches = start_beam_searches(input, *input.beam_length_penalty, channel);
    const std::vector<RequestId> ids = searches.empty() ? submit(input, channel) : std::vector<RequestId>{};
    metrics->add_prompt_tokens(input.num_prompt_tokens);
    // Watch for the client hanging up while we wait: abort at once so its blocks free.
    auto stop_watch = std::make_shared<bool>(false);
    net::co_spawn(io, watch_disconnect(conn, channel, ids, searches, stop_watch), net::detached);
    bool stream_ok = true;
    if (api.stream) stream_ok = co_await start_stream(*conn, req);
    if (api.stream && response) {
      const std::string events = response->created_events();
      co_await send_event(*conn, events, stream_ok, ids);
    }

    size_t unfinished = choices.size();
    while (unfinished > 0) {
      std::deque<Channel::Item> batch = co_await channel->take();
      for (Channel::Item& item : batch) {
        const size_t ci = item.prompt * n + static_cast<size_t>(item.out.index);
        OutputProcessor& c = choices.at(ci);
        if (c.finished()) continue;  // ended by a stop string: later tokens are dropped
        const ChoiceDelta d = c.apply(item.out, item.at);
        for (double gap : c.last_gaps_seconds()) metrics->observe_inter_token(gap);
        metrics->add_generation_tokens(static_cast<int64_t>(item.out.new_tokens.size()));
        if (d.stop_string) ctx.engine->abort(ids[item.prompt], item.out.index);
        if (response) {
          const std::string events = response->apply(d);
          if (api.stream && !events.empty()) co_await send_event(*conn, events, stream_ok, ids);
        } else if (api.stream) {
          std::string events;
          if (triton == nullptr) {
            events = answer.stream_events(ci, d, c, !seen[ci]);
          } else if (c.error().empty() && (d.finished || !d.content.empty())) {  // an error: answer_request
            events = triton_stream_event(triton->model, triton->id, d.content,
                                         d.finished ? c.finish_reason() : std::nullopt);
          }
          if (!events.empty()) co_await send_event(*conn, events, stream_ok, ids);
        }
        seen[ci] = true;
        if (d.finished) {
          --unfinished;
          record(c, arrival, prompt_tokens[item.prompt], prepared.slo_class);
          if (!prepared.lora_name.empty())
            metrics->observe_lora_finished(prepared.lora_name, prompt_tokens[item.prompt],
                                           static_cast<int64_t>(c.token_ids().size()));
        }
      }
    }
    *stop_watch = true;
    boost::system::error_code ignored;
    if (conn->socket.is_open()) conn->socket.cancel(ignored);  // ends the disconnect watch
    for (RequestId rid : ids) active.erase(rid);
    for (const auto& search : searches) beam_searches.erase(search);

    Usage usage{input.num_prompt_tokens, 0};
    for (const auto& c : choices) usage.completion_tokens += static_cast<int64_t>(c.token_ids().size());
    if (options.enable_prompt_tokens_details) {  // each prompt counts once, as in prompt_tokens
      usage.cached_tokens = 0;
      for (size_t p = 0; p < input.requests.size(); ++p)
        *usage.cached_tokens += choices.at(p * n).cached_tokens();
    }
    if (api.generation.prediction) {
      usage.prediction.emplace(0, 0);
      for (const auto& c : choices) {
        usage.prediction->first += c.accepted_predicted_tokens();
        usage.prediction->second += c.predicted_tokens() - c.accepted_predicted_tokens();
      }
    }
    log_finished(answer.id(), choices, arrival, usage, prepared);
    if (input.answered > 0) {  // best_of: every candidate's tokens count in usage, as OpenAI bills them
      std::vector<OutputProcessor> best;
      for (size_t i : best_of_choices(choices, n, static_cast<size_t>(input.answered)))
        best.push_back(std::move(choices[i]));
      choices = std::move(best);
    }
    if (response)
      co_return co_await answer_response(*conn, req, api, *response, *read->result->responses, choices.at(0),
                                         usage, stream_ok, ids);
    const std::optional<json> handle = kv_handle(prepared, choices);
    const json* extra = handle ? &*handle : nullptr;
    co_return co_await answer_request(*conn, req, api, answer, choices, usage, stream_ok, ids, extra, triton);
  }

  // The end of a generation: an engine-side failure (e.g. more KV than exists) is the request's
  // error; else the stream's usage and [DONE], or the whole body.
  awaitable<bool> answer_request(Connection& conn, const http::request<http::string_body>& req,
                                 const GenerateRequest& api, const OpenAiAnswer& answer,
                                 const std::vector<OutputProcessor>& choices, const Usage& usage,
                                 bool stream_ok, const std::vector<RequestId>& ids, const json* kv_handle,
                                 const TritonAnswer* triton) {
    const bool done_event = triton == nullptr;  // Triton's stream ends with its "done" event, no [DONE]
    for (const auto& c : choices) {
      if (c.error().empty()) continue;
      if (api.stream) {
        if (!stream_ok || conn.client_gone) co_return false;
        count_error(c.internal_error() ? 500 : 400);
        const std::string event = triton != nullptr
                                      ? "data: " + triton_error_body(c.error()) + "\n\n"
                                      : OpenAiAnswer::error_event(c.error(), c.internal_error());
        co_await send_event(conn, event, stream_ok, ids);
        co_return co_await finish_stream(conn, stream_ok, done_event);
      }
      const int status = c.internal_error() ? 500 : 400;
      Response res = triton != nullptr ? triton_error(req, status, c.error())
                     : c.internal_error()
                         ? error_response(req, ApiError{500, c.error(), "server_error", "", ""})
                         : error_response(req, ApiError{400, c.error(), "invalid_request_error", "", ""});
      co_return co_await send(conn, res);
    }
    if (conn.client_gone) co_return false;
    if (triton != nullptr) {
      if (api.stream) co_return co_await finish_stream(conn, stream_ok, done_event);
      const OutputProcessor& c = choices.at(0);
      Response res = make_response(req, http::status::ok,
                                   triton_generate_body(triton->model, triton->id, c.text(),
                                                        c.finish_reason().value_or(FinishReason::kAborted)));
      co_return co_await send(conn, res);
    }
    if (api.stream) {
      if (api.include_usage) {
        const std::string event = answer.usage_event(usage);
        co_await send_event(conn, event, stream_ok, ids);
      }
      co_return co_await finish_stream(conn, stream_ok);
    }
    std::string body = answer.body(choices, usage);
    if (kv_handle != nullptr) {  // prefill: the handle the decode instance pulls with
      json j = json::parse(body);
      j["kv_transfer_params"] = *kv_handle;
      body = j.dump(-1, ' ', false, json::error_handler_t::replace);
    }
    Response res = make_response(req, http::status::ok, body);
    co_return co_await send(conn, res);
  }

  // The end of a /v1/responses request: its last events (no [DONE]: Responses streams end with
  // response.completed, .incomplete or .failed) or its body; a stored response is kept for
  // previous_response_id and GET /v1/responses/{id}.
  awaitable<bool> answer_response(Connection& conn, const http::request<http::string_body>& req,
                                  const GenerateRequest& api, ResponsesAnswer& response,
                                  const ResponsesRequest& request, const OutputProcessor& choice,
                                  const Usage& usage, bool stream_ok, const std::vector<RequestId>& ids) {
    if (!choice.error().empty()) {
      if (api.stream) {
        count_error(choice.internal_error() ? 500 : 400);
        const std::string event = response.failed_event(choice.error(), choice.internal_error());
        co_await send_event(conn, event, stream_ok, ids);
        co_return co_await finish_stream(conn, stream_ok, false);
      }
      Response res = error_response(
          req, choice.internal_error() ? ApiError{500, choice.error(), "server_error", "", ""}
                                       : ApiError{400, choice.error(), "invalid_request_error", "", ""});
      co_return co_await send(conn, res);
    }
    const std::string events = response.finish(choice, usage.prompt_tokens);
    if (request.store && !conn.client_gone) {
      json conversation = request.history;
      for (const json& m : request.input_messages) conversation.push_back(m);
      conversation.push_back(response.assistant_message());
      stored_responses->put(response.id(), response.response(), std::move(conversation), request.input_items);
    }
    if (conn.client_gone) co_return false;
    if (api.stream) {
      co_await send_event(conn, events, stream_ok, ids);
      co_return co_await finish_stream(conn, stream_ok, false);
    }
    Response res = make_response(req, http::status::ok,
                                 response.response().dump(-1, ' ', false, json::error_handler_t::replace));
    co_return co_await send(conn, res);
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

  // Ends a stream: OpenAI's [DONE] event (unless !done_event), then the last chunk.
  awaitable<bool> finish_stream(Connection& conn, bool ok, bool done_event = true) {
    if (!ok || conn.client_gone) co_return false;
    const std::string done = done_event ? OpenAiAnswer::done_event() : std::string();
    conn.expire_after(options.write_timeout_seconds);
    boost::system::error_code ec;
    if (!conn.chunked_stream) {  // HTTP/1.0: the close ends the body
      co_await net::async_write(conn.socket, net::buffer(done), net::redirect_error(use_awaitable, ec));
      conn.never_expire();
      co_return false;
    }
    if (!done.empty())  // an empty chunk would be the last one
      co_await net::async_write(conn.socket, http::make_chunk(net::buffer(done)),
                                net::redirect_error(use_awaitable, ec));
    if (!ec)
      co_await net::async_write(conn.socket, http::make_chunk_last(), net::redirect_error(use_awaitable, ec));
    conn.never_expire();
    co_return !ec;
  }

  // One info line per finished HTTP request: its id, tokens, queue time, TTFT (the first token of
  // any choice), E2E and finish reason(s) (one per choice, comma-separated; "error" for a failed
  // one, with the first error), for operators' logs.
  static void log_finished(const std::string& id, const std::vector<OutputProcessor>& choices,
                           Clock::time_point arrival, const Usage& usage, const Prepared& prepared) {
    const auto end = Clock::now();
    std::optional<Clock::time_point> first_token, first_scheduled;
    std::string reasons, error;
    for (const OutputProcessor& c : choices) {
      if (c.first_token_at() && (!first_token || *c.first_token_at() < *first_token))
        first_token = c.first_token_at();
      if (c.first_scheduled_at() && (!first_scheduled || *c.first_scheduled_at() < *first_scheduled))
        first_scheduled = c.first_scheduled_at();
      if (!reasons.empty()) reasons += ",";
      reasons += c.error().empty() ? finish_reason_name(c.finish_reason().value_or(FinishReason::kAborted))
                                   : "error";
      if (error.empty()) error = c.error();
    }
    std::vector<LogField> fields = {{"id", id},
                                    {"prompt_tokens", usage.prompt_tokens},
                                    {"generation_tokens", usage.completion_tokens},
                                    {"queue_s", seconds(first_scheduled.value_or(end) - arrival)},
                                    {"e2e_s", seconds(end - arrival)},
                                    {"finish_reason", reasons}};
    if (first_token) fields.push_back({"ttft_s", seconds(*first_token - arrival)});  // none: no token came
    if (prepared.ttft_estimate) fields.push_back({"ttft_estimate_s", *prepared.ttft_estimate});
    if (!error.empty()) fields.push_back({"error", error});
    log_info("request finished", fields);
  }

  void record(const OutputProcessor& c, Clock::time_point arrival, int64_t prompt_tokens, int32_t slo_class) {
    RequestTimings t;
    t.slo_class = slo_class;
    const auto end = Clock::now();
    const Clock::time_point scheduled = c.first_scheduled_at().value_or(end);
    t.queue_seconds = seconds(scheduled - arrival);
    t.has_first_token = c.first_token_at().has_value();
    if (t.has_first_token) {
      t.ttft_seconds = seconds(*c.first_token_at() - arrival);
      t.prefill_seconds = seconds(*c.first_token_at() - c.first_scheduled_at().value_or(arrival));
      t.decode_seconds = seconds(*c.last_token_at() - *c.first_token_at());
    }
    t.e2e_seconds = seconds(end - arrival);
    t.prompt_tokens = prompt_tokens;
    t.generation_tokens = static_cast<int64_t>(c.token_ids().size());
    t.finished_reason =
        c.error().empty() ? finish_reason_name(c.finish_reason().value_or(FinishReason::kAborted)) : "error";
    metrics->observe_finished(t);
  }

  // Waits until the client's side of the socket reports end of stream (it hung up) while the
  // request is in flight; then aborts the request's engine requests and wakes the handler.
  awaitable<void> watch_disconnect(std::shared_ptr<Connection> conn, std::shared_ptr<Channel> channel,
                                   std::vector<RequestId> ids,
                                   std::vector<std::shared_ptr<BeamSearch>> searches,
                                   std::shared_ptr<bool> stop) {
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
      for (const auto& search : searches) search->cancel();
      channel->wake.cancel();
      co_return;
    }
  }

  // ---- shutdown -----------------------------------------------------------------------------

  awaitable<void> on_signal() {
    boost::system::error_code ec;
    co_await signals.async_wait(net::redirect_error(use_awaitable, ec));
    if (ec) co_return;
    log_info("shutting down: draining requests", {{"requests", static_cast<int64_t>(active.size())},
                                                  {"grace_s", options.shutdown_grace_seconds}});
    draining = true;
    acceptor.close(ec);
    net::steady_timer timer(io);
    const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                             std::chrono::duration<double>(options.shutdown_grace_seconds));
    while ((!active.empty() || !beam_searches.empty()) && Clock::now() < deadline) {
      timer.expires_after(std::chrono::milliseconds(50));
      co_await timer.async_wait(net::redirect_error(use_awaitable, ec));
    }
    if (!active.empty() || !beam_searches.empty()) {
      log_warning("grace period over: aborting requests",
                  {{"requests", static_cast<int64_t>(active.size() + beam_searches.size())}});
      for (RequestId id : active) ctx.engine->abort(id);
      for (const auto& search : beam_searches) search->cancel();
      const auto hard = Clock::now() + std::chrono::seconds(5);
      while ((!active.empty() || !beam_searches.empty()) && Clock::now() < hard) {
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
    InputLimits limits{context.max_model_len, context.vocab_size, impl->options.max_prompts};
    limits.tool_call_parser = impl->options.tool_call_parser;
    limits.enable_auto_tool_choice = impl->options.enable_auto_tool_choice;
    limits.trust_request_chat_template = impl->options.trust_request_chat_template;
    impl->inputs = std::make_shared<const InputProcessor>(context.tokenizer, context.chat_template, limits);
    impl->metrics = std::make_unique<ServerMetrics>(impl->options.metrics_prefix,
                                                    impl->options.served_model_name, context.max_model_len);
    if (context.engine != nullptr) impl->metrics->set_slo_classes(context.engine->slo_classes());
    if (context.lora != nullptr) {
      ServerMetrics* m = impl->metrics.get();
      context.lora->set_load_observer([m](double seconds) { m->observe_lora_load(seconds); });
    }
    impl->ready = true;
  });
}

void HttpServer::set_failed(const std::string& message) {
  net::post(impl_->io, [impl = impl_.get(), message] {
    log_error(message);
    impl->exit_code = 1;
    impl->io.stop();
  });
}

void HttpServer::stop() {
  net::post(impl_->io, [impl = impl_.get()] {
    impl->draining = true;
    boost::system::error_code ec;
    impl->acceptor.close(ec);
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
