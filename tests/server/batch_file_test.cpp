// The OpenAI batch file lines `inferd run-batch` reads and writes: requests, the reasons a line is
// none (each named), and the answer and error lines' shapes.
#include "server/batch_file.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

namespace inferd {
namespace {

using json = nlohmann::json;

TEST(BatchFileTest, ReadsARequestLine) {
  const BatchLine l = parse_batch_line(
      R"({"custom_id":"r-1","method":"POST","url":"/v1/chat/completions","body":{"messages":[],"stream":false}})");
  EXPECT_EQ(l.error, "");
  EXPECT_EQ(l.custom_id, "r-1");
  EXPECT_EQ(l.url, "/v1/chat/completions");
  EXPECT_EQ(json::parse(l.body), json::parse(R"({"messages":[],"stream":false})"));
  // method may be left out; every listed endpoint is accepted, others are not.
  for (const char* url : {"/v1/completions", "/v1/embeddings", "/v1/responses", "/v1/score", "/v1/rerank",
                          "/v1/chat/completions"}) {
    EXPECT_TRUE(batch_url_supported(url)) << url;
    EXPECT_EQ(parse_batch_line(json{{"custom_id", "x"}, {"url", url}, {"body", json::object()}}.dump()).error,
              "");
  }
  for (const char* url : {"/v1/models", "/health", "/v1/chat/completions/", "", "/tokenize"})
    EXPECT_FALSE(batch_url_supported(url)) << url;
}

TEST(BatchFileTest, NamesWhatMakesALineNoRequest) {
  const std::pair<const char*, const char*> cases[] = {
      {"not json", "not a JSON object"},
      {"[1,2]", "not a JSON object"},
      {R"({"url":"/v1/completions","body":{}})", "'custom_id' must be a string"},
      {R"({"custom_id":7,"url":"/v1/completions","body":{}})", "'custom_id' must be a string"},
      {R"({"custom_id":"a","method":"GET","url":"/v1/completions","body":{}})", "'method' must be \"POST\""},
      {R"({"custom_id":"a","body":{}})", "'url' must be a string"},
      {R"({"custom_id":"a","url":"/v1/models","body":{}})", "'url' /v1/models is not supported"},
      {R"({"custom_id":"a","url":"/v1/completions"})", "'body' must be a JSON object"},
      {R"({"custom_id":"a","url":"/v1/completions","body":"x"})", "'body' must be a JSON object"},
      {R"({"custom_id":"a","url":"/v1/completions","body":{"stream":true}})", "'body.stream'"},
      {R"({"custom_id":"a","url":"/v1/completions","body":{},"extra":1})", "unknown field 'extra'"},
  };
  for (const auto& [text, want] : cases) {
    const BatchLine l = parse_batch_line(text);
    EXPECT_NE(l.error.find(want), std::string::npos) << text << " -> " << l.error;
  }
  // The custom_id is kept when the line has one, for its error line.
  EXPECT_EQ(parse_batch_line(R"({"custom_id":"keep","url":"/v1/models","body":{}})").custom_id, "keep");
  EXPECT_NE(parse_batch_line(std::string(10000, '[')).error.find("nests"), std::string::npos);
}

TEST(BatchFileTest, WritesAnswerAndErrorLines) {
  BatchLine l;
  l.custom_id = "r-1";
  const json ok = json::parse(batch_answer_line(l, 200, R"({"id":"chatcmpl-9","choices":[]})"));
  EXPECT_EQ(ok["custom_id"], "r-1");
  EXPECT_EQ(ok["id"].get<std::string>().rfind("batch_req_", 0), 0u);
  EXPECT_EQ(ok["response"]["status_code"], 200);
  EXPECT_EQ(ok["response"]["request_id"], "chatcmpl-9");  // the answer's own id
  EXPECT_EQ(ok["response"]["body"], json::parse(R"({"id":"chatcmpl-9","choices":[]})"));
  EXPECT_TRUE(ok["error"].is_null());
  const json bad = json::parse(batch_answer_line(l, 400, R"({"error":{"message":"m","param":"n"}})"));
  EXPECT_EQ(bad["response"]["status_code"], 400);
  EXPECT_EQ(bad["response"]["request_id"].get<std::string>().rfind("req_", 0), 0u);
  EXPECT_EQ(bad["response"]["body"]["error"]["param"], "n");
  EXPECT_EQ(json::parse(batch_answer_line(l, 502, "not json"))["response"]["body"], "not json");
  const json err = json::parse(batch_error_line(l, "invalid_request", "why"));
  EXPECT_TRUE(err["response"].is_null());
  EXPECT_EQ(err["error"], (json{{"code", "invalid_request"}, {"message", "why"}}));
  EXPECT_EQ(err["custom_id"], "r-1");
  EXPECT_TRUE(json::parse(batch_error_line(BatchLine{}, "invalid_request", "x"))["custom_id"].is_null());
  EXPECT_NE(ok["id"], json::parse(batch_answer_line(l, 200, "{}"))["id"]);  // ids differ
}

}  // namespace
}  // namespace inferd
