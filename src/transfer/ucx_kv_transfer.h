// KV transfer between a prefill and a decode instance over UCX (UCP active messages; the
// protocol is docs/disaggregation.md). The decode side pulls: UcxKvClient is its RemoteKvSource,
// UcxKvServer the prefill side's listener over its KvExportStore. Each runs one UCP worker on a
// thread of its own, woken by UCX's event fd, so neither ever blocks the engine thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "common/status.h"
#include "kv/kv_cache.h"
#include "kv/kv_cache_manager.h"
#include "kv/kv_export_store.h"
#include "kv/kv_record.h"

namespace inferd {

// libucs, loaded with the binary, installs its own handlers for SIGSEGV, SIGBUS, SIGILL and SIGFPE
// when it loads, before main() can set UCX_HANDLE_ERRORS. They print a backtrace with malloc and
// stdio, so a crash inside malloc deadlocked the process: it hung instead of dying and being
// restarted. Puts back the default action for each of those signals whose handler lives in
// libucs (other handlers, e.g. a sanitizer's, are left alone); the number restored. Call first
// thing in main(): UCX needs no signal handler for the transfers (its progress runs on threads).
int restore_crash_signals_from_ucx();

class UcxKvServer final {
 public:
  // Listens on host:port (0: any free port) and serves pulls of `store`'s entries, checking that
  // the puller's store key is `identity`'s. store: not owned, must outlive this.
  static Expected<std::unique_ptr<UcxKvServer>> start(const std::string& host, uint16_t port,
                                                      KvExportStore& store, const KvStoreIdentity& identity);
  ~UcxKvServer();
  UcxKvServer(const UcxKvServer&) = delete;
  UcxKvServer& operator=(const UcxKvServer&) = delete;
  uint16_t port() const;
  const KvTransferStats& stats() const;

  struct Impl;

 private:
  explicit UcxKvServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

class UcxKvClient final : public RemoteKvSource {
 public:
  // Imports pulled blocks into `cache` (not owned, must outlive this) after checking each record
  // against `identity` and its key.
  static Expected<std::unique_ptr<UcxKvClient>> create(KvCache& cache, const KvStoreIdentity& identity);
  ~UcxKvClient() override;
  UcxKvClient(const UcxKvClient&) = delete;
  UcxKvClient& operator=(const UcxKvClient&) = delete;

  uint64_t start_load(const RemoteKvRef& from, int64_t first_block, std::vector<BlockHash> keys,
                      std::vector<int32_t> blocks) override;
  void poll(std::vector<KvBlockSource::Finished>* finished) override;
  void cancel(uint64_t ticket, bool timed_out) override;
  const KvTransferStats& stats() const override;

  struct Impl;

 private:
  explicit UcxKvClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace inferd
