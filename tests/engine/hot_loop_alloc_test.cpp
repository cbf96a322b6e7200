// The hot step loop allocates nothing once warm (STYLE: "no allocation in the hot step loop").
// This executable replaces the global operator new and wraps the C allocation functions
// (-Wl,--wrap, CMakeLists.txt) to count every heap allocation made while counting is on, on any
// thread (the thread pool's workers included). INFERD_ALLOC_TRACE=1 prints the stack of each
// counted allocation, to find the one a failure reports.
#include <execinfo.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <initializer_list>
#include <map>
#include <new>
#include <random>

#include "engine/engine.h"
#include "model/default_model.h"
#include "model/model_loader.h"
#include "test_support.h"

namespace {

std::atomic<bool> g_counting{false};
std::atomic<int64_t> g_allocations{0};
bool g_trace = false;
thread_local bool t_in_trace = false;

extern "C" void* __real_malloc(size_t n);
extern "C" void* __real_aligned_alloc(size_t align, size_t n);

void count_allocation() {
  if (!g_counting.load(std::memory_order_relaxed)) return;
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (g_trace && !t_in_trace) {
    t_in_trace = true;  // backtrace() may allocate on its first call
    void* frames[32];
    const int n = backtrace(frames, 32);
    static const char kHeader[] = "--- allocation while counting:\n";
    [[maybe_unused]] const ssize_t w = write(2, kHeader, sizeof(kHeader) - 1);
    backtrace_symbols_fd(frames, n, 2);
    t_in_trace = false;
  }
}

void* allocate(std::size_t n) {
  count_allocation();
  void* p = __real_malloc(n == 0 ? 1 : n);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}

void* allocate_aligned(std::size_t n, std::align_val_t align) {
  count_allocation();
  const auto a = static_cast<std::size_t>(align);
  const std::size_t rounded = (n + a - 1) / a * a;
  void* p = __real_aligned_alloc(a, rounded == 0 ? a : rounded);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}

// Counts the allocations made while it lives.
class AllocationCounter {
 public:
  AllocationCounter() {
    g_allocations.store(0);
    g_counting.store(true);
  }
  ~AllocationCounter() { g_counting.store(false); }
  int64_t count() const { return g_allocations.load(); }
};

}  // namespace

// The C functions our code calls, renamed to these by the linker's --wrap.
extern "C" {
void* __real_calloc(size_t n, size_t size);
void* __real_realloc(void* p, size_t n);
int __real_posix_memalign(void** p, size_t align, size_t n);
void* __wrap_malloc(size_t n) {
  count_allocation();
  return __real_malloc(n);
}
void* __wrap_calloc(size_t n, size_t size) {
  count_allocation();
  return __real_calloc(n, size);
}
void* __wrap_realloc(void* p, size_t n) {
  count_allocation();
  return __real_realloc(p, n);
}
void* __wrap_aligned_alloc(size_t align, size_t n) {
  count_allocation();
  return __real_aligned_alloc(align, n);
}
int __wrap_posix_memalign(void** p, size_t align, size_t n) {
  count_allocation();
  return __real_posix_memalign(p, align, n);
}
}

void* operator new(std::size_t n) {
  return allocate(n);
}
void* operator new[](std::size_t n) {
  return allocate(n);
}
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  count_allocation();
  return __real_malloc(n == 0 ? 1 : n);
}
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept {
  count_allocation();
  return __real_malloc(n == 0 ? 1 : n);
}
void* operator new(std::size_t n, std::align_val_t a) {
  return allocate_aligned(n, a);
}
void* operator new[](std::size_t n, std::align_val_t a) {
  return allocate_aligned(n, a);
}
void operator delete(void* p) noexcept {
  std::free(p);
}
void operator delete[](void* p) noexcept {
  std::free(p);
}
void operator delete(void* p, std::size_t) noexcept {
  std::free(p);
}
void operator delete[](void* p, std::size_t) noexcept {
  std::free(p);
}
void operator delete(void* p, std::align_val_t) noexcept {
  std::free(p);
}
void operator delete[](void* p, std::align_val_t) noexcept {
  std::free(p);
}
void operator delete(void* p, std::size_t, std::align_val_t) noexcept {
  std::free(p);
}
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept {
  std::free(p);
}

namespace inferd {
namespace {

class HotLoopAllocTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* trace = std::getenv("INFERD_ALLOC_TRACE");
    g_trace = trace != nullptr && std::string(trace) == "1";
  }
};

