#include "kv/redis_kv_tier.h"

#include <hiredis/hiredis.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "common/log.h"
#include "kv/kv_record.h"

namespace inferd {

namespace {

constexpr std::chrono::milliseconds kConnectTimeout{200};
constexpr std::chrono::milliseconds kReadTimeout{250};    // engine thread: a slow Redis is a miss
constexpr std::chrono::milliseconds kWriteTimeout{2000};  // writer thread
constexpr std::chrono::seconds kRetryEvery{2};
constexpr size_t kPipelineDepth = 8;

timeval to_timeval(std::chrono::milliseconds ms) {
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(ms.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((ms.count() % 1000) * 1000);
  return tv;
}

struct ReplyDeleter {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using Reply = std::unique_ptr<redisReply, ReplyDeleter>;

Reply command(redisContext* ctx, const char* format, auto... args) {
  return Reply(static_cast<redisReply*>(redisCommand(ctx, format, args...)));
}

bool parse_int(const std::string& s, int lo, int hi, int* out) {
  if (s.empty() || s.size() > 9) return false;
  int v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + (c - '0');
  }
  if (v < lo || v > hi) return false;
  *out = v;
  return true;
}

}  // namespace

Expected<RedisUrl> RedisUrl::parse(const std::string& url) {
  const std::string scheme = "redis://";
  const auto bad = [&](const std::string& why) {
    return invalid_argument("--kv-offload-redis '" + url + "': " + why +
                            " (expected redis://[:password@]host[:port][/db])");
  };
  if (url.rfind(scheme, 0) != 0) return bad("not a redis:// URL");
  std::string rest = url.substr(scheme.size());
  RedisUrl out;
  if (auto at = rest.rfind('@'); at != std::string::npos) {
    std::string auth = rest.substr(0, at);
    rest = rest.substr(at + 1);
    if (auto colon = auth.find(':'); colon != std::string::npos) auth = auth.substr(colon + 1);
    out.password = auth;
  }
  if (auto slash = rest.find('/'); slash != std::string::npos) {
    const std::string db = rest.substr(slash + 1);
    rest = rest.substr(0, slash);
    if (!db.empty() && !parse_int(db, 0, 1 << 20, &out.db))
      return bad("database '" + db + "' is not a number");
  }
  if (auto colon = rest.rfind(':'); colon != std::string::npos) {
    if (!parse_int(rest.substr(colon + 1), 1, 65535, &out.port)) return bad("bad port");
    rest = rest.substr(0, colon);
  }
  if (!rest.empty()) out.host = rest;
  return out;
}

Expected<std::unique_ptr<RedisKvTier>> RedisKvTier::open(const std::string& url,
                                                         const std::string& store_name) {
  INFERD_ASSIGN_OR_RETURN(RedisUrl parsed, RedisUrl::parse(url));
  std::unique_ptr<RedisKvTier> tier(new RedisKvTier(url, parsed, "inferd:kv:" + store_name + ":"));
  std::string error;
  tier->writer_ = tier->connect(kWriteTimeout, &error);
  if (tier->writer_ == nullptr) {
    log_warning("KV offload to Redis " + url + ": " + error + "; running without it until it answers");
    tier->next_attempt_ = std::chrono::steady_clock::now() + kRetryEvery;
  } else {
    tier->up_ = true;
  }
  return tier;
}

RedisKvTier::RedisKvTier(std::string url_text, RedisUrl url, std::string prefix)
    : url_text_(std::move(url_text)), url_(std::move(url)), prefix_(std::move(prefix)) {}

RedisKvTier::~RedisKvTier() {
  if (writer_ != nullptr) redisFree(writer_);
  if (reader_ != nullptr) redisFree(reader_);
}

redisContext* RedisKvTier::connect(std::chrono::milliseconds timeout, std::string* error) const {
  redisContext* ctx = redisConnectWithTimeout(url_.host.c_str(), url_.port, to_timeval(kConnectTimeout));
  if (ctx == nullptr) {
    *error = "cannot allocate a connection";
    return nullptr;
  }
  auto failed = [&](const std::string& why) {
    *error = why;
    redisFree(ctx);
    return nullptr;
  };
  if (ctx->err != 0) return failed(ctx->errstr);
  if (redisSetTimeout(ctx, to_timeval(timeout)) != REDIS_OK) return failed("cannot set a timeout");
  if (!url_.password.empty()) {
    Reply r = command(ctx, "AUTH %s", url_.password.c_str());
    if (!r || r->type == REDIS_REPLY_ERROR) return failed(r ? std::string(r->str, r->len) : ctx->errstr);
  }
  if (url_.db != 0) {
    Reply r = command(ctx, "SELECT %d", url_.db);
    if (!r || r->type == REDIS_REPLY_ERROR) return failed(r ? std::string(r->str, r->len) : ctx->errstr);
  }
  Reply r = command(ctx, "PING");
  if (!r || r->type == REDIS_REPLY_ERROR) return failed(r ? std::string(r->str, r->len) : ctx->errstr);
  return ctx;
}

std::string RedisKvTier::key_of(const BlockHash& key) const {
  return prefix_ + hex_of(key);
}

void RedisKvTier::fail(redisContext** ctx, const std::string& what) {
  std::string why = what;
  if (*ctx != nullptr) {
    if ((*ctx)->err != 0) why += std::string(": ") + (*ctx)->errstr;
    redisFree(*ctx);
    *ctx = nullptr;
  }
  ++stats().failures;
  if (up_.exchange(false)) {
    log_warning("KV offload to Redis " + url_text_ + " failed (" + why +
                "); running without it until it answers");
  }
}

bool RedisKvTier::put(const BlockHash& key, std::span<const std::byte> record) {
  if (!up_ || writer_ == nullptr) {
    ++stats().failures;  // skipped while down
    return false;
  }
  const std::string k = key_of(key);
  Reply r = command(writer_, "SET %b %b", k.data(), k.size(), record.data(), record.size());
  if (!r || r->type == REDIS_REPLY_ERROR) {
    fail(&writer_, r ? "SET: " + std::string(r->str, r->len) : "SET");
    return false;
  }
  return true;
}

void RedisKvTier::maintain() {
  const auto now = std::chrono::steady_clock::now();
  if (now < next_attempt_) return;
  next_attempt_ = now + kRetryEvery;
  if (writer_ != nullptr) {
    Reply r = command(writer_, "PING");
    if (r && r->type != REDIS_REPLY_ERROR) {
      if (!up_.exchange(true)) log_info("KV offload to Redis " + url_text_ + " is back");
      return;
    }
    fail(&writer_, "PING");
  }
  std::string error;
  writer_ = connect(kWriteTimeout, &error);
  if (writer_ != nullptr && !up_.exchange(true)) log_info("KV offload to Redis " + url_text_ + " is back");
}

void RedisKvTier::get(std::span<const BlockHash> keys, const Take& take) {
  if (!up_) return;
  if (reader_ == nullptr) {
    std::string error;
    reader_ = connect(kReadTimeout, &error);
    if (reader_ == nullptr) return fail(&reader_, error);
  }
  // Pipelined in small rounds: most lookups stop at the first few keys.
  std::string k;
  for (size_t start = 0; start < keys.size(); start += kPipelineDepth) {
    const size_t n = std::min(kPipelineDepth, keys.size() - start);
    for (size_t i = 0; i < n; ++i) {
      k = key_of(keys[start + i]);
      if (redisAppendCommand(reader_, "GET %b", k.data(), k.size()) != REDIS_OK) return fail(&reader_, "GET");
    }
    bool going = true;
    for (size_t i = 0; i < n; ++i) {  // every reply is read, even after a miss, to keep the stream in step
      void* raw = nullptr;
      if (redisGetReply(reader_, &raw) != REDIS_OK) return fail(&reader_, "GET");
      Reply r(static_cast<redisReply*>(raw));
      if (!going) continue;
      if (r->type != REDIS_REPLY_STRING) {
        going = false;
        continue;
      }
      going = take(std::span<const std::byte>(reinterpret_cast<const std::byte*>(r->str), r->len));
    }
    if (!going) return;
  }
}

void RedisKvTier::remove(const BlockHash& key) {
  if (!up_ || reader_ == nullptr) return;
  const std::string k = key_of(key);
  Reply r = command(reader_, "DEL %b", k.data(), k.size());
  if (!r) fail(&reader_, "DEL");
}

}  // namespace inferd
