#include "transfer/ucx_kv_transfer.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <dlfcn.h>
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include "common/check.h"
#include "common/log.h"

namespace inferd {

int restore_crash_signals_from_ucx() {
  int restored = 0;
  for (int signum : {SIGSEGV, SIGBUS, SIGILL, SIGFPE}) {
    struct sigaction current {};
    if (sigaction(signum, nullptr, &current) != 0) continue;
    const auto handler = (current.sa_flags & SA_SIGINFO) != 0
                             ? reinterpret_cast<uintptr_t>(current.sa_sigaction)
                             : reinterpret_cast<uintptr_t>(current.sa_handler);
    if (handler == 0 || handler == reinterpret_cast<uintptr_t>(SIG_IGN)) continue;  // SIG_DFL is 0
    Dl_info info{};
    if (dladdr(reinterpret_cast<const void*>(handler), &info) == 0 || info.dli_fname == nullptr) continue;
    if (std::strstr(info.dli_fname, "libucs") == nullptr) continue;
    struct sigaction fallback {};
    fallback.sa_handler = SIG_DFL;
    sigemptyset(&fallback.sa_mask);
    if (sigaction(signum, &fallback, nullptr) == 0) ++restored;
  }
  return restored;
}

namespace {

constexpr uint16_t kPullId = 1, kBlocksId = 2;
constexpr uint32_t kPullMagic = 0x504b5649;    // "IVKP" little-endian bytes: I K V P
constexpr uint32_t kBlocksMagic = 0x444b5649;  // I K V D
constexpr uint16_t kVersion = 1;

enum : uint16_t { kStatusOk = 0, kStatusUnknown = 1, kStatusForeign = 2, kStatusRange = 3 };

const char* status_text(uint16_t s) {
  switch (s) {
    case kStatusOk: return "ok";
    case kStatusUnknown: return "unknown transfer (never existed, already pulled, or its lease expired)";
    case kStatusForeign: return "the prefill instance serves another model or KV layout";
    case kStatusRange: return "block range outside the transfer";
  }
  return "unknown status";
}

struct PullHeader {
  uint32_t magic;
  uint16_t version;
  uint16_t reserved;
  uint64_t tag;
  uint64_t transfer_id;
  uint64_t store_lo, store_hi;
  uint32_t first_block;
  uint32_t num_blocks;
};
static_assert(sizeof(PullHeader) == 48);

struct BlocksHeader {
  uint32_t magic;
  uint16_t version;
  uint16_t status;
  uint64_t tag;
  uint32_t num_blocks;
  uint32_t reserved;
  uint64_t record_bytes;
};
static_assert(sizeof(BlocksHeader) == 32);

std::string ucx_error(const char* what, ucs_status_t s) {
  return std::string(what) + ": " + ucs_status_string(s);
}

// Resolves a numeric or named host and a port into a socket address.
Expected<sockaddr_storage> resolve(const std::string& host, uint16_t port, socklen_t* len) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(port);
  const int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &res);
  if (rc != 0 || res == nullptr) return invalid_argument("cannot resolve " + host + ": " + gai_strerror(rc));
  sockaddr_storage out{};
  std::memcpy(&out, res->ai_addr, res->ai_addrlen);
  *len = res->ai_addrlen;
  freeaddrinfo(res);
  return out;
}

