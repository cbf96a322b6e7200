#include "router/health_monitor.h"

// Asio's coroutine frames trip GCC 12's -Wmismatched-new-delete (see server/http_server.cpp).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif

#include <algorithm>
#include <chrono>

#include <boost/asio.hpp>

#include "common/files.h"
#include "common/log.h"
#include "router/upstream_client.h"

namespace inferd {

namespace net = boost::asio;
using net::awaitable;
using net::use_awaitable;

Status HealthMonitor::reload_instances_file() {
  RouterState& st = *state_;
  const std::string& path = st.options.instances_file;
  if (path.empty()) return Status::ok();
  std::error_code ec;
  const auto mtime = std::filesystem::last_write_time(path, ec);
  if (ec) {
    if (!file_read_) return io_error("--instances-file " + path + ": " + ec.message());
    return Status::ok();  // e.g. being replaced: the next interval reads it
  }
  if (file_mtime_ && *file_mtime_ == mtime) return Status::ok();
  file_mtime_ = mtime;
  Expected<std::string> text = read_text_file(path);
  Expected<std::vector<InstanceSpec>> list =
      text ? parse_instances_file(*text, path) : Expected<std::vector<InstanceSpec>>(text.status());
  if (!list) {
    if (!file_read_) return list.status();
    log_error("instances file not reloaded (the previous list stays)", {{"error", list.status().message()}});
    return Status::ok();
  }
  file_read_ = true;
  const InstancePool::Reconciled r = st.pool.set_file_instances(*list);
  for (uint64_t id : r.added) {
    if (const InstanceState* s = st.pool.find(id))
      log_info("instance added", {{"instance", s->spec.url}, {"role", std::string(role_name(s->spec.role))}});
  }
  for (uint64_t id : r.retired) {
    st.planner.forget_instance(id);
    log_info("instance removed: no new requests go there", {{"id", static_cast<int64_t>(id)}});
  }
  return Status::ok();
}

awaitable<void> HealthMonitor::run(const bool& stop) {
  net::steady_timer timer(co_await net::this_coro::executor);
  const auto interval = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(state_->options.health_interval_seconds));
  while (!stop) {
    const Status s = reload_instances_file();
    if (!s.is_ok()) log_error(s.message());
    for (uint64_t id : state_->pool.checked_ids()) {
      InstanceState* inst = state_->pool.find(id);
      if (inst == nullptr || inst->checking) continue;  // the last check is still waiting
      inst->checking = true;
      net::co_spawn(timer.get_executor(), check(id), net::detached);
    }
    timer.expires_after(interval);
    boost::system::error_code ec;
    co_await timer.async_wait(net::redirect_error(use_awaitable, ec));
  }
}

awaitable<void> HealthMonitor::check(uint64_t id) {
  RouterState& st = *state_;
  const InstanceState* inst = st.pool.find(id);
  if (inst == nullptr) co_return;
  const InstanceSpec spec = inst->spec;
  const double timeout = std::clamp(st.options.health_interval_seconds * 2, 1.0, 5.0);
  UpstreamRequest health;
  health.method = "GET";
  health.target = "/health";
  FetchResult result = co_await fetch(spec, health, timeout);
  std::string error;
  if (auto* f = std::get_if<UpstreamFailure>(&result)) {
    error = f->message;
  } else if (const auto& r = std::get<UpstreamResponse>(result); r.status != 200) {
    error = "GET /health: HTTP " + std::to_string(r.status);
  }
  const bool ok = error.empty();
  st.apply(spec, st.pool.record_check(id, ok, error), error);
  if (ok) {
    UpstreamRequest scrape;
    scrape.method = "GET";
    scrape.target = "/metrics";
    FetchResult m = co_await fetch(spec, scrape, timeout);
    if (auto* r = std::get_if<UpstreamResponse>(&m); r != nullptr && r->status == 200) {
      if (InstanceState* s = st.pool.find(id)) s->load = parse_load_metrics(r->body);
    }
  }
  if (InstanceState* s = st.pool.find(id)) s->checking = false;
}

}  // namespace inferd
