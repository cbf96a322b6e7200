#include "tensor/dequantize.h"

#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "test_support.h"

namespace inferd {
namespace {

// Raw blocks and expected values come from gguf-py's numpy dequantizers
// (scripts/fixtures/make_quant_blocks.py), an implementation independent of ours.
TEST(DequantizeTest, MatchesGgufPyReferenceForEveryType) {
  const auto index = nlohmann::json::parse(test::read_text(test::fixture_path("quant/index.json")));
  int checked = 0;
  for (const auto& entry : index["types"]) {
    const std::string name = entry["name"];
    SCOPED_TRACE(name);
    auto dtype = dtype_from_ggml(entry["ggml_type"].get<uint32_t>());
    ASSERT_TRUE(dtype.has_value());
    EXPECT_EQ(dtype_info(*dtype).name, name);
    const int64_t rows = entry["rows"], cols = entry["cols"];
    const auto bytes = test::read_bytes(test::fixture_path("quant/" + entry["bytes"].get<std::string>()));
    const auto expected = test::read_f32(test::fixture_path("quant/" + entry["values"].get<std::string>()));
    ASSERT_EQ(static_cast<int64_t>(bytes.size()), rows * dtype_bytes(*dtype, cols));
    ASSERT_EQ(static_cast<int64_t>(expected.size()), rows * cols);
    std::vector<float> got(static_cast<size_t>(cols));
    for (int64_t r = 0; r < rows; ++r) {
      dequantize_row(*dtype, bytes.data() + r * dtype_bytes(*dtype, cols), got.data(), cols);
      for (int64_t c = 0; c < cols; ++c) {
        const float want = expected[static_cast<size_t>(r * cols + c)];
        // gguf-py computes in float32 like we do; allow one rounding of difference.
        ASSERT_NEAR(got[static_cast<size_t>(c)], want, 1e-6f * std::max(1.0f, std::fabs(want)))
            << "row " << r << " col " << c;
      }
    }
    ++checked;
  }
  EXPECT_EQ(checked, 23);
}

TEST(DequantizeTest, BlockSizesMatchGgml) {
  EXPECT_EQ(dtype_bytes(DType::kQ4_0, 32), 18);
  EXPECT_EQ(dtype_bytes(DType::kQ4_1, 64), 40);
  EXPECT_EQ(dtype_bytes(DType::kQ5_0, 32), 22);
  EXPECT_EQ(dtype_bytes(DType::kQ5_1, 32), 24);
  EXPECT_EQ(dtype_bytes(DType::kQ8_0, 32), 34);
  EXPECT_EQ(dtype_bytes(DType::kQ4_K, 256), 144);
  EXPECT_EQ(dtype_bytes(DType::kQ5_K, 256), 176);
  EXPECT_EQ(dtype_bytes(DType::kQ6_K, 512), 420);
  EXPECT_EQ(dtype_bytes(DType::kQ2_K, 256), 84);
  EXPECT_EQ(dtype_bytes(DType::kQ3_K, 512), 220);
  EXPECT_EQ(dtype_bytes(DType::kIQ3_XXS, 256), 98);
  EXPECT_EQ(dtype_bytes(DType::kIQ3_S, 512), 220);
  EXPECT_EQ(dtype_bytes(DType::kIQ2_S, 256), 82);
  EXPECT_EQ(dtype_bytes(DType::kIQ2_XS, 256), 74);
  EXPECT_EQ(dtype_bytes(DType::kIQ2_XXS, 256), 66);
  EXPECT_EQ(dtype_bytes(DType::kIQ1_S, 256), 50);
  EXPECT_EQ(dtype_bytes(DType::kIQ1_M, 256), 56);
  EXPECT_EQ(dtype_bytes(DType::kTQ1_0, 256), 54);
  EXPECT_EQ(dtype_bytes(DType::kTQ2_0, 256), 66);
  EXPECT_FALSE(dtype_from_ggml(9999).has_value());
}

}  // namespace
}  // namespace inferd
