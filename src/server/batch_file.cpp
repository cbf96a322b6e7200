#include "server/batch_file.h"

#include <nlohmann/json.hpp>

#include "common/text.h"
#include "server/openai_api.h"

namespace inferd {

namespace {

using json = nlohmann::ordered_json;

std::string dump(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace

bool batch_url_supported(std::string_view url) {
  for (std::string_view u : {"/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses",
                             "/v1/score", "/v1/rerank", "/v1/classify"}) {
    if (url == u) return true;
  }
  return false;
}

BatchLine parse_batch_line(std::string_view text) {
  BatchLine line;
  if (json_nests_deeper_than(text)) {
    line.error = "the line nests arrays and objects deeper than " + std::to_string(kMaxJsonDepth) + " levels";
    return line;
  }
  const json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    line.error = "the line is not a JSON object";
    return line;
  }
  if (auto id = j.find("custom_id"); id != j.end() && id->is_string())
    line.custom_id = id->get<std::string>();
  const auto fail = [&line](std::string message) {
    line.error = std::move(message);
    return line;
  };
  if (auto id = j.find("custom_id"); id == j.end() || !id->is_string())
    return fail("'custom_id' must be a string");
  if (auto m = j.find("method"); m != j.end() && *m != "POST") return fail("'method' must be \"POST\"");
  auto url = j.find("url");
  if (url == j.end() || !url->is_string()) return fail("'url' must be a string");
  line.url = url->get<std::string>();
  if (!batch_url_supported(line.url))
    return fail("'url' " + line.url +
                " is not supported (/v1/chat/completions, /v1/completions, /v1/embeddings, /v1/responses, "
                "/v1/score, /v1/rerank, /v1/classify)");
  auto body = j.find("body");
  if (body == j.end() || !body->is_object()) return fail("'body' must be a JSON object");
  if (auto s = body->find("stream"); s != body->end() && *s == true)
    return fail("'body.stream': a batch request is not streamed");
  for (const auto& [key, value] : j.items()) {
    if (key != "custom_id" && key != "method" && key != "url" && key != "body")
      return fail("unknown field '" + key + "' (a line has custom_id, method, url, body)");
  }
  line.body = dump(*body);
  return line;
}

std::string batch_answer_line(const BatchLine& line, int status_code, std::string_view body) {
  json parsed = json::parse(body, nullptr, false);
  if (parsed.is_discarded()) parsed = std::string(body);
  json out = {
      {"id", random_id("batch_req_")},
      {"custom_id", line.custom_id},
      {"response", {{"status_code", status_code}, {"request_id", random_id("req_")}, {"body", parsed}}},
      {"error", nullptr}};
  if (parsed.is_object()) {
    if (auto id = parsed.find("id"); id != parsed.end() && id->is_string())
      out["response"]["request_id"] = *id;
  }
  return dump(out);
}

std::string batch_error_line(const BatchLine& line, std::string_view code, std::string_view message) {
  const json out = {{"id", random_id("batch_req_")},
                    {"custom_id", line.custom_id.empty() ? json() : json(line.custom_id)},
                    {"response", nullptr},
                    {"error", {{"code", code}, {"message", message}}}};
  return dump(out);
}

}  // namespace inferd
