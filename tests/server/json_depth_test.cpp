// json_nests_deeper_than: the bracket depth of JSON text from outside, strings skipped, checked
// against the depth of what nlohmann parses; and the request parsers that use it.
#include <gtest/gtest.h>

#include <random>
#include <string>

#include <nlohmann/json.hpp>

#include "common/text.h"
#include "server/openai_api.h"
#include "server/triton_api.h"

namespace inferd {
namespace {

int depth_of(const nlohmann::json& j) {
  int d = 0;
  if (j.is_structured()) {
    for (const auto& v : j) d = std::max(d, depth_of(v));
    ++d;
  }
  return d;
}

// Random JSON up to `levels` deep, with strings full of brackets, quotes and backslashes.
nlohmann::json random_json(std::mt19937& rng, int levels) {
  const std::string noise = "[]{}\"\\\\ax/";
  switch (levels == 0 ? rng() % 3 : rng() % 5) {
    case 0: return static_cast<int>(rng() % 100);
    case 1: {
      std::string s;
      for (int i = 0, n = static_cast<int>(rng() % 8); i < n; ++i) s += noise[rng() % noise.size()];
      return s;
    }
    case 2: return nullptr;
    case 3: {
      nlohmann::json a = nlohmann::json::array();
      for (int i = 0, n = static_cast<int>(rng() % 3); i < n; ++i) a.push_back(random_json(rng, levels - 1));
      return a;
    }
    default: {
      nlohmann::json o = nlohmann::json::object();
      for (int i = 0, n = static_cast<int>(rng() % 3); i < n; ++i)
        o[std::string(1, noise[rng() % noise.size()])] = random_json(rng, levels - 1);
      return o;
    }
  }
}

TEST(JsonDepthTest, CountsBracketsOutsideStrings) {
  EXPECT_FALSE(json_nests_deeper_than("{}", 1));
  EXPECT_TRUE(json_nests_deeper_than("[{}]", 1));
  EXPECT_FALSE(json_nests_deeper_than(R"({"a": "[[[[{{{{"})", 1));
  EXPECT_FALSE(json_nests_deeper_than(R"(["\"[[[", "\\", "x"])", 1));
  EXPECT_TRUE(json_nests_deeper_than(R"(["\\", ["\\"]])", 1));
  EXPECT_FALSE(json_nests_deeper_than("[[],[],[[]]]", 3));
  EXPECT_TRUE(json_nests_deeper_than("[[],[],[[[]]]]", 3));
  EXPECT_FALSE(json_nests_deeper_than("", 0));
  std::mt19937 rng(7);
  for (int i = 0; i < 2000; ++i) {
    const nlohmann::json j = random_json(rng, static_cast<int>(rng() % 7));
    const std::string text = j.dump(rng() % 2 == 0 ? -1 : 1);
    const int d = depth_of(j);
    EXPECT_FALSE(json_nests_deeper_than(text, d)) << text;
    if (d > 0) {
      EXPECT_TRUE(json_nests_deeper_than(text, d - 1)) << text;
    }
  }
}

// A million nested brackets (2 MB, under the body limit) overflowed the server's stack when the
// parsed prompt was copied: every parser of a request body now refuses them first.
TEST(JsonDepthTest, RequestParsersRefuseDeepBodies) {
  const auto nested = [](int n) {
    return std::string(static_cast<size_t>(n), '[') + std::string(static_cast<size_t>(n), ']');
  };
  const std::string message = "the request body nests arrays and objects deeper than 512 levels";
  for (int n : {513, 1000000}) {
    for (ApiEndpoint e : {ApiEndpoint::kCompletion, ApiEndpoint::kChat}) {
      const ParsedRequest p = parse_generate_request(e, R"({"prompt": )" + nested(n) + "}");
      ASSERT_FALSE(p.request.has_value());
      EXPECT_EQ(p.error.status, 400);
      EXPECT_EQ(p.error.message, message);
    }
    EXPECT_EQ(parse_tokenize_request(R"({"prompt": )" + nested(n) + "}").error.message, message);
    std::string id;
    auto t = triton_to_completion(R"({"text_input": )" + nested(n) + "}", "m", false, &id);
    ASSERT_FALSE(t.has_value());
    EXPECT_EQ(t.status().message(), message);
    // A schema given as JSON text inside the body.
    const std::string deep_text = std::string(static_cast<size_t>(n), '[');
    const ParsedRequest s = parse_generate_request(
        ApiEndpoint::kCompletion, R"({"prompt": "x", "guided_json": ")" + deep_text + R"("})");
    ASSERT_FALSE(s.request.has_value());
    EXPECT_EQ(s.error.param, "guided_json");
  }
  // 512 levels are a body like any other: here a prompt of the wrong shape.
  const ParsedRequest ok_depth =
      parse_generate_request(ApiEndpoint::kCompletion, R"({"prompt": )" + nested(511) + "}");
  ASSERT_FALSE(ok_depth.request.has_value());
  EXPECT_EQ(ok_depth.error.param, "prompt");
}

}  // namespace
}  // namespace inferd
