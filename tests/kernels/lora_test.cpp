#include "kernels/lora.h"

#include <gtest/gtest.h>

#include <random>
#include <tuple>

#include "common/half.h"

#include "test_support.h"

namespace inferd {
namespace {

using test::runnable_paths;

struct Adapter {
  std::vector<float> a, bt;
  int64_t rank;
  float scale;
};

Adapter random_adapter(int64_t rank, int64_t k, int64_t n, std::mt19937& rng) {
  return Adapter{test::random_floats(static_cast<size_t>(rank * k), rng),
                 test::random_floats(static_cast<size_t>(rank * n), rng), rank,
                 std::uniform_real_distribution<float>(0.1f, 2.0f)(rng)};
}

LoraGroup group(const Adapter& ad, const std::vector<int32_t>& rows) {
  return LoraGroup{ad.a.data(), ad.bt.data(), DType::kF32, ad.rank, ad.scale, rows};
}

// Random shapes (odd sizes, ranks 1..64, rows scattered, some rows in no group) on every path
// against the scalar reference.
TEST(LoraKernelTest, MatchesTheReferenceOnRandomShapesOnEveryPath) {
  std::mt19937 rng(31);
  ThreadPool pool(2);
  for (int trial = 0; trial < 40; ++trial) {
    const int64_t k = std::uniform_int_distribution<int64_t>(1, 300)(rng);
    const int64_t n = std::uniform_int_distribution<int64_t>(1, 400)(rng);
    const int64_t tokens = std::uniform_int_distribution<int64_t>(1, 23)(rng);
    const int64_t ldx = k + trial % 3, ldy = n + trial % 5;
    const int num_adapters = std::uniform_int_distribution<int>(1, 5)(rng);
    std::vector<Adapter> adapters;
    for (int i = 0; i < num_adapters; ++i) {
      const int64_t rank =
          std::vector<int64_t>{1, 3, 8, 16, 17, 64}[std::uniform_int_distribution<size_t>(0, 5)(rng)];
      adapters.push_back(random_adapter(rank, k, n, rng));
    }
    // Each row: an adapter, or none (-1).
    std::vector<std::vector<int32_t>> rows(adapters.size());
    for (int32_t t = 0; t < tokens; ++t) {
      const int pick = std::uniform_int_distribution<int>(-1, num_adapters - 1)(rng);
      if (pick >= 0) rows[static_cast<size_t>(pick)].push_back(t);
    }
    std::vector<LoraGroup> groups;
    for (size_t i = 0; i < adapters.size(); ++i) groups.push_back(group(adapters[i], rows[i]));
    const auto x = test::random_floats(static_cast<size_t>(tokens * ldx), rng);
    const auto y0 = test::random_floats(static_cast<size_t>(tokens * ldy), rng);
    std::vector<float> want = y0;
    lora_update_reference(x.data(), ldx, k, groups, want.data(), ldy, n);
    for (Isa isa : runnable_paths()) {
      std::vector<float> got = y0;
      LoraScratch scratch;
      lora_update(x.data(), ldx, k, groups, got.data(), ldy, n, scratch, pool, isa);
      for (int64_t t = 0; t < tokens; ++t) {
        for (int64_t c = 0; c < ldy; ++c) {
          const auto i = static_cast<size_t>(t * ldy + c);
          if (c >= n) {
            ASSERT_EQ(got[i], y0[i]) << "wrote past n";
            continue;
          }
          ASSERT_NEAR(got[i], want[i], 1e-4 * (1.0 + std::abs(want[i])))
              << isa_name(isa) << " trial " << trial << " t=" << t << " c=" << c;
        }
      }
    }
  }
}

// A row's update is the same bit for bit alone, among many rows of its adapter, and in a batch
// of other adapters: the engine's batch invariance holds with LoRA.
TEST(LoraKernelTest, ARowsUpdateDoesNotDependOnTheRestOfTheBatch) {
  std::mt19937 rng(32);
  ThreadPool pool(2);
  const int64_t k = 96, n = 333, tokens = 13;
  const Adapter a = random_adapter(16, k, n, rng), b = random_adapter(8, k, n, rng);
  const auto x = test::random_floats(static_cast<size_t>(tokens * k), rng);
  for (Isa isa : runnable_paths()) {
    LoraScratch scratch;
    std::vector<float> batch(static_cast<size_t>(tokens * n), 0.0f);
    const std::vector<int32_t> rows_a{0, 1, 2, 3, 4, 5, 9, 12}, rows_b{6, 8, 10};
    const LoraGroup both[2] = {group(a, rows_a), group(b, rows_b)};
    lora_update(x.data(), k, k, both, batch.data(), n, n, scratch, pool, isa);
    for (int32_t t = 0; t < tokens; ++t) {
      std::vector<float> alone(static_cast<size_t>(n), 0.0f);
      const bool in_a = std::find(rows_a.begin(), rows_a.end(), t) != rows_a.end();
      const bool in_b = std::find(rows_b.begin(), rows_b.end(), t) != rows_b.end();
      const std::vector<int32_t> zero{0};
      if (in_a || in_b) {
        const LoraGroup g = group(in_a ? a : b, zero);
        lora_update(x.data() + t * k, k, k, {&g, 1}, alone.data(), n, n, scratch, pool, isa);
      }
      for (int64_t c = 0; c < n; ++c)
        ASSERT_EQ(batch[static_cast<size_t>(t * n + c)], alone[static_cast<size_t>(c)])
            << isa_name(isa) << " row " << t << " column " << c;
    }
  }
}

// Outputs sharing one call (Q, K and V; gate and up) get, bit for bit, what a call of their own
// gives, with odd widths and different adapters (and an output without groups) per output.
TEST(LoraKernelTest, OutputsSharingACallEqualEachOutputAlone) {
  std::mt19937 rng(34);
  ThreadPool pool(2);
  const int64_t k = 77, tokens = 11;
  const int64_t widths[3] = {131, 47, 1};
  const auto x = test::random_floats(static_cast<size_t>(tokens * k), rng);
  const std::vector<int32_t> rows_a{0, 2, 3, 4, 5, 10}, rows_b{1, 7, 9};
  std::vector<Adapter> adapters;
  for (const int64_t n : widths) {
    adapters.push_back(random_adapter(16, k, n, rng));
    adapters.push_back(random_adapter(5, k, n, rng));
  }
  std::vector<LoraGroup> groups[3];
  for (int o = 0; o < 3; ++o) {
    groups[o].push_back(group(adapters[static_cast<size_t>(2 * o)], rows_a));
    if (o != 1) groups[o].push_back(group(adapters[static_cast<size_t>(2 * o + 1)], rows_b));
  }
  groups[2].clear();  // an output no adapter changes
  for (Isa isa : runnable_paths()) {
    LoraScratch scratch;
    std::vector<float> initial[3], together[3];
    LoraOutput outputs[3];
    for (int o = 0; o < 3; ++o) {
      initial[o] = test::random_floats(static_cast<size_t>(tokens * widths[o]), rng);
      together[o] = initial[o];
      outputs[o] = LoraOutput{groups[o], together[o].data(), widths[o], widths[o]};
    }
    lora_update(x.data(), k, k, outputs, scratch, pool, isa);
    for (int o = 0; o < 3; ++o) {
      std::vector<float> alone = initial[o], want = initial[o];
      lora_update(x.data(), k, k, groups[o], alone.data(), widths[o], widths[o], scratch, pool, isa);
      lora_update_reference(x.data(), k, k, groups[o], want.data(), widths[o], widths[o]);
      ASSERT_EQ(together[o], alone) << isa_name(isa) << " output " << o;
      for (size_t i = 0; i < want.size(); ++i)
        ASSERT_NEAR(together[o][i], want[i], 1e-4 * (1.0 + std::abs(want[i])))
            << isa_name(isa) << " output " << o;
    }
    ASSERT_EQ(together[2], initial[2]) << "an output without groups changed";
  }
}

// An adapter held in F16 or BF16 gives, bit for bit, what the same values held in f32 give (the
// kernels expand them exactly), on every path and for odd sizes.
TEST(LoraKernelTest, SixteenBitWeightsEqualTheirF32Values) {
  std::mt19937 rng(33);
  ThreadPool pool(2);
  for (DType dtype : {DType::kF16, DType::kBF16}) {
    for (const auto& [k, n, rank] :
         {std::tuple{64, 64, 8}, std::tuple{97, 301, 5}, std::tuple{576, 1536, 16}}) {
      Adapter ad = random_adapter(rank, k, n, rng);
      std::vector<uint16_t> a16(ad.a.size()), bt16(ad.bt.size());
      auto narrow = [&](std::vector<float>& v, std::vector<uint16_t>& out) {
        for (size_t i = 0; i < v.size(); ++i) {
          out[i] = dtype == DType::kF16 ? f32_to_f16(v[i]) : f32_to_bf16(v[i]);
          v[i] = dtype == DType::kF16 ? f16_to_f32(out[i]) : bf16_to_f32(out[i]);  // the values held
        }
      };
      narrow(ad.a, a16);
      narrow(ad.bt, bt16);
      const int64_t tokens = 11;
      const std::vector<int32_t> rows{0, 2, 3, 4, 5, 6, 9, 10};
      const auto x = test::random_floats(static_cast<size_t>(tokens * k), rng);
      for (Isa isa : runnable_paths()) {
        std::vector<float> y32(static_cast<size_t>(tokens * n), 0.5f), y16 = y32;
        LoraScratch scratch;
        const LoraGroup g32 = group(ad, rows);
        const LoraGroup g16{a16.data(), bt16.data(), dtype, ad.rank, ad.scale, rows};
        lora_update(x.data(), k, k, {&g32, 1}, y32.data(), n, n, scratch, pool, isa);
        lora_update(x.data(), k, k, {&g16, 1}, y16.data(), n, n, scratch, pool, isa);
        ASSERT_EQ(y16, y32) << dtype_info(dtype).name << " " << isa_name(isa) << " k=" << k;
        std::vector<float> want(static_cast<size_t>(tokens * n), 0.5f);
        lora_update_reference(x.data(), k, k, {&g16, 1}, want.data(), n, n);
        for (size_t i = 0; i < want.size(); ++i)
          ASSERT_NEAR(y16[i], want[i], 1e-4 * (1.0 + std::abs(want[i])));
      }
    }
  }
}

TEST(LoraKernelTest, SiluMulMatchesLibmOnEveryPath) {
  std::mt19937 rng(34);
  for (int64_t n : {1, 15, 16, 17, 100, 1536}) {
    auto g = test::random_floats(static_cast<size_t>(n), rng, -30.0f, 30.0f);
    auto u = test::random_floats(static_cast<size_t>(n), rng);
    for (Isa isa : runnable_paths()) {
      std::vector<float> out(g.size());
      lora_silu_mul(g.data(), u.data(), out.data(), n, isa);
      for (size_t i = 0; i < g.size(); ++i) {
        const double want = g[i] / (1.0 + std::exp(-static_cast<double>(g[i]))) * u[i];
        ASSERT_NEAR(out[i], want, 1e-6 * (1.0 + std::abs(want))) << isa_name(isa) << " n=" << n;
      }
    }
  }
}

}  // namespace
}  // namespace inferd