// The counter sees what it should: an allocation inside its scope counts, on this thread and on
// another one, and nothing outside it does.
TEST_F(HotLoopAllocTest, CounterSeesAllocations) {
  std::vector<int>* outside = new std::vector<int>(100);
  {
    AllocationCounter counter;
    EXPECT_EQ(counter.count(), 0);
    std::vector<int> v(100);
    EXPECT_EQ(counter.count(), 1);
    void* volatile p = std::malloc(64);  // volatile: the pair is not optimized away
    EXPECT_EQ(counter.count(), 2);
    std::free(p);
    ThreadPool pool(2);  // its threads and state: allocations of its own
    const int64_t before = counter.count();
    EXPECT_GT(before, 2);
    std::atomic<int> done{0};
    pool.parallel_for(2, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        auto* q = new int(7);
        delete q;
        done.fetch_add(1);
      }
    });
    EXPECT_EQ(done.load(), 2);
    EXPECT_GE(counter.count(), before + 2);
  }
  delete outside;
}

// The four requests' sampling: greedy; top-k + top-p; min-p with penalties and logit bias;
// greedy again.
std::vector<SamplingParams> sampling_variants() {
  SamplingParams random;
  random.temperature = 0.8f;
  random.top_k = 40;
  random.top_p = 0.9f;
  random.seed = 7;
  SamplingParams penalized;
  penalized.temperature = 1.0f;
  penalized.min_p = 0.05f;
  penalized.repetition_penalty = 1.2f;
  penalized.presence_penalty = 0.5f;
  penalized.frequency_penalty = 0.3f;
  penalized.logit_bias = {{3, 2.0f}, {5, -100.0f}};
  penalized.seed = 11;
  return {SamplingParams{}, random, penalized, SamplingParams{}};
}

// Four requests (one per sampling variant) decode together. Once every prompt is computed and
// two more steps ran, each of the next kSteps steps must allocate nothing, and still give every
// request one token.
void expect_steady_decode_allocates_nothing(Transformer& model, const std::string& what,
                                            const EngineOptions& o) {
  Engine engine(model, o);
  std::mt19937 rng(5);
  const int64_t vocab = model.config().vocab_size;
  constexpr int kSteps = 24;
  const std::vector<SamplingParams> samplings = sampling_variants();
  std::map<RequestId, int64_t> generated;
  for (size_t i = 0; i < samplings.size(); ++i) {
    RequestSpec spec;
    const size_t len = 5 + 9 * i;  // prompts of different lengths, some over a block
    for (size_t k = 0; k < len; ++k) spec.prompt.push_back(static_cast<int32_t>(rng() % vocab));
    spec.sampling = samplings[i];
    spec.limits.max_tokens = 2 * kSteps + 8;
    spec.limits.ignore_eos = true;
    generated[engine.add(spec)] = 0;
  }
  // Prefill (one step: the budget covers every prompt), then warm-up decode steps.
  for (int step = 0; step < 3; ++step) {
    for (const StepOutput& s : engine.step()) {
      ASSERT_TRUE(s.error.empty()) << s.error;
      generated.at(s.id) += static_cast<int64_t>(s.new_tokens.size());
    }
  }
  for (const auto& [id, n] : generated) ASSERT_EQ(n, 3) << what << ": request " << id << " not decoding yet";
  for (int step = 0; step < kSteps; ++step) {
    int64_t allocations = 0;
    size_t outputs = 0;
    {
      AllocationCounter counter;
      for (const StepOutput& s : engine.step()) {
        ++outputs;
        ASSERT_EQ(s.new_tokens.size(), 1u);
        ASSERT_FALSE(s.finished);
      }
      allocations = counter.count();
    }
    EXPECT_EQ(outputs, generated.size()) << what << ", decode step " << step;
    ASSERT_EQ(allocations, 0) << what << ", decode step " << step
                              << " allocated (INFERD_ALLOC_TRACE=1 prints where)";
  }
}

