// LoraRegistry: the LoRA adapters a server offers, by name (vLLM's --lora-modules and
// /v1/load_lora_adapter). At most `max_loras` are resident (their f32 matrices in memory); the
// others stay registered by path and are loaded again on demand, the least recently used
// resident one making room. Loads happen on the caller's thread (the request handler that
// needs the adapter), never on the engine thread: a request whose adapter is loading waits,
// the batch does not. Thread-safe.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/status.h"
#include "model/lora_adapter.h"

namespace inferd {

struct LoraRegistryOptions {
  int64_t max_loras = 8;       // resident at once
  int64_t max_lora_rank = 64;  // adapters of a higher rank are refused
};

struct LoraModuleInfo {
  std::string name, path;
  bool resident = false;
};

class LoraRegistry final {
 public:
  // base: not owned, must outlive the registry.
  LoraRegistry(const ModelWeights& base, LoraRegistryOptions options);

  // Loads the adapter at `path` (checked against the base) and offers it as `name`. Errors: the
  // name is taken (unless `replace`: then the new adapter takes the name once it loaded) or is the
  // base's `reserved` name, the adapter is refused.
  Status add(const std::string& name, const std::string& path, const std::string& reserved = {},
             bool replace = false);
  // Stops offering `name` (requests running with it finish with it). kNotFound when unknown.
  Status remove(const std::string& name);
  bool contains(const std::string& name) const;
  // The adapter offered as `name`, loaded from its path first when it is not resident.
  // kNotFound when no adapter has that name; the load's error when its files went bad.
  Expected<std::shared_ptr<const LoraAdapter>> acquire(const std::string& name);

  std::vector<LoraModuleInfo> list() const;
  int64_t num_resident() const;
  int64_t max_loras() const { return options_.max_loras; }
  // Called after every load from disk with its duration (metrics); at once for earlier loads.
  void set_load_observer(std::function<void(double seconds)> observer);

 private:
  struct Entry {
    std::string path;
    std::shared_ptr<const LoraAdapter> adapter;  // null: not resident
    uint64_t last_used = 0;
    std::shared_ptr<std::mutex> loading;  // one load of this entry at a time
  };
  Expected<std::shared_ptr<const LoraAdapter>> load(const std::string& path);
  // Drops the least recently used resident adapters beyond max_loras. mutex_ held.
  void evict_locked();

  const ModelWeights& base_;
  LoraRegistryOptions options_;
  mutable std::mutex mutex_;
  std::map<std::string, Entry> entries_;
  uint64_t clock_ = 0;
  std::function<void(double)> on_load_;
  std::vector<double> unobserved_;  // loads before an observer was set
};

}  // namespace inferd
