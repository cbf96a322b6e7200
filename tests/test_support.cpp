#include "test_support.h"

#include <gtest/gtest.h>

#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string_view>
#include <thread>

#include "common/half.h"
#include "tensor/dequantize.h"

namespace inferd::test {

std::vector<Isa> runnable_paths() {
  std::vector<Isa> paths;
  for (int i = 0; i <= static_cast<int>(detected_isa()); ++i) paths.push_back(static_cast<Isa>(i));
  return paths;
}

std::vector<AmxUnit> amx_units(bool bf16) {
  std::vector<AmxUnit> units;
  if (bf16 ? cpu_has_amx_bf16() : detected_isa() == Isa::kAmx) units.push_back({false, "the CPU's tiles"});
  if (static_cast<int>(detected_isa()) >= static_cast<int>(Isa::kVnni))
    units.push_back({true, "emulated tiles"});
  return units;
}

bool amx_only_emulated() {
  return detected_isa() != Isa::kAmx && static_cast<int>(detected_isa()) >= static_cast<int>(Isa::kVnni);
}

std::string fixture_path(const std::string& relative) {
  return std::string(INFERD_FIXTURES_DIR) + "/" + relative;
}

std::vector<std::byte> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << "cannot open " << path;
  std::vector<char> buf((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> out(buf.size());
  if (!buf.empty()) std::memcpy(out.data(), buf.data(), buf.size());
  return out;
}

std::vector<float> read_f32(const std::string& path) {
  auto bytes = read_bytes(path);
  std::vector<float> out(bytes.size() / 4);
  if (!out.empty()) std::memcpy(out.data(), bytes.data(), out.size() * 4);
  return out;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write_bytes(const std::string& path, const std::vector<std::byte>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

bool prerequisites_required() {
  const char* ci = std::getenv("CI");
  return (ci != nullptr && std::string_view(ci) == "true") ||
         std::getenv("INFERD_REQUIRE_PREREQUISITES") != nullptr;
}

std::unique_ptr<Tokenizer> tiny_qwen_style_tokenizer() {
  auto vocab = vocab_from_hf_dir(fixture_path("tokenizer/tiny_qwen_style"));
  EXPECT_TRUE(vocab.has_value()) << vocab.status().message();
  auto tok = Tokenizer::create(std::move(*vocab));
  EXPECT_TRUE(tok.has_value()) << tok.status().message();
  return std::move(*tok);
}

std::string python() {
  return INFERD_PYTHON;
}

std::string temp_dir() {
  static int counter = 0;
  auto dir = std::filesystem::temp_directory_path() /
             ("inferd_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

std::vector<float> random_floats(size_t n, std::mt19937& rng, float lo, float hi) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

namespace {
void put_f16(std::byte* p, float v) {
  const uint16_t h = f32_to_f16(v);
  std::memcpy(p, &h, 2);
}
}  // namespace

TensorView random_tensor(DType dtype, int64_t rows, int64_t cols, std::mt19937& rng,
                         std::vector<std::byte>* storage) {
  const DTypeInfo& info = dtype_info(dtype);
  const size_t row_bytes = static_cast<size_t>(dtype_bytes(dtype, cols));
  storage->assign(row_bytes * static_cast<size_t>(rows), std::byte{0});
  std::uniform_int_distribution<int> byte_dist(0, 255);
  std::uniform_real_distribution<float> scale(-0.05f, 0.05f);
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  std::byte* p = storage->data();
  const int64_t n = rows * cols;
  const float* scales = nullptr;  // I8 / F8_E4M3: after the data in `storage`
  switch (dtype) {
    case DType::kF32:
      for (int64_t i = 0; i < n; ++i) {
        const float v = value(rng);
        std::memcpy(p + 4 * i, &v, 4);
      }
      break;
    case DType::kF16:
      for (int64_t i = 0; i < n; ++i) put_f16(p + 2 * i, value(rng));
      break;
    case DType::kBF16:
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t b = f32_to_bf16(value(rng));
        std::memcpy(p + 2 * i, &b, 2);
      }
      break;
    case DType::kI8:
    case DType::kF8_E4M3: {
      // Random bytes (FP8: no NaN code), then per-row scales after the data, 4-byte aligned.
      for (int64_t i = 0; i < n; ++i) {
        auto b = static_cast<uint8_t>(byte_dist(rng));
        if (dtype == DType::kF8_E4M3 && (b & 0x7f) == 0x7f) b = static_cast<uint8_t>(b - 1);
        p[i] = static_cast<std::byte>(b);
      }
      const size_t scales_at = (row_bytes * static_cast<size_t>(rows) + 3) / 4 * 4;
      storage->resize(scales_at + static_cast<size_t>(rows) * sizeof(float));
      std::uniform_real_distribution<float> row_scale(0.001f, 0.02f);
      for (int64_t r = 0; r < rows; ++r) {
        const float v = row_scale(rng);
        std::memcpy(storage->data() + scales_at + static_cast<size_t>(r) * sizeof(float), &v, sizeof v);
      }
      scales = reinterpret_cast<const float*>(storage->data() + scales_at);
      break;
    }
    default: {
      for (auto& b : *storage) b = static_cast<std::byte>(byte_dist(rng));
      const int64_t num_blocks = n / info.block_values;
      for (int64_t i = 0; i < num_blocks; ++i) {
        std::byte* blk = p + i * info.block_bytes;
        switch (dtype) {
          case DType::kQ4_1:
          case DType::kQ5_1:
          case DType::kQ4_K:
          case DType::kQ5_K:
          case DType::kQ4_G128:
          case DType::kQ4_G64:
            put_f16(blk, scale(rng));
            put_f16(blk + 2, scale(rng));
            break;
          case DType::kQ6_K: put_f16(blk + 208, scale(rng)); break;
          case DType::kQ2_K:
            put_f16(blk + 80, scale(rng));
            put_f16(blk + 82, scale(rng));
            break;
          case DType::kQ3_K: put_f16(blk + 108, scale(rng)); break;
          case DType::kIQ1_M: {  // d's nibbles are the top nibbles of the four u16 scales
            std::byte d[2];
            put_f16(d, scale(rng));
            uint16_t bits;
            std::memcpy(&bits, d, 2);
            for (int j = 0; j < 4; ++j) {
              uint16_t sc;
              std::memcpy(&sc, blk + 48 + 2 * j, 2);
              sc = static_cast<uint16_t>((sc & 0x0fff) | (((bits >> (4 * j)) & 0x0f) << 12));
              std::memcpy(blk + 48 + 2 * j, &sc, 2);
            }
            break;
          }
          case DType::kTQ1_0: put_f16(blk + 52, scale(rng)); break;
          case DType::kTQ2_0: put_f16(blk + 64, scale(rng)); break;
          default: put_f16(blk, scale(rng)); break;
        }
      }
    }
  }
  TensorView t;
  t.name = "random";
  t.dtype = dtype;
  t.num_dims = 2;
  t.shape = {rows, cols, 1, 1};
  t.data = storage->data();
  t.num_bytes = row_bytes * static_cast<size_t>(rows);
  t.row_scale = scales;
  return t;
}

std::vector<double> double_product(const TensorView& w, const std::vector<float>& x, int64_t tokens,
                                   const float* bias, bool x_bf16) {
  const int64_t n = w.num_rows(), k = w.row_length();
  std::vector<float> row(static_cast<size_t>(k));
  std::vector<double> y(static_cast<size_t>(tokens * n));
  for (int64_t r = 0; r < n; ++r) {
    dequantize_tensor_row(w, r, row.data());
    for (int64_t t = 0; t < tokens; ++t) {
      double acc = bias != nullptr ? bias[r] : 0.0;
      for (int64_t i = 0; i < k; ++i) {
        float xv = x[static_cast<size_t>(t * k + i)];
        if (x_bf16) xv = bf16_to_f32(f32_to_bf16(xv));
        acc += static_cast<double>(row[static_cast<size_t>(i)]) * xv;
      }
      y[static_cast<size_t>(t * n + r)] = acc;
    }
  }
  return y;
}

double relative_max_error(const float* a, const float* b, size_t n) {
  double max_diff = 0, max_ref = 0;
  for (size_t i = 0; i < n; ++i) {
    max_diff = std::max(max_diff, std::fabs(static_cast<double>(a[i]) - b[i]));
    max_ref = std::max(max_ref, std::fabs(static_cast<double>(b[i])));
  }
  return max_ref > 0 ? max_diff / max_ref : max_diff;
}

namespace {
// resize + memcpy rather than insert: GCC 12 warns falsely about insert of a few bytes.
void append_raw(std::vector<std::byte>* out, const void* p, size_t n) {
  const size_t at = out->size();
  out->resize(at + n);
  if (n > 0) std::memcpy(out->data() + at, p, n);
}
template <typename T>
void append(std::vector<std::byte>* out, T v) {
  append_raw(out, &v, sizeof(T));
}
void append_string(std::vector<std::byte>* out, const std::string& s) {
  append<uint64_t>(out, s.size());
  append_raw(out, s.data(), s.size());
}
}  // namespace

void GgufWriter::add_u32(const std::string& key, uint32_t v) {
  append_string(&kv_, key);
  append<uint32_t>(&kv_, 4);
  append(&kv_, v);
  ++num_kv_;
}
void GgufWriter::add_f32(const std::string& key, float v) {
  append_string(&kv_, key);
  append<uint32_t>(&kv_, 6);
  append(&kv_, v);
  ++num_kv_;
}
void GgufWriter::add_string(const std::string& key, const std::string& v) {
  append_string(&kv_, key);
  append<uint32_t>(&kv_, 8);
  append_string(&kv_, v);
  ++num_kv_;
}
void GgufWriter::add_string_array(const std::string& key, const std::vector<std::string>& v) {
  append_string(&kv_, key);
  append<uint32_t>(&kv_, 9);
  append<uint32_t>(&kv_, 8);
  append<uint64_t>(&kv_, v.size());
  for (const auto& s : v) append_string(&kv_, s);
  ++num_kv_;
}
void GgufWriter::add_tensor(const std::string& name, std::vector<int64_t> shape, uint32_t ggml_type,
                            std::vector<std::byte> data) {
  tensors_.push_back({name, std::move(shape), ggml_type, std::move(data)});
}

std::vector<std::byte> GgufWriter::bytes() const {
  std::vector<std::byte> out;
  append<uint32_t>(&out, 0x46554747);
  append<uint32_t>(&out, 3);
  append<uint64_t>(&out, tensors_.size());
  append<uint64_t>(&out, num_kv_);
  append_raw(&out, kv_.data(), kv_.size());
  uint64_t offset = 0;
  std::vector<uint64_t> offsets;
  for (const auto& t : tensors_) {
    append_string(&out, t.name);
    append<uint32_t>(&out, static_cast<uint32_t>(t.shape.size()));
    for (auto it = t.shape.rbegin(); it != t.shape.rend(); ++it)
      append<uint64_t>(&out, static_cast<uint64_t>(*it));
    append<uint32_t>(&out, t.type);
    append<uint64_t>(&out, offset);
    offsets.push_back(offset);
    offset += (t.data.size() + 31) / 32 * 32;
  }
  out.resize((out.size() + 31) / 32 * 32, std::byte{0});
  const size_t base = out.size();
  for (size_t i = 0; i < tensors_.size(); ++i) {
    out.resize(base + offsets[i], std::byte{0});
    append_raw(&out, tensors_[i].data.data(), tensors_[i].data.size());
  }
  return out;
}

namespace {
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    if (fd >= 0) ::close(fd);
    return 0;
  }
  ::close(fd);
  return ntohs(a.sin_port);
}
constexpr const char* kRedisServer = "/usr/bin/redis-server";
constexpr const char* kRedisCli = "/usr/bin/redis-cli";
}  // namespace

RedisServer::RedisServer() : port_(free_port()) {}

RedisServer::~RedisServer() {
  if (pid_ > 0) {
    ::kill(pid_, SIGTERM);
    ::waitpid(pid_, nullptr, 0);
  }
}

bool RedisServer::available() {
  return ::access(kRedisServer, X_OK) == 0 && ::access(kRedisCli, X_OK) == 0;
}

bool RedisServer::start() {
  if (pid_ > 0 || port_ == 0) return false;
  const std::string port = std::to_string(port_);
  pid_ = ::fork();
  if (pid_ == 0) {
    // Dies with the test process (an aborted test must not leave a server holding ctest's pipe).
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    // No persistence: the test owns everything it stores.
    ::execl(kRedisServer, kRedisServer, "--port", port.c_str(), "--bind", "127.0.0.1", "--save", "",
            "--appendonly", "no", "--loglevel", "warning", static_cast<char*>(nullptr));
    ::_exit(127);
  }
  if (pid_ < 0) return false;
  for (int i = 0; i < 200; ++i) {
    if (cli("PING").find("PONG") != std::string::npos) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  return false;
}

void RedisServer::kill() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGKILL);
  ::waitpid(pid_, nullptr, 0);
  pid_ = -1;
}

std::string RedisServer::cli(const std::string& args) const {
  const std::string command = std::string(kRedisCli) + " -p " + std::to_string(port_) + " " + args + " 2>&1";
  std::string out;
  if (FILE* p = ::popen(command.c_str(), "r")) {
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
    ::pclose(p);
  }
  return out;
}

}  // namespace inferd::test
