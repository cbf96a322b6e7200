// RedisKvTier: offloaded KV blocks as Redis values under "inferd:kv:<store>:<key>", so every
// inferd process serving the same model and cache layout shares them (hiredis from Debian). Two
// connections: the writer thread's (SET) and the engine thread's (pipelined GET, DEL), each with
// a short timeout. Any error or timeout marks the tier down with one warning; the writer thread
// PINGs every couple of seconds and brings it back. While down, lookups miss and writes are
// skipped (counted as failures): users see recomputation, never an error.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <string>

#include "common/status.h"
#include "kv/kv_tier.h"

struct redisContext;

namespace inferd {

// redis://[:password@]host[:port][/db]
struct RedisUrl {
  std::string host = "127.0.0.1";
  int port = 6379;
  std::string password;
  int db = 0;
  static Expected<RedisUrl> parse(const std::string& url);
};

class RedisKvTier final : public KvTier {
 public:
  // Connects (a Redis that is down at start is retried later, with a warning now).
  static Expected<std::unique_ptr<RedisKvTier>> open(const std::string& url, const std::string& store_name);
  ~RedisKvTier() override;

  const char* name() const override { return "redis"; }
  bool up() const override { return up_.load(); }
  bool put(const BlockHash& key, std::span<const std::byte> record) override;
  void maintain() override;
  void get(std::span<const BlockHash> keys, const Take& take) override;
  void remove(const BlockHash& key) override;

 private:
  RedisKvTier(std::string url_text, RedisUrl url, std::string prefix);
  // Opens a connection with the given command timeout; nullptr (and `error`) on failure.
  redisContext* connect(std::chrono::milliseconds timeout, std::string* error) const;
  std::string key_of(const BlockHash& key) const;
  // Marks the tier down (warning once) and drops `*ctx`.
  void fail(redisContext** ctx, const std::string& what);

  std::string url_text_;
  RedisUrl url_;
  std::string prefix_;
  std::atomic<bool> up_{false};
  redisContext* writer_ = nullptr;                        // writer thread
  redisContext* reader_ = nullptr;                        // engine thread
  std::chrono::steady_clock::time_point next_attempt_{};  // writer thread
};

}  // namespace inferd
