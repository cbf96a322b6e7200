#include "formats/safetensors_file.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>

namespace inferd {
namespace {

std::vector<std::byte> make_file(const std::string& header, size_t data_bytes) {
  std::vector<std::byte> out(8 + header.size() + data_bytes, std::byte{0});
  const uint64_t n = header.size();
  std::memcpy(out.data(), &n, 8);
  std::memcpy(out.data() + 8, header.data(), header.size());
  for (size_t i = 0; i < data_bytes; ++i) out[8 + header.size() + i] = static_cast<std::byte>(i);
  return out;
}

const char* kGood =
    R"({"__metadata__": {"format": "pt"}, "w": {"dtype": "BF16", "shape": [2, 3], "data_offsets": [0, 12]},)"
    R"( "b": {"dtype": "F32", "shape": [3], "data_offsets": [12, 24]}})";

Expected<SafetensorsFile> parse(const std::vector<std::byte>& b) {
  return SafetensorsFile::parse("m.safetensors", b.data(), b.size());
}

TEST(SafetensorsFileTest, ParsesTensors) {
  auto bytes = make_file(kGood, 24);
  auto f = parse(bytes);
  ASSERT_TRUE(f.has_value()) << f.status().message();
  ASSERT_EQ(f->tensors().size(), 2u);
  const TensorView* w = f->find_tensor("w");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->dtype, DType::kBF16);
  EXPECT_EQ(w->shape_string(), "[2, 3]");
  EXPECT_EQ(w->data, bytes.data() + 8 + std::strlen(kGood));
  EXPECT_EQ(f->find_tensor("b")->num_bytes, 12u);
  EXPECT_EQ(f->find_tensor("__metadata__"), nullptr);
}

void expect_error(const std::string& header, size_t data, const std::string& fragment) {
  auto f = parse(make_file(header, data));
  ASSERT_FALSE(f.has_value()) << header;
  EXPECT_NE(f.status().message().find(fragment), std::string::npos) << f.status().message();
  EXPECT_NE(f.status().message().find("m.safetensors"), std::string::npos);
}

TEST(SafetensorsFileTest, CraftedFaultsAreNamed) {
  expect_error(kGood, 23, "past end of file");
  expect_error(R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}})", 8, "needs 8");
  expect_error(R"({"w": {"dtype": "I64", "shape": [1], "data_offsets": [0, 8]}})", 8,
               "unsupported dtype I64");
  expect_error(R"({"w": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})", 8, "invalid dimension");
  expect_error(R"({"w": {"dtype": "F32", "shape": [1]}})", 8, "data_offsets");
  expect_error(R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [8, 4]}})", 8, "past end");
  expect_error(R"([1, 2])", 0, "not a JSON object");
  expect_error(R"({"w": )", 0, "not a JSON object");
  auto tiny = std::vector<std::byte>(5);
  EXPECT_FALSE(parse(tiny).has_value());
  auto huge = make_file("{}", 0);
  const uint64_t n = uint64_t{1} << 62;
  std::memcpy(huge.data(), &n, 8);
  EXPECT_FALSE(parse(huge).has_value());
}

TEST(SafetensorsFileTest, RandomMutationsNeverCrash) {
  const auto good = make_file(kGood, 24);
  std::mt19937 rng(31);
  for (int iter = 0; iter < 3000; ++iter) {
    auto b = good;
    for (int e = 0; e < 3; ++e) {
      const size_t pos = rng() % b.size();
      if (rng() % 4 == 0) {
        b.resize(pos + 1);
      } else {
        b[pos] = static_cast<std::byte>(rng() & 0xff);
      }
    }
    auto f = parse(b);
    if (!f.has_value()) continue;
    for (const auto& t : f->tensors()) {
      ASSERT_GE(t.data, b.data());
      ASSERT_LE(t.data + t.num_bytes, b.data() + b.size());
    }
  }
}

}  // namespace
}  // namespace inferd