// One UCP context and worker, progressed on a thread of its own that sleeps on UCX's event fd
// (and an eventfd of ours, for work handed in from other threads).
class Worker {
 public:
  Status init() {
    ucp_params_t params{};
    params.field_mask = UCP_PARAM_FIELD_FEATURES;
    params.features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
    ucp_config_t* config = nullptr;
    ucs_status_t s = ucp_config_read(nullptr, nullptr, &config);
    if (s != UCS_OK) return io_error(ucx_error("UCX configuration", s));
    s = ucp_init(&params, config, &context_);
    ucp_config_release(config);
    if (s != UCS_OK) {
      context_ = nullptr;
      return io_error(ucx_error("UCX initialisation", s));
    }
    ucp_worker_params_t wp{};
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SINGLE;
    s = ucp_worker_create(context_, &wp, &worker_);
    if (s != UCS_OK) {
      worker_ = nullptr;
      return io_error(ucx_error("UCX worker", s));
    }
    s = ucp_worker_get_efd(worker_, &efd_);
    if (s != UCS_OK) return io_error(ucx_error("UCX worker event fd", s));
    wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (wake_fd_ < 0) return io_error("eventfd failed");
    return Status::ok();
  }
  // Runs `tick` between progress rounds until stop().
  void start(std::function<void()> tick) {
    tick_ = std::move(tick);
    thread_ = std::thread([this] { loop(); });
  }
  void stop() {
    if (!thread_.joinable()) return;
    stopping_ = true;
    wake();
    thread_.join();
  }
  void wake() {
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t n = write(wake_fd_, &one, sizeof one);
  }
  ~Worker() {
    stop();
    if (worker_ != nullptr) ucp_worker_destroy(worker_);
    if (context_ != nullptr) ucp_cleanup(context_);
    if (wake_fd_ >= 0) close(wake_fd_);
  }
  ucp_worker_h get() const { return worker_; }
  // Drives outstanding operations to completion on the calling thread (shutdown only).
  void drain(std::chrono::milliseconds for_at_most) {
    const auto end = std::chrono::steady_clock::now() + for_at_most;
    while (std::chrono::steady_clock::now() < end) {
      if (ucp_worker_progress(worker_) == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }

 private:
  void loop() {
    while (!stopping_) {
      while (ucp_worker_progress(worker_) != 0) {
      }
      tick_();
      if (ucp_worker_arm(worker_) == UCS_ERR_BUSY) continue;
      pollfd fds[2] = {{efd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
      ::poll(fds, 2, 50);
      if ((fds[1].revents & POLLIN) != 0) {
        uint64_t v = 0;
        [[maybe_unused]] ssize_t n = read(wake_fd_, &v, sizeof v);
      }
    }
  }
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  int efd_ = -1, wake_fd_ = -1;
  std::atomic<bool> stopping_{false};
  std::function<void()> tick_;
  std::thread thread_;
};

// UCX 1.13 calls through an unset slot of its handler table when a multi-fragment active message
// arrives with an id nobody registered (seen: a segfault in ucp_am_long_first_handler, found by
// UcxKvTransferTest.RandomPullMessagesNeverCrashTheServer). So every id gets a handler: `ours`
// keeps its own, all others drop what arrives. The highest id first: the table grows once.
Status register_handlers(ucp_worker_h worker, uint16_t ours, ucp_am_recv_callback_t cb, void* arg) {
  for (uint32_t i = 0; i <= 0xffff; ++i) {
    const auto id = static_cast<uint16_t>(i == 0 ? 0xffff : i - 1);
    ucp_am_handler_param_t hp{};
    hp.field_mask =
        UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
    hp.id = id;
    hp.cb = id == ours ? cb : [](void*, const void*, size_t, void*, size_t, const ucp_am_recv_param_t*) {
      return UCS_OK;  // not a message of this protocol: dropped
    };
    hp.arg = arg;
    const ucs_status_t s = ucp_worker_set_am_recv_handler(worker, &hp);
    if (s != UCS_OK) return io_error(ucx_error("KV transfer handler", s));
  }
  return Status::ok();
}

void close_ep(ucp_worker_h worker, ucp_ep_h ep) {
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  p.flags = UCP_EP_CLOSE_FLAG_FORCE;
  ucs_status_ptr_t r = ucp_ep_close_nbx(ep, &p);
  if (UCS_PTR_IS_PTR(r)) {
    // Force-close completes within a few progress rounds; the worker is ours alone here.
    for (int i = 0; i < 1000 && ucp_request_check_status(r) == UCS_INPROGRESS; ++i)
      ucp_worker_progress(worker);
    ucp_request_free(r);
  }
}

}  // namespace

// ---- prefill side ----------------------------------------------------------------------------

struct UcxKvServer::Impl {
  KvExportStore* store = nullptr;
  KvStoreIdentity identity;
  BlockHash store_key;
  Worker worker;
  ucp_listener_h listener = nullptr;
  uint16_t port = 0;
  KvTransferStats stats;
  std::unordered_set<ucp_ep_h> eps;  // worker thread only
  std::vector<ucp_ep_h> failed_eps;  // closed at the next tick
  struct Reply {
    Impl* impl;
    ucp_ep_h ep;
    BlocksHeader header;
    std::shared_ptr<const std::vector<std::byte>> records;
    const std::byte* data = nullptr;
    size_t length = 0;
  };
  std::vector<std::unique_ptr<Reply>> replies;  // queued by the AM handler, sent at the next tick

  static void on_conn(ucp_conn_request_h request, void* arg) {
    auto* self = static_cast<Impl*>(arg);
    ucp_ep_params_t p{};
    p.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST | UCP_EP_PARAM_FIELD_ERR_HANDLER |
                   UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    p.conn_request = request;
    p.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    p.err_handler.cb = &Impl::on_ep_error;
    p.err_handler.arg = self;
    ucp_ep_h ep = nullptr;
    const ucs_status_t s = ucp_ep_create(self->worker.get(), &p, &ep);
    if (s != UCS_OK) {
      log_warning(ucx_error("KV transfer: accepting a connection", s));
      return;
    }
    self->eps.insert(ep);
  }
  static void on_ep_error(void* arg, ucp_ep_h ep, ucs_status_t) {
    auto* self = static_cast<Impl*>(arg);
    if (self->eps.erase(ep) != 0) self->failed_eps.push_back(ep);
  }
  static ucs_status_t on_pull(void* arg, const void* header, size_t header_length, void*, size_t,
                              const ucp_am_recv_param_t* param) {
    auto* self = static_cast<Impl*>(arg);
    if (header_length != sizeof(PullHeader) || (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) == 0)
      return UCS_OK;  // not ours: dropped
    PullHeader h;
    std::memcpy(&h, header, sizeof h);
    if (h.magic != kPullMagic || h.version != kVersion) return UCS_OK;
    auto reply = std::make_unique<Reply>();
    reply->impl = self;
    reply->ep = param->reply_ep;
    reply->header = BlocksHeader{kBlocksMagic, kVersion, kStatusOk, h.tag, 0, 0, 0};
    if (h.store_lo != self->store_key.lo || h.store_hi != self->store_key.hi) {
      reply->header.status = kStatusForeign;
    } else if (auto entry = self->store->take(h.transfer_id); !entry) {
      reply->header.status = kStatusUnknown;
    } else if (static_cast<int64_t>(h.first_block) + h.num_blocks > entry->num_blocks) {
      reply->header.status = kStatusRange;
    } else {
      reply->records = entry->records;
      reply->header.num_blocks = h.num_blocks;
      reply->header.record_bytes = entry->record_bytes;
      reply->data = entry->records->data() + static_cast<size_t>(h.first_block) * entry->record_bytes;
      reply->length = static_cast<size_t>(h.num_blocks) * entry->record_bytes;
    }
    self->replies.push_back(std::move(reply));
    return UCS_OK;
  }
  static void on_sent(void* request, ucs_status_t status, void* user_data) {
    std::unique_ptr<Reply> reply(static_cast<Reply*>(user_data));
    reply->impl->finish_reply(*reply, status);
    ucp_request_free(request);
  }
  void finish_reply(const Reply& r, ucs_status_t status) {
    if (status == UCS_OK && r.header.status == kStatusOk) {
      stats.pulls++;
      stats.blocks += r.header.num_blocks;
      stats.bytes += static_cast<int64_t>(r.length);
    } else {
      stats.failures++;
    }
  }
  void tick() {
    for (auto& reply : std::exchange(replies, {})) {
      if (eps.count(reply->ep) == 0) {  // its connection failed meanwhile
        stats.failures++;
        continue;
      }
      ucp_request_param_t p{};
      p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
      p.cb.send = &Impl::on_sent;
      p.user_data = reply.get();
      Reply* raw = reply.get();
      ucs_status_ptr_t r =
          ucp_am_send_nbx(raw->ep, kBlocksId, &raw->header, sizeof raw->header, raw->data, raw->length, &p);
      if (r == nullptr) {
        finish_reply(*raw, UCS_OK);
      } else if (UCS_PTR_IS_ERR(r)) {
        finish_reply(*raw, UCS_PTR_STATUS(r));
      } else {
        (void)reply.release();  // on_sent owns it now
      }
    }
    for (ucp_ep_h ep : std::exchange(failed_eps, {})) close_ep(worker.get(), ep);
    store->expire();
  }
};

UcxKvServer::UcxKvServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

UcxKvServer::~UcxKvServer() {
  impl_->worker.stop();
  for (ucp_ep_h ep : impl_->eps) close_ep(impl_->worker.get(), ep);
  for (ucp_ep_h ep : impl_->failed_eps) close_ep(impl_->worker.get(), ep);
  if (impl_->listener != nullptr) ucp_listener_destroy(impl_->listener);
}

Expected<std::unique_ptr<UcxKvServer>> UcxKvServer::start(const std::string& host, uint16_t port,
                                                          KvExportStore& store,
                                                          const KvStoreIdentity& identity) {
  auto impl = std::make_unique<Impl>();
  impl->store = &store;
  impl->identity = identity;
  impl->store_key = identity.store_key();
  INFERD_RETURN_IF_ERROR(impl->worker.init());
  socklen_t len = 0;
  auto addr = resolve(host, port, &len);
  if (!addr) return addr.status();
  ucp_listener_params_t lp{};
  lp.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
  lp.sockaddr.addr = reinterpret_cast<const sockaddr*>(&addr.value());
  lp.sockaddr.addrlen = len;
  lp.conn_handler.cb = &Impl::on_conn;
  lp.conn_handler.arg = impl.get();
  ucs_status_t s = ucp_listener_create(impl->worker.get(), &lp, &impl->listener);
  if (s != UCS_OK) {
    impl->listener = nullptr;
    return io_error(ucx_error(("KV transfer listener on " + host + ":" + std::to_string(port)).c_str(), s) +
                    (s == UCS_ERR_BUSY
                         ? " (the address is in use: another process, or connections of one that "
                           "just ended; --kv-port 0 takes any free port)"
                         : ""));
  }
  ucp_listener_attr_t la{};
  la.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
  s = ucp_listener_query(impl->listener, &la);
  if (s != UCS_OK) return io_error(ucx_error("KV transfer listener address", s));
  impl->port = la.sockaddr.ss_family == AF_INET6
                   ? ntohs(reinterpret_cast<const sockaddr_in6*>(&la.sockaddr)->sin6_port)
                   : ntohs(reinterpret_cast<const sockaddr_in*>(&la.sockaddr)->sin_port);
  INFERD_RETURN_IF_ERROR(register_handlers(impl->worker.get(), kPullId, &Impl::on_pull, impl.get()));
  Impl* raw = impl.get();
  impl->worker.start([raw] { raw->tick(); });
  return std::unique_ptr<UcxKvServer>(new UcxKvServer(std::move(impl)));
}

uint16_t UcxKvServer::port() const {
  return impl_->port;
}
const KvTransferStats& UcxKvServer::stats() const {
  return impl_->stats;
}

// ---- decode side -----------------------------------------------------------------------------

struct UcxKvClient::Impl {
  KvCache* cache = nullptr;
  KvStoreIdentity identity;
  BlockHash store_key;
  size_t record_bytes = 0, payload_bytes = 0;
  Worker worker;
  KvTransferStats stats;
  std::atomic<uint64_t> next_ticket{1};

  // Handed in by the engine thread (guarded by mutex).
  struct Start {
    uint64_t ticket;
    RemoteKvRef from;
    int64_t first_block;
    std::vector<BlockHash> keys;
    std::vector<int32_t> blocks;
  };
  std::mutex mutex;
  std::vector<Start> starts;
  std::vector<std::pair<uint64_t, bool>> cancels;  // (ticket, timed out)
  std::vector<KvBlockSource::Finished> finished;

  // Worker thread only.
  struct Pending {
    uint64_t ticket;
    std::string peer;  // host:port
    std::vector<BlockHash> keys;
    std::vector<int32_t> blocks;
    PullHeader header;
    std::chrono::steady_clock::time_point started;
    std::vector<std::byte> buffer;  // a rendezvous reply lands here
    // receiving: its reply is on the way into `buffer`. cancelled: reported as given up while
    // receiving (its KV blocks went back to the scheduler); the entry only keeps `buffer` alive
    // until UCX is done with it, and what arrives is dropped.
    bool receiving = false, cancelled = false;
  };
  std::unordered_map<uint64_t, std::unique_ptr<Pending>> pending;
  std::unordered_map<std::string, ucp_ep_h> eps;  // by peer
  std::vector<ucp_ep_h> failed_eps;
  struct Deferred {
    uint64_t tag;
    void* desc;
    size_t length;
    uint32_t num_blocks;
    uint64_t record_bytes;
  };
  std::vector<Deferred> deferred;  // rendezvous replies to receive at the next tick

  void report(uint64_t ticket, int64_t loaded, std::string error) {
    {
      std::lock_guard lock(mutex);
      finished.push_back({ticket, loaded, std::move(error)});
    }
  }
  void finish(uint64_t ticket, int64_t loaded, std::string error) {
    auto it = pending.find(ticket);
    if (it == pending.end()) return;
    if (!error.empty()) stats.failures++;
    if (error.empty() && loaded > 0) stats.pulls++;
    stats.micros += std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() -
                                                                          it->second->started)
                        .count();
    pending.erase(it);
    report(ticket, loaded, std::move(error));
  }
  // Checks and imports `num_blocks` records at `data`.
  void land(uint64_t ticket, const std::byte* data, size_t length, uint32_t num_blocks, uint64_t rec_bytes) {
    auto it = pending.find(ticket);
    if (it == pending.end()) return;
    Pending& p = *it->second;
    if (p.cancelled) {
      pending.erase(it);  // reported when it was cancelled; its blocks may hold other KV by now
      return;
    }
    if (rec_bytes != record_bytes || length != static_cast<size_t>(num_blocks) * rec_bytes ||
        num_blocks > p.keys.size())
      return finish(ticket, 0, "the prefill instance sent records of another size");
    int64_t loaded = 0;
    std::string error;
    for (uint32_t i = 0; i < num_blocks; ++i) {
      std::span<const std::byte> rec(data + static_cast<size_t>(i) * rec_bytes, rec_bytes);
      const KvRecordCheck check = check_kv_record(rec, identity, p.keys[i], payload_bytes);
      if (check != KvRecordCheck::kOk) {
        stats.corrupt++;
        error = "block " + std::to_string(i) + " of the transfer failed its check (" +
                kv_record_check_name(check) + ")";
        break;
      }
      cache->import_block(p.blocks[i], rec.data() + kKvRecordHeaderBytes);
      ++loaded;
    }
    stats.blocks += loaded;
    stats.bytes += loaded * static_cast<int64_t>(rec_bytes);
    if (error.empty() && static_cast<size_t>(loaded) < p.keys.size())
      error = "the prefill instance sent " + std::to_string(loaded) + " of " + std::to_string(p.keys.size()) +
              " blocks";
    finish(ticket, loaded, std::move(error));
  }

  static void on_ep_error(void* arg, ucp_ep_h ep, ucs_status_t status) {
    static_cast<Impl*>(arg)->drop_ep(ep, ucs_status_string(status));
  }
  // Fails the pulls waiting on `ep` and closes it at the next tick.
  void drop_ep(ucp_ep_h ep, const std::string& why) {
    std::string peer;
    for (auto it = eps.begin(); it != eps.end(); ++it) {
      if (it->second == ep) {
        peer = it->first;
        eps.erase(it);
        failed_eps.push_back(ep);
        break;
      }
    }
    if (peer.empty()) return;
    std::vector<uint64_t> lost;
    for (auto& [ticket, p] : pending) {
      if (p->peer == peer && !p->receiving) lost.push_back(ticket);
    }
    for (uint64_t t : lost) finish(t, 0, "connection to the prefill instance " + peer + " failed: " + why);
  }
  static ucs_status_t on_blocks(void* arg, const void* header, size_t header_length, void* data,
                                size_t length, const ucp_am_recv_param_t* param) {
    auto* self = static_cast<Impl*>(arg);
    if (header_length != sizeof(BlocksHeader)) return UCS_OK;
    BlocksHeader h;
    std::memcpy(&h, header, sizeof h);
    if (h.magic != kBlocksMagic || h.version != kVersion) return UCS_OK;
    auto it = self->pending.find(h.tag);
    if (it == self->pending.end()) return UCS_OK;  // cancelled and reported: dropped
    if (h.status != kStatusOk) {
      self->finish(h.tag, 0, std::string("the prefill instance answered: ") + status_text(h.status));
      return UCS_OK;
    }
    if ((param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0) {
      it->second->receiving = true;
      self->stats.rendezvous++;
      self->deferred.push_back({h.tag, data, length, h.num_blocks, h.record_bytes});
      return UCS_INPROGRESS;  // received at the next tick (ucp_am_recv_data_nbx takes the descriptor)
    }
    self->land(h.tag, static_cast<const std::byte*>(data), length, h.num_blocks, h.record_bytes);
    return UCS_OK;
  }
  struct RecvContext {
    Impl* impl;
    Deferred d;
  };
  static void on_received(void* request, ucs_status_t status, size_t, void* user_data) {
    std::unique_ptr<RecvContext> ctx(static_cast<RecvContext*>(user_data));
    ctx->impl->received(ctx->d, status);
    ucp_request_free(request);
  }
  void received(const Deferred& d, ucs_status_t status) {
    auto it = pending.find(d.tag);
    if (it == pending.end()) return;
    if (it->second->cancelled) {
      pending.erase(it);
      return;
    }
    if (status != UCS_OK) return finish(d.tag, 0, ucx_error("receiving the KV blocks", status));
    land(d.tag, it->second->buffer.data(), d.length, d.num_blocks, d.record_bytes);
  }
  ucp_ep_h connect(const std::string& host, uint16_t port, std::string* error) {
    const std::string peer = host + ":" + std::to_string(port);
    if (auto it = eps.find(peer); it != eps.end()) return it->second;
    socklen_t len = 0;
    auto addr = resolve(host, port, &len);
    if (!addr) {
      *error = addr.status().message();
      return nullptr;
    }
    ucp_ep_params_t p{};
    p.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR | UCP_EP_PARAM_FIELD_ERR_HANDLER |
                   UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    p.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
    p.sockaddr.addr = reinterpret_cast<const sockaddr*>(&addr.value());
    p.sockaddr.addrlen = len;
    p.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    p.err_handler.cb = &Impl::on_ep_error;
    p.err_handler.arg = this;
    ucp_ep_h ep = nullptr;
    const ucs_status_t s = ucp_ep_create(worker.get(), &p, &ep);
    if (s != UCS_OK) {
      *error = ucx_error(("connecting to " + peer).c_str(), s);
      return nullptr;
    }
    eps.emplace(peer, ep);
    return ep;
  }
  static void on_pull_sent(void* request, ucs_status_t status, void* user_data) {
    auto* ctx = static_cast<std::pair<Impl*, uint64_t>*>(user_data);
    if (status != UCS_OK) ctx->first->finish(ctx->second, 0, ucx_error("sending the pull", status));
    delete ctx;
    ucp_request_free(request);
  }
  void begin(Start s) {
    auto p = std::make_unique<Pending>();
    p->ticket = s.ticket;
    p->peer = s.from.host + ":" + std::to_string(s.from.port);
    p->keys = std::move(s.keys);
    p->blocks = std::move(s.blocks);
    p->started = std::chrono::steady_clock::now();
    p->header = PullHeader{kPullMagic,
                           kVersion,
                           0,
                           s.ticket,
                           s.from.transfer_id,
                           store_key.lo,
                           store_key.hi,
                           static_cast<uint32_t>(s.first_block),
                           static_cast<uint32_t>(p->keys.size())};
    Pending* raw = p.get();
    pending.emplace(s.ticket, std::move(p));
    std::string error;
    ucp_ep_h ep = connect(s.from.host, s.from.port, &error);
    if (ep == nullptr) return finish(s.ticket, 0, error);
    ucp_request_param_t rp{};
    rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
    rp.flags = UCP_AM_SEND_FLAG_REPLY;
    rp.cb.send = &Impl::on_pull_sent;
    auto* ctx = new std::pair<Impl*, uint64_t>(this, s.ticket);
    rp.user_data = ctx;
    ucs_status_ptr_t r = ucp_am_send_nbx(ep, kPullId, &raw->header, sizeof raw->header, nullptr, 0, &rp);
    if (UCS_PTR_IS_PTR(r)) return;  // on_pull_sent owns ctx
    delete ctx;
    if (UCS_PTR_IS_ERR(r)) finish(s.ticket, 0, ucx_error("sending the pull", UCS_PTR_STATUS(r)));
  }
  void tick() {
    std::vector<Start> new_starts;
    std::vector<std::pair<uint64_t, bool>> new_cancels;
    {
      std::lock_guard lock(mutex);
      new_starts.swap(starts);
      new_cancels.swap(cancels);
    }
    for (Start& s : new_starts) begin(std::move(s));
    for (auto [t, timed_out] : new_cancels) {
      auto it = pending.find(t);
      if (it == pending.end()) continue;
      if (it->second->receiving) {
        // Reported now, so that the scheduler gets its blocks back even if the receive never ends
        // (a peer that stopped mid-transfer); the buffer stays UCX's until the receive ends.
        if (!it->second->cancelled) {
          it->second->cancelled = true;
          report(t, 0, "");
        }
        continue;
      }
      const std::string peer = it->second->peer;
      finish(t, 0, "");
      // Timed out: the peer may be unreachable (a link down), so its connection starts afresh.
      if (auto ep = eps.find(peer); timed_out && ep != eps.end()) drop_ep(ep->second, "a pull timed out");
    }
    for (const Deferred& d : std::exchange(deferred, {})) {
      auto it = pending.find(d.tag);
      if (it == pending.end() || it->second->cancelled) {
        ucp_am_data_release(worker.get(), d.desc);
        if (it != pending.end()) pending.erase(it);
        continue;
      }
      it->second->buffer.resize(d.length);
      ucp_request_param_t rp{};
      rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
      rp.cb.recv_am = &Impl::on_received;
      auto* ctx = new RecvContext{this, d};
      rp.user_data = ctx;
      ucs_status_ptr_t r =
          ucp_am_recv_data_nbx(worker.get(), d.desc, it->second->buffer.data(), d.length, &rp);
      if (UCS_PTR_IS_PTR(r)) continue;  // on_received owns ctx
      delete ctx;
      received(d, r == nullptr ? UCS_OK : UCS_PTR_STATUS(r));
    }
    for (ucp_ep_h ep : std::exchange(failed_eps, {})) close_ep(worker.get(), ep);
  }
};

UcxKvClient::UcxKvClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

UcxKvClient::~UcxKvClient() {
  impl_->worker.stop();
  for (auto& [peer, ep] : impl_->eps) close_ep(impl_->worker.get(), ep);
  for (ucp_ep_h ep : impl_->failed_eps) close_ep(impl_->worker.get(), ep);
}

Expected<std::unique_ptr<UcxKvClient>> UcxKvClient::create(KvCache& cache, const KvStoreIdentity& identity) {
  auto impl = std::make_unique<Impl>();
  impl->cache = &cache;
  impl->identity = identity;
  impl->store_key = identity.store_key();
  impl->payload_bytes = cache.block_bytes();
  impl->record_bytes = kv_record_bytes(cache.block_bytes());
  INFERD_RETURN_IF_ERROR(impl->worker.init());
  INFERD_RETURN_IF_ERROR(register_handlers(impl->worker.get(), kBlocksId, &Impl::on_blocks, impl.get()));
  Impl* raw = impl.get();
  impl->worker.start([raw] { raw->tick(); });
  return std::unique_ptr<UcxKvClient>(new UcxKvClient(std::move(impl)));
}

uint64_t UcxKvClient::start_load(const RemoteKvRef& from, int64_t first_block, std::vector<BlockHash> keys,
                                 std::vector<int32_t> blocks) {
  INFERD_CHECK(keys.size() == blocks.size());
  const uint64_t ticket = impl_->next_ticket++;
  {
    std::lock_guard lock(impl_->mutex);
    impl_->starts.push_back({ticket, from, first_block, std::move(keys), std::move(blocks)});
  }
  impl_->worker.wake();
  return ticket;
}

void UcxKvClient::poll(std::vector<KvBlockSource::Finished>* finished) {
  std::lock_guard lock(impl_->mutex);
  for (auto& f : impl_->finished) finished->push_back(std::move(f));
  impl_->finished.clear();
}

void UcxKvClient::cancel(uint64_t ticket, bool timed_out) {
  {
    std::lock_guard lock(impl_->mutex);
    impl_->cancels.emplace_back(ticket, timed_out);
  }
  impl_->worker.wake();
}

const KvTransferStats& UcxKvClient::stats() const {
  return impl_->stats;
}

}  // namespace inferd
