#include "engine/lora_registry.h"

namespace inferd {

LoraRegistry::LoraRegistry(const ModelWeights& base, LoraRegistryOptions options)
    : base_(base), options_(options) {}

void LoraRegistry::set_load_observer(std::function<void(double seconds)> observer) {
  std::vector<double> earlier;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    on_load_ = observer;
    earlier.swap(unobserved_);
  }
  for (double seconds : earlier) observer(seconds);  // the loads at start-up
}

Expected<std::shared_ptr<const LoraAdapter>> LoraRegistry::load(const std::string& path) {
  const auto start = std::chrono::steady_clock::now();
  auto adapter = load_lora_adapter(path, base_, options_.max_lora_rank);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::function<void(double)> observer;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    observer = on_load_;
    if (adapter.has_value() && !observer) unobserved_.push_back(seconds);
  }
  if (adapter.has_value() && observer) observer(seconds);
  return adapter;
}

Status LoraRegistry::add(const std::string& name, const std::string& path, const std::string& reserved,
                         bool replace) {
  if (name.empty()) return invalid_argument("a LoRA adapter needs a name");
  if (name == reserved) return invalid_argument("'" + name + "' is the base model's name");
  auto taken = [&] { return invalid_argument("a LoRA adapter named '" + name + "' is already loaded"); };
  if (!replace && contains(name)) return taken();
  INFERD_ASSIGN_OR_RETURN(std::shared_ptr<const LoraAdapter> adapter, load(path));
  std::lock_guard<std::mutex> lock(mutex_);
  if (!replace && entries_.count(name) != 0) return taken();
  entries_[name] = Entry{path, std::move(adapter), ++clock_, std::make_shared<std::mutex>()};
  evict_locked();
  return Status::ok();
}

Status LoraRegistry::remove(const std::string& name) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (entries_.erase(name) == 0) return not_found("no LoRA adapter named '" + name + "'");
  return Status::ok();
}

bool LoraRegistry::contains(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return entries_.count(name) != 0;
}

Expected<std::shared_ptr<const LoraAdapter>> LoraRegistry::acquire(const std::string& name) {
  std::shared_ptr<std::mutex> loading;
  std::string path;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = entries_.find(name);
    if (it == entries_.end()) return not_found("no LoRA adapter named '" + name + "'");
    it->second.last_used = ++clock_;
    if (it->second.adapter) return it->second.adapter;
    loading = it->second.loading;
    path = it->second.path;
  }
  // Not resident: one caller loads it, the others wait for that load.
  std::lock_guard<std::mutex> load_lock(*loading);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = entries_.find(name);
    if (it == entries_.end()) return not_found("no LoRA adapter named '" + name + "'");
    if (it->second.adapter) return it->second.adapter;
  }
  auto adapter = load(path);
  if (!adapter.has_value()) return adapter.status().with_context("LoRA adapter '" + name + "'");
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = entries_.find(name);
  if (it != entries_.end() && it->second.path == path) {
    it->second.adapter = *adapter;
    it->second.last_used = ++clock_;
    evict_locked();
  }
  return *adapter;
}

void LoraRegistry::evict_locked() {
  for (;;) {
    int64_t resident = 0;
    Entry* oldest = nullptr;
    for (auto& [name, e] : entries_) {
      if (!e.adapter) continue;
      ++resident;
      if (oldest == nullptr || e.last_used < oldest->last_used) oldest = &e;
    }
    if (resident <= options_.max_loras || oldest == nullptr) return;
    oldest->adapter.reset();
  }
}

std::vector<LoraModuleInfo> LoraRegistry::list() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<LoraModuleInfo> out;
  for (const auto& [name, e] : entries_) out.push_back({name, e.path, e.adapter != nullptr});
  return out;
}

int64_t LoraRegistry::num_resident() const {
  std::lock_guard<std::mutex> lock(mutex_);
  int64_t n = 0;
  for (const auto& [name, e] : entries_) n += e.adapter != nullptr;
  return n;
}

}  // namespace inferd
