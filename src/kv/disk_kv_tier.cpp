#include "kv/disk_kv_tier.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "kv/kv_record.h"

namespace inferd {

namespace fs = std::filesystem;

namespace {

constexpr const char* kSuffix = ".kvb";

// Parses the 32 hex digits of a record's file name back into its key.
bool key_from_name(const std::string& stem, BlockHash* key) {
  if (stem.size() != 32) return false;
  unsigned long long hi = 0, lo = 0;
  for (size_t i = 0; i < 32; ++i) {
    const char c = stem[i];
    int d;
    if (c >= '0' && c <= '9') {
      d = c - '0';
    } else if (c >= 'a' && c <= 'f') {
      d = c - 'a' + 10;
    } else {
      return false;
    }
    unsigned long long& half = i < 16 ? hi : lo;
    half = (half << 4) | static_cast<unsigned long long>(d);
  }
  *key = BlockHash{lo, hi};
  return true;
}

bool write_all(int fd, const std::byte* p, size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

}  // namespace

Status check_writable_dir(const std::string& dir, const std::string& flag) {
  if (dir.empty()) return invalid_argument(flag + " is empty");
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return io_error(flag + " " + dir + ": cannot create it: " + ec.message());
  const fs::path probe = fs::path(dir) / ".inferd-probe";
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return io_error(flag + " " + dir + ": cannot write in it: " + std::strerror(errno));
  ::close(fd);
  ::unlink(probe.c_str());
  return Status::ok();
}

Expected<std::unique_ptr<DiskKvTier>> DiskKvTier::open(const std::string& dir, const std::string& store_name,
                                                       int64_t max_bytes) {
  if (max_bytes <= 0) return invalid_argument("--kv-offload-disk-gb must be positive");
  const fs::path path = fs::path(dir) / store_name;
  INFERD_RETURN_IF_ERROR(check_writable_dir(path.string(), "--kv-offload-dir"));
  std::unique_ptr<DiskKvTier> tier(new DiskKvTier(path.string(), max_bytes));
  tier->index_existing();
  return tier;
}

void DiskKvTier::index_existing() {
  struct Found {
    fs::file_time_type time;
    BlockHash key;
    int64_t bytes;
  };
  std::vector<Found> found;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(path_, ec)) {
    const fs::path& p = entry.path();
    BlockHash key;
    if (p.extension() != kSuffix || !key_from_name(p.stem().string(), &key)) {
      if (p.extension() == ".tmp") fs::remove(p, ec);  // a write cut short by a crash
      continue;
    }
    std::error_code e1, e2;
    const auto size = entry.file_size(e1);
    const auto time = entry.last_write_time(e2);
    if (!e1 && !e2) found.push_back({time, key, static_cast<int64_t>(size)});
  }
  std::sort(found.begin(), found.end(), [](const Found& a, const Found& b) { return a.time < b.time; });
  std::vector<std::string> doomed;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const Found& f : found) note_locked(f.key, f.bytes);
    evict_locked(&doomed);
  }
  for (const auto& f : doomed) ::unlink(f.c_str());
}

std::string DiskKvTier::file_of(const BlockHash& key) const {
  return path_ + "/" + hex_of(key) + kSuffix;
}

void DiskKvTier::note_locked(const BlockHash& key, int64_t bytes) {
  auto it = index_.find(key);
  if (it != index_.end()) {
    total_bytes_ += bytes - it->second.bytes;
    it->second.bytes = bytes;
    lru_.splice(lru_.end(), lru_, it->second.lru);
    return;
  }
  lru_.push_back(key);
  index_.emplace(key, Entry{bytes, std::prev(lru_.end())});
  total_bytes_ += bytes;
}

void DiskKvTier::evict_locked(std::vector<std::string>* doomed) {
  while (total_bytes_ > max_bytes_ && !lru_.empty()) {
    const BlockHash key = lru_.front();
    lru_.pop_front();
    auto it = index_.find(key);
    total_bytes_ -= it->second.bytes;
    index_.erase(it);
    doomed->push_back(file_of(key));
  }
}

bool DiskKvTier::put(const BlockHash& key, std::span<const std::byte> record) {
  const std::string final_name = file_of(key);
  const std::string tmp = final_name + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    ++stats().failures;
    return false;
  }
  const bool ok = write_all(fd, record.data(), record.size());
  ::close(fd);
  if (!ok || ::rename(tmp.c_str(), final_name.c_str()) != 0) {
    ::unlink(tmp.c_str());
    ++stats().failures;
    return false;
  }
  std::vector<std::string> doomed;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    note_locked(key, static_cast<int64_t>(record.size()));
    evict_locked(&doomed);
  }
  for (const auto& f : doomed) ::unlink(f.c_str());
  return true;
}

void DiskKvTier::get(std::span<const BlockHash> keys, const Take& take) {
  for (const BlockHash& key : keys) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (index_.find(key) == index_.end()) return;
    }
    const int fd = ::open(file_of(key).c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;  // removed by eviction meanwhile: a miss
    struct stat st {};
    bool ok = ::fstat(fd, &st) == 0;
    if (ok) {
      read_buffer_.resize(static_cast<size_t>(st.st_size));
      size_t done = 0;
      while (ok && done < read_buffer_.size()) {
        const ssize_t r = ::read(fd, read_buffer_.data() + done, read_buffer_.size() - done);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) ok = false;
        if (r > 0) done += static_cast<size_t>(r);
      }
    }
    ::close(fd);
    if (!ok) {
      ++stats().failures;
      return;
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (index_.count(key) != 0) note_locked(key, static_cast<int64_t>(read_buffer_.size()));
    }
    if (!take(read_buffer_)) return;
  }
}

void DiskKvTier::remove(const BlockHash& key) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = index_.find(key);
    if (it == index_.end()) return;
    total_bytes_ -= it->second.bytes;
    lru_.erase(it->second.lru);
    index_.erase(it);
  }
  ::unlink(file_of(key).c_str());
}

int64_t DiskKvTier::num_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return total_bytes_;
}

int64_t DiskKvTier::num_records() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<int64_t>(index_.size());
}

}  // namespace inferd
