// The KServe v2 / Triton shapes: /v2 targets parsed (models, versions, escapes), generate bodies
// translated into completions bodies (every field mapped or refused by name), and the answers'
// JSON.
#include "server/triton_api.h"

#include <gtest/gtest.h>

namespace inferd {
namespace {

using nlohmann::json;
using K = TritonRoute::Kind;

TEST(TritonApiTest, TargetsUnderV2AreParsed) {
  EXPECT_FALSE(parse_triton_target("/v1/models").has_value());
  EXPECT_FALSE(parse_triton_target("/v2x").has_value());
  const std::pair<const char*, K> kinds[] = {
      {"/v2", K::kServerMetadata},
      {"/v2/", K::kServerMetadata},
      {"/v2/health/live", K::kLive},
      {"/v2/health/ready", K::kReady},
      {"/v2/health/dead", K::kUnknown},
      {"/v2/models/m", K::kModelMetadata},
      {"/v2/models/m/ready", K::kModelReady},
      {"/v2/models/m/generate", K::kGenerate},
      {"/v2/models/m/generate_stream", K::kGenerateStream},
      {"/v2/models/m/versions/1", K::kModelMetadata},
      {"/v2/models/m/versions/1/generate", K::kGenerate},
      {"/v2/models/m/versions", K::kUnknown},
      {"/v2/models/m/infer", K::kUnknown},
      {"/v2/models/m/generate/x", K::kUnknown},
      {"/v2/models", K::kUnknown},
      {"/v2/models/bad%zz/generate", K::kUnknown},
  };
  for (const auto& [target, kind] : kinds) {
    auto r = parse_triton_target(target);
    ASSERT_TRUE(r.has_value()) << target;
    EXPECT_EQ(r->kind, kind) << target;
  }
  auto r = parse_triton_target("/v2/models/org%2Fmodel/versions/7/ready");
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->model, "org/model");
  EXPECT_EQ(r->version, "7");
  EXPECT_EQ(r->kind, K::kModelReady);
}

TEST(TritonApiTest, GenerateBodiesBecomeCompletionsBodies) {
  std::string id;
  auto c = triton_to_completion(
      R"({"text_input": "hi", "id": "r7", "max_tokens": 5, "parameters": {"temperature": 0.5, "top_k": 3,
          "stop": ["x"], "seed": 1, "exclude_input_in_output": false, "stream": true}})",
      "m", true, &id);
  ASSERT_TRUE(c.has_value()) << c.status().message();
  EXPECT_EQ(id, "r7");
  EXPECT_EQ(*c, json::parse(R"({"model": "m", "stream": true, "prompt": "hi", "max_tokens": 5,
      "temperature": 0.5, "top_k": 3, "stop": ["x"], "seed": 1, "echo": true})"));
  auto plain = triton_to_completion(R"({"text_input": "", "parameters": {"exclude_input_in_output": true}})",
                                    "m", false, &id);
  ASSERT_TRUE(plain.has_value());
  EXPECT_EQ(*plain, json::parse(R"({"model": "m", "stream": false, "prompt": ""})"));
}

TEST(TritonApiTest, EveryOtherFieldIsRefusedByName) {
  const std::pair<const char*, const char*> bad[] = {
      {"[1]", "not a JSON object"},
      {"{", "not a JSON object"},
      {"{}", "'text_input' is required"},
      {R"({"text_input": 3})", "'text_input' must be a string"},
      {R"({"text_input": "a", "beam_width": 2})", "unsupported field 'beam_width'"},
      {R"({"text_input": "a", "parameters": {"best_of": 2}})", "unsupported parameter 'best_of'"},
      {R"({"text_input": "a", "parameters": 1})", "'parameters' must be an object"},
      {R"({"text_input": "a", "max_tokens": 2, "parameters": {"max_tokens": 3}})", "given both"},
      {R"({"text_input": "a", "parameters": {"stream": true}})", "use generate_stream"},
      {R"({"text_input": "a", "stream": "yes"})", "'stream' must be a boolean"},
      {R"({"text_input": "a", "exclude_input_in_output": 0})", "must be a boolean"},
      {R"({"text_input": "a", "id": 5})", "'id' must be a string"},
  };
  for (const auto& [body, needle] : bad) {
    std::string id;
    auto r = triton_to_completion(body, "m", false, &id);
    ASSERT_FALSE(r.has_value()) << body;
    EXPECT_NE(r.status().message().find(needle), std::string::npos) << body << ": " << r.status().message();
  }
  std::string id;
  auto r = triton_to_completion(R"({"text_input": "a", "stream": false})", "m", true, &id);
  ASSERT_FALSE(r.has_value());
  EXPECT_NE(r.status().message().find("use generate"), std::string::npos);
}

TEST(TritonApiTest, AnswersHaveTritonsShapes) {
  EXPECT_EQ(json::parse(triton_error_body("bad \"x\"")), json::parse(R"({"error": "bad \"x\""})"));
  EXPECT_EQ(json::parse(triton_generate_body("m", "", "out", FinishReason::kLength)),
            json::parse(R"({"model_name": "m", "model_version": "1", "text_output": "out",
                            "finish_reason": "length"})"));
  EXPECT_EQ(json::parse(triton_generate_body("m", "q", "", FinishReason::kStop))["id"], "q");
  const std::string mid = triton_stream_event("m", "", "a", std::nullopt);
  ASSERT_EQ(mid.rfind("data: ", 0), 0u);
  ASSERT_EQ(mid.substr(mid.size() - 2), "\n\n");
  EXPECT_EQ(json::parse(mid.substr(6)),
            json::parse(R"({"model_name": "m", "model_version": "1", "text_output": "a", "done": false})"));
  const std::string last = triton_stream_event("m", "r", "", FinishReason::kStop);
  EXPECT_EQ(json::parse(last.substr(6)), json::parse(R"({"model_name": "m", "model_version": "1",
      "text_output": "", "done": true, "finish_reason": "stop", "id": "r"})"));
  const json meta = json::parse(triton_model_metadata("m"));
  EXPECT_EQ(meta["name"], "m");
  EXPECT_EQ(meta["inputs"][0]["name"], "text_input");
  EXPECT_EQ(meta["outputs"][0]["name"], "text_output");
  EXPECT_EQ(json::parse(triton_server_metadata("1.2.3"))["extensions"], json::array({"generate"}));
}

}  // namespace
}  // namespace inferd