// Three requests decode; then a long prompt arrives and is prefilled in chunks beside them (the
// step budget leaves 16 of its tokens per step). Its admission may allocate (the request, its
// sampler, its table, an output slot); every later step, chunk or decode, must not, the one that
// samples its first token included.
void expect_chunked_prefill_allocates_nothing(Transformer& model, const std::string& what, EngineOptions o) {
  constexpr int64_t kChunk = 16, kLongPrompt = 150;
  o.scheduler.max_num_batched_tokens = kChunk + 3;
  Engine engine(model, o);
  std::mt19937 rng(9);
  const int64_t vocab = model.config().vocab_size;
  auto spec = [&](size_t len, int64_t max_tokens) {
    RequestSpec s;
    for (size_t k = 0; k < len; ++k) s.prompt.push_back(static_cast<int32_t>(rng() % vocab));
    s.limits.max_tokens = max_tokens;
    s.limits.ignore_eos = true;
    return s;
  };
  for (size_t i = 0; i < 3; ++i) engine.add(spec(4 + 3 * i, 64));
  // Their prompts (4 + 7 + 10 tokens: two steps at this budget), then warm decode steps.
  for (int step = 0; step < 5; ++step) {
    for (const StepOutput& s : engine.step()) ASSERT_TRUE(s.error.empty()) << s.error;
  }
  const RequestId late = engine.add(spec(kLongPrompt, 16));
  for (const StepOutput& s : engine.step()) ASSERT_TRUE(s.error.empty()) << s.error;  // admission
  const int64_t chunk_steps = (kLongPrompt + kChunk - 1) / kChunk - 1;
  for (int64_t step = 0; step < chunk_steps + 3; ++step) {
    int64_t allocations = 0;
    bool late_output = false;
    {
      AllocationCounter counter;
      for (const StepOutput& s : engine.step()) {
        ASSERT_TRUE(s.error.empty()) << s.error;
        late_output = late_output || s.id == late;
      }
      allocations = counter.count();
    }
    // The long prompt's first token comes with its last chunk.
    EXPECT_EQ(late_output, step >= chunk_steps - 1) << what << ", step " << step;
    ASSERT_EQ(allocations, 0) << what << ", step " << step << " after the long prompt's admission allocated"
                              << " (INFERD_ALLOC_TRACE=1 prints where)";
  }
}

EngineOptions engine_options() {
  EngineOptions o;
  o.num_kv_blocks = 64;
  o.block_size = 16;
  o.scheduler.max_num_batched_tokens = 256;
  o.scheduler.max_prefill_tokens = 256;
  o.scheduler.max_num_seqs = 8;
  o.scheduler.max_model_len = 256;
  return o;
}

// Runs `check` on each tiny fixture model named.
template <typename Check>
void for_each_tiny_model(std::initializer_list<const char*> variants, Check check) {
  for (const char* variant : variants) {
    auto weights = load_model(test::fixture_path(std::string("tiny/") + variant));
    ASSERT_TRUE(weights.has_value()) << weights.status().message();
    ThreadPool pool(2);
    Transformer model(**weights, pool);
    check(model, variant);
  }
}

TEST_F(HotLoopAllocTest, SteadyDecodeAllocatesNothingTinyModels) {
  for_each_tiny_model({"llama_untied", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe"},
                      [](Transformer& model, const char* variant) {
                        expect_steady_decode_allocates_nothing(model, variant, engine_options());
                      });
}

// Every thread of a pool of three on one CPU: the caller runs most ranges itself while the
// workers wait for the CPU, so a worker runs its first range of some kernel late, in a counted
// step. Scratch grown by the thread that runs a range (rather than by the caller, for every
// thread) would allocate there.
TEST_F(HotLoopAllocTest, SteadyDecodeAllocatesNothingWhenWorkersJoinLate) {
  cpu_set_t saved;
  ASSERT_EQ(sched_getaffinity(0, sizeof(saved), &saved), 0);
  int cpu = 0;
  while (cpu < CPU_SETSIZE && !CPU_ISSET(cpu, &saved)) ++cpu;
  ASSERT_LT(cpu, CPU_SETSIZE);
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(cpu, &one);
  ASSERT_EQ(sched_setaffinity(0, sizeof(one), &one), 0);  // the pool's threads inherit it
  // Fresh threads each round: a thread's first range of each kernel is the case under test.
  for (int round = 0; round < 16; ++round) {
    for (const char* variant : {"llama_untied", "qwen3_moe"}) {
      auto weights = load_model(test::fixture_path(std::string("tiny/") + variant));
      ASSERT_TRUE(weights.has_value()) << weights.status().message();
      ThreadPool pool(3);
      Transformer model(**weights, pool);
      expect_steady_decode_allocates_nothing(model, variant + std::string(", round ") + std::to_string(round),
                                             engine_options());
    }
  }
  ASSERT_EQ(sched_setaffinity(0, sizeof(saved), &saved), 0);
}

TEST_F(HotLoopAllocTest, ChunkedPrefillBesideDecodeAllocatesNothingTinyModels) {
  for_each_tiny_model({"llama_untied", "qwen3", "qwen3_moe"}, [](Transformer& model, const char* variant) {
    expect_chunked_prefill_allocates_nothing(model, variant, engine_options());
  });
}

TEST_F(HotLoopAllocTest, SteadyDecodeAllocatesNothingDefaultModel) {
  auto path = default_model_path();
  INFERD_REQUIRE_OR_SKIP(path.has_value(), "default model not installed");
  auto weights = load_model(*path);
  ASSERT_TRUE(weights.has_value()) << weights.status().message();
  ThreadPool pool(2);
  Transformer model(**weights, pool);
  expect_steady_decode_allocates_nothing(model, "SmolLM2 Q4_1", engine_options());
}

}  // namespace
}  // namespace inferd
