#include "formats/gguf_file.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "test_support.h"

namespace inferd {
namespace {

using test::GgufWriter;

std::vector<std::byte> f32_bytes(const std::vector<float>& v) {
  std::vector<std::byte> out(v.size() * 4);
  std::memcpy(out.data(), v.data(), out.size());
  return out;
}

// A small valid file: metadata of several kinds and two tensors, the last ending the file.
std::vector<std::byte> small_file() {
  GgufWriter w;
  w.add_string("general.architecture", "llama");
  w.add_u32("llama.block_count", 2);
  w.add_f32("llama.attention.layer_norm_rms_epsilon", 1e-5f);
  w.add_string_array("tokenizer.ggml.tokens", {"a", "b", "<s>"});
  w.add_tensor("a.weight", {3, 4}, 0, f32_bytes(std::vector<float>(12, 1.5f)));
  std::vector<std::byte> q8(2 * 34, std::byte{1});
  w.add_tensor("b.weight", {2, 32}, 8, q8);
  return w.bytes();
}

Expected<GgufFile> parse(const std::vector<std::byte>& b) {
  return GgufFile::parse("test.gguf", b.data(), b.size());
}

TEST(GgufFileTest, ParsesMetadataAndTensors) {
  auto bytes = small_file();
  auto f = parse(bytes);
  ASSERT_TRUE(f.has_value()) << f.status().message();
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(**f->get_string("general.architecture"), "llama");
  EXPECT_EQ(**f->get_int("llama.block_count"), 2);
  EXPECT_FLOAT_EQ(static_cast<float>(**f->get_float("llama.attention.layer_norm_rms_epsilon")), 1e-5f);
  EXPECT_EQ(f->find("tokenizer.ggml.tokens")->array_strings.size(), 3u);
  EXPECT_FALSE(f->get_int("missing")->has_value());
  EXPECT_FALSE(f->get_int("general.architecture").has_value());  // wrong type is an error
  const TensorView* a = f->find_tensor("a.weight");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->shape_string(), "[3, 4]");
  EXPECT_EQ(a->dtype, DType::kF32);
  float first;
  std::memcpy(&first, a->data, 4);
  EXPECT_EQ(first, 1.5f);
  const TensorView* b = f->find_tensor("b.weight");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->dtype, DType::kQ8_0);
  EXPECT_EQ(b->num_bytes, 68u);
  EXPECT_EQ(b->data + b->num_bytes, bytes.data() + bytes.size());
}

TEST(GgufFileTest, EveryTruncationIsAnError) {
  const auto bytes = small_file();
  for (size_t len = 0; len < bytes.size(); ++len) {
    std::vector<std::byte> cut(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(len));
    auto f = parse(cut);
    ASSERT_FALSE(f.has_value()) << "accepted a file cut to " << len << " bytes";
    EXPECT_NE(f.status().message().find("test.gguf"), std::string::npos);
  }
}

void expect_error(const std::vector<std::byte>& bytes, const std::string& fragment) {
  auto f = parse(bytes);
  ASSERT_FALSE(f.has_value());
  EXPECT_NE(f.status().message().find(fragment), std::string::npos) << f.status().message();
}

template <typename T>
void poke(std::vector<std::byte>* b, size_t offset, T v) {
  std::memcpy(b->data() + offset, &v, sizeof v);
}

// Byte offset of the tensor info of `name` (its name's length field).
size_t find_string(const std::vector<std::byte>& b, const std::string& s) {
  for (size_t i = 0; i + s.size() <= b.size(); ++i) {
    if (std::memcmp(b.data() + i, s.data(), s.size()) == 0) return i - 8;
  }
  return 0;
}

TEST(GgufFileTest, CraftedFaultsAreNamed) {
  const auto good = small_file();
  {
    auto b = good;
    b[0] = std::byte{'X'};
    expect_error(b, "bad magic");
  }
  {
    auto b = good;
    poke<uint32_t>(&b, 4, 7);
    expect_error(b, "unsupported GGUF version 7");
  }
  {
    auto b = good;
    poke<uint64_t>(&b, 8, uint64_t{1} << 60);
    expect_error(b, "tensor count");
  }
  {
    auto b = good;
    poke<uint64_t>(&b, 16, uint64_t{1} << 60);
    expect_error(b, "metadata count");
  }
  const size_t a_info = find_string(good, "a.weight");
  const size_t a_after_name = a_info + 8 + 8;
  {
    auto b = good;
    poke<uint32_t>(&b, a_after_name, 5);
    expect_error(b, "dimensions");
  }
  {
    auto b = good;
    poke<uint32_t>(&b, a_after_name + 4 + 16, 1234);  // type after two dims
    expect_error(b, "unsupported ggml type 1234");
  }
  {
    auto b = good;
    poke<uint64_t>(&b, a_after_name + 4 + 16 + 4, 8);  // offset not aligned
    expect_error(b, "not aligned");
  }
  {
    auto b = good;
    poke<uint64_t>(&b, a_after_name + 4 + 16 + 4, uint64_t{1} << 40);
    expect_error(b, "past end of file");
  }
  {
    auto b = good;
    poke<uint64_t>(&b, a_after_name + 4, uint64_t{1} << 62);  // huge dim
    expect_error(b, "invalid dimension");
  }
  {
    auto b = good;
    // A Q8_0 row length must be a multiple of 32.
    const size_t b_info = find_string(good, "b.weight");
    poke<uint64_t>(&b, b_info + 8 + 8 + 4, 31);
    expect_error(b, "not a multiple");
  }
  {
    auto b = good;
    const size_t key = find_string(good, "llama.block_count");
    poke<uint32_t>(&b, key + 8 + 17, 99);  // value type
    expect_error(b, "unknown value type 99");
  }
}

TEST(GgufFileTest, DuplicateTensorNamesRejected) {
  GgufWriter w;
  w.add_tensor("x", {4}, 0, f32_bytes({1, 2, 3, 4}));
  w.add_tensor("x", {4}, 0, f32_bytes({1, 2, 3, 4}));
  expect_error(w.bytes(), "duplicate tensor name 'x'");
}

// Random corruption never crashes or reads outside the buffer (ASan checks in CI), and every
// tensor of a file that still parses lies inside the buffer.
TEST(GgufFileTest, RandomMutationsNeverCrash) {
  const auto good = small_file();
  std::mt19937 rng(2024);
  int accepted = 0;
  for (int iter = 0; iter < 4000; ++iter) {
    auto b = good;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      const size_t pos = rng() % b.size();
      switch (rng() % 3) {
        case 0: b[pos] = static_cast<std::byte>(rng() & 0xff); break;
        case 1: b[pos] = static_cast<std::byte>(static_cast<uint8_t>(b[pos]) ^ (1u << (rng() % 8))); break;
        default: b.resize(pos); break;
      }
      if (b.empty()) break;
    }
    auto f = parse(b);
    if (!f.has_value()) continue;
    ++accepted;
    for (const auto& t : f->tensors()) {
      ASSERT_GE(t.data, b.data());
      ASSERT_LE(t.data + t.num_bytes, b.data() + b.size());
    }
  }
  EXPECT_GT(accepted, 0);  // some mutations only touch tensor data
}

TEST(GgufFileTest, OpenReportsMissingFile) {
  auto f = GgufFile::open("/nonexistent/model.gguf");
  ASSERT_FALSE(f.has_value());
  EXPECT_NE(f.status().message().find("/nonexistent/model.gguf"), std::string::npos);
}

}  // namespace
}  // namespace inferd
