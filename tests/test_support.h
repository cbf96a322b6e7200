// Helpers shared by the tests: fixture paths, file I/O, random weights, a GGUF writer.
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu_isa.h"
#include "tensor/tensor_view.h"
#include "tokenizer/tokenizer.h"

namespace inferd::test {

std::string fixture_path(const std::string& relative);
// Every kernel path this CPU can run, scalar first.
std::vector<Isa> runnable_paths();
// The tile units a test of the AMX path runs on here: the CPU's (where it has AMX-INT8, or
// AMX-BF16 for `bf16`) and the emulated one (kernels/amx_emulator.h) wherever the VNNI path runs.
struct AmxUnit {
  bool emulated;
  std::string name;
};
std::vector<AmxUnit> amx_units(bool bf16);
// Whether Isa::kAmx runs here only on the emulated tile unit.
bool amx_only_emulated();
// AMX emulation on (if `on`) for the guard's lifetime; off again after.
class ScopedAmxEmulation final {
 public:
  explicit ScopedAmxEmulation(bool on) : on_(on) {
    if (on_) set_amx_emulation(true);
  }
  ~ScopedAmxEmulation() {
    if (on_) set_amx_emulation(false);
  }
  ScopedAmxEmulation(const ScopedAmxEmulation&) = delete;
  ScopedAmxEmulation& operator=(const ScopedAmxEmulation&) = delete;

 private:
  bool on_;
};
std::vector<std::byte> read_bytes(const std::string& path);
std::vector<float> read_f32(const std::string& path);
std::string read_text(const std::string& path);
void write_bytes(const std::string& path, const std::vector<std::byte>& bytes);
// A fresh empty directory under the system temp dir.
std::string temp_dir();

// Whether a missing prerequisite (the default model, redis-server, a PyPI package) must fail the
// test rather than skip it: in CI (CI=true) and in scripts/test (INFERD_REQUIRE_PREREQUISITES).
bool prerequisites_required();
// The small Qwen-style byte-level BPE tokenizer of tests/fixtures/tokenizer/tiny_qwen_style.
std::unique_ptr<Tokenizer> tiny_qwen_style_tokenizer();

// The Python that has the project's PyPI packages (the checkout's .venv when scripts/setup made it).
std::string python();

// A real redis-server (Debian's) on a free loopback port, run as a child process for one test:
// started by start(), killed hard by kill() (a crash), stopped cleanly by the destructor.
class RedisServer {
 public:
  RedisServer();
  ~RedisServer();
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;
  // Whether the redis-server binary exists (tests skip, saying so, when it does not).
  static bool available();
  // Starts it (again, on the same port) and waits until it answers PING; false on failure.
  bool start();
  void kill();
  int port() const { return port_; }
  std::string url() const { return "redis://127.0.0.1:" + std::to_string(port_); }
  // Runs one command (e.g. "SET k v") through redis-cli and returns its output.
  std::string cli(const std::string& args) const;

 private:
  int port_;
  int pid_ = -1;
};

// Random weights of `dtype`, `rows` x `cols` (cols a multiple of the block size), with random
// quant bytes and moderate finite scales. The TensorView points into `storage` (row-scaled
// dtypes: their row scales too, after the data).
TensorView random_tensor(DType dtype, int64_t rows, int64_t cols, std::mt19937& rng,
                         std::vector<std::byte>* storage);

// y[t, r] = bias[r] + sum_i w[r, i] x[t, i] in double, w dequantized (row scales applied); x
// rounded to bf16 first when `x_bf16` (what a bf16 GEMM multiplies).
std::vector<double> double_product(const TensorView& w, const std::vector<float>& x, int64_t tokens,
                                   const float* bias, bool x_bf16 = false);

std::vector<float> random_floats(size_t n, std::mt19937& rng, float lo = -1.0f, float hi = 1.0f);

// max |a - b| / max |b|.
double relative_max_error(const float* a, const float* b, size_t n);

// Writes GGUF v3 bytes: add metadata and tensors, then bytes().
class GgufWriter {
 public:
  void add_u32(const std::string& key, uint32_t v);
  void add_f32(const std::string& key, float v);
  void add_string(const std::string& key, const std::string& v);
  void add_string_array(const std::string& key, const std::vector<std::string>& v);
  // `data` holds the tensor's raw bytes; shape outermost first.
  void add_tensor(const std::string& name, std::vector<int64_t> shape, uint32_t ggml_type,
                  std::vector<std::byte> data);
  std::vector<std::byte> bytes() const;

 private:
  struct Tensor {
    std::string name;
    std::vector<int64_t> shape;
    uint32_t type;
    std::vector<std::byte> data;
  };
  std::vector<std::byte> kv_;
  uint64_t num_kv_ = 0;
  std::vector<Tensor> tensors_;
};

// Built with AddressSanitizer (scripts/test's second pass, ~10x slower): the few whole-model
// checks that run minutes there use smaller corpora, or run only in the Release pass when smaller
// tests cover the same code under the sanitizers.
#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kSanitizerBuild = true;
#else
inline constexpr bool kSanitizerBuild = false;
#endif

}  // namespace inferd::test

// Skips the test when `available` is false, saying `what` is missing; fails it instead where
// prerequisites are required (see prerequisites_required()).
#define INFERD_REQUIRE_OR_SKIP(available, what)                                                 \
  do {                                                                                          \
    if (!(available)) {                                                                         \
      if (::inferd::test::prerequisites_required()) FAIL() << "missing prerequisite: " << what; \
      GTEST_SKIP() << what;                                                                     \
    }                                                                                           \
  } while (0)
