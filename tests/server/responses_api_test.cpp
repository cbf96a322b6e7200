#include "server/responses_api.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

namespace inferd {
namespace {

using json = nlohmann::json;

ResponsesRequest parse_ok(const std::string& body, const ConversationLookup& previous = {}) {
  ParsedResponses p = parse_responses_request(body, previous);
  EXPECT_TRUE(p.request.has_value()) << body << " -> " << p.error.message;
  return p.request ? std::move(*p.request) : ResponsesRequest{};
}

ApiError parse_error(const std::string& body, const ConversationLookup& previous = {}) {
  ParsedResponses p = parse_responses_request(body, previous);
  EXPECT_FALSE(p.request.has_value()) << body;
  return p.error;
}

TEST(ResponsesApiTest, InputItemsBecomeChatMessages) {
  const ResponsesRequest r = parse_ok(R"({
    "model": "m", "instructions": "be brief", "max_output_tokens": 7, "temperature": 0.5, "top_p": 0.9,
    "input": [
      {"role": "user", "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]},
      {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "hmm"}]},
      {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "c"}]},
      {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": "{}"},
      {"type": "function_call", "call_id": "call_2", "name": "g", "arguments": "{\"x\":1}"},
      {"type": "function_call_output", "call_id": "call_1", "output": "r1"},
      {"type": "function_call_output", "call_id": "call_2", "output": [{"type": "input_text", "text": "r2"}]},
      {"role": "developer", "content": "d"}
    ]})");
  const json m = json::parse(r.generate.generation.messages.dump());
  const json want = json::parse(R"([
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": "a\nb"},
    {"role": "assistant", "content": "c", "reasoning_content": "hmm", "tool_calls": [
      {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}},
      {"id": "call_2", "type": "function", "function": {"name": "g", "arguments": "{\"x\":1}"}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "r1"},
    {"role": "tool", "tool_call_id": "call_2", "content": "r2"},
    {"role": "developer", "content": "d"}])");
  EXPECT_EQ(m, want) << m.dump(1);
  EXPECT_EQ(r.generate.generation.sampling.temperature, 0.5f);
  EXPECT_EQ(r.generate.generation.max_tokens, 7);
  EXPECT_EQ(r.input_items.size(), 8u);
  for (const json& item : r.input_items)
    EXPECT_TRUE(item["id"].is_string() && !item["id"].get<std::string>().empty());
  // The instructions are not part of the conversation a later response continues.
  EXPECT_EQ(r.input_messages, json(std::vector<json>(want.begin() + 1, want.end())));
  EXPECT_EQ(r.echo["instructions"], "be brief");
  EXPECT_EQ(r.echo["max_output_tokens"], 7);
}

TEST(ResponsesApiTest, APreviousResponseComesBeforeTheInput) {
  auto lookup = [](const std::string& id) -> std::optional<json> {
    if (id != "resp_1") return std::nullopt;
    return json::parse(R"([{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}])");
  };
  const ResponsesRequest r =
      parse_ok(R"({"input": "q2", "previous_response_id": "resp_1", "instructions": "i"})", lookup);
  EXPECT_EQ(json::parse(r.generate.generation.messages.dump()),
            json::parse(R"([{"role": "system", "content": "i"},
    {"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}, {"role": "user", "content": "q2"}])"));
  EXPECT_EQ(r.echo["previous_response_id"], "resp_1");
  EXPECT_EQ(parse_error(R"({"input": "x", "previous_response_id": "resp_2"})", lookup).param,
            "previous_response_id");
}

TEST(ResponsesApiTest, ToolsTextAndReasoningMapOntoChatFields) {
  const ResponsesRequest r = parse_ok(R"({"input": "x",
    "tools": [{"type": "function", "name": "f", "description": "d", "parameters": {"type": "object"}, "strict": true}],
    "tool_choice": {"type": "function", "name": "f"}, "parallel_tool_calls": false,
    "text": {"format": {"type": "json_schema", "name": "s", "schema": {"type": "object"}}},
    "include": ["message.output_text.logprobs"], "top_logprobs": 3, "seed": 5, "stream": true})");
  const GenerationRequest& g = r.generate.generation;
  EXPECT_EQ(json::parse(g.tools.dump()),
            json::parse(R"([{"type": "function", "function": {"name": "f", "description": "d",
    "parameters": {"type": "object"}, "strict": true}}])"));
  ASSERT_TRUE(g.tool_choice.has_value());
  EXPECT_EQ(g.tool_choice->name, "f");
  EXPECT_FALSE(g.parallel_tool_calls);
  ASSERT_TRUE(g.structured_output.has_value());
  EXPECT_EQ(g.structured_output->kind, StructuredOutput::Kind::kJsonSchema);
  EXPECT_TRUE(r.logprobs && r.generate.logprobs && r.stream && r.store);
  EXPECT_EQ(g.sampling.logprobs, 3);
  EXPECT_EQ(g.sampling.seed, 5u);
  EXPECT_EQ(r.echo["tools"][0]["name"], "f");
  EXPECT_EQ(r.echo["text"]["format"]["type"], "json_schema");
}

TEST(ResponsesApiTest, ErrorsNameTheResponsesField) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"input": "x", "max_output_tokens": "7"})", "max_output_tokens"},
      {R"({"input": "x", "text": {"format": {"type": "json_schema", "schema": 3}}})", "text.format"},
      {R"({"input": "x", "reasoning": {"effort": 3}})", "reasoning.effort"},
      {R"({"input": "x", "tools": [{"type": "file_search"}]})", "tools[0].type"},
      {R"({"input": "x", "tools": [{"type": "function", "name": "f", "extra": 1}]})", "tools[0].extra"},
      {R"({"input": 5})", "input"},
      {R"({"input": []})", "input"},
      {R"({"input": [{"role": "tool", "content": "x"}]})", "input[0].role"},
      {R"({"input": [{"type": "function_call_output", "output": "x"}]})", "input[0].call_id"},
      {R"({"input": [{"type": "item_reference", "id": "x"}]})", "input[0].type"},
      {R"({"input": [{"type": "reasoning", "encrypted_content": "e"}]})", "input[0].encrypted_content"},
      {R"({"input": "x", "stream_options": {}})", "stream_options"},
      {R"({"input": "x", "text": {"verbosity": "high"}})", "text.verbosity"},
      {R"({"input": "x", "service_tier": "flex"})", "service_tier"},
      {R"({"input": "x", "prompt": {"id": "p"}})", "prompt"},
      {R"({"input": "x", "store": "yes"})", "store"},
      {R"([1])", ""},
  };
  for (const auto& [body, param] : cases) {
    const ApiError e = parse_error(body);
    EXPECT_EQ(e.status, 400) << body;
    EXPECT_EQ(e.param, param) << body << " -> " << e.message;
  }
  // The chat parser's message names the Responses field too (bounds are InputProcessor's: the
  // server maps its errors the same way).
  EXPECT_NE(parse_error(R"({"input": "x", "max_output_tokens": "7"})").message.find("'max_output_tokens'"),
            std::string::npos);
}

TEST(ResponsesApiTest, ParserSurvivesRandomBodies) {
  std::mt19937 rng(7);
  const std::string pieces[] = {"{",
                                "}",
                                "[",
                                "]",
                                ",",
                                ":",
                                "\"input\"",
                                "\"type\"",
                                "\"function_call\"",
                                "\"message\"",
                                "\"role\"",
                                "\"user\"",
                                "\"content\"",
                                "1",
                                "null",
                                "\"x\"",
                                "\"tools\"",
                                "\"text\"",
                                "\"format\"",
                                "\"previous_response_id\""};
  auto lookup = [](const std::string& id) -> std::optional<json> {
    if (id.size() % 2) return std::nullopt;
    return json::array({{{"role", "user"}, {"content", id}}});
  };
  for (int i = 0; i < 3000; ++i) {
    std::string body;
    const int n = 1 + static_cast<int>(rng() % 30);
    for (int k = 0; k < n; ++k) body += pieces[rng() % std::size(pieces)];
    (void)parse_responses_request(body, lookup);
  }
}

// The events' types and their data, in order.
std::vector<json> events_of(const std::string& sse) {
  std::vector<json> out;
  size_t at = 0;
  while (at < sse.size()) {
    const size_t end = sse.find("\n\n", at);
    EXPECT_NE(end, std::string::npos);
    const std::string block = sse.substr(at, end - at);
    const size_t nl = block.find('\n');
    json data = json::parse(block.substr(nl + 7));
    EXPECT_EQ(block.substr(7, nl - 7), data["type"].get<std::string>());
    out.push_back(std::move(data));
    at = end + 2;
  }
  return out;
}

OutputProcessor finished_choice(int tokens, FinishReason reason) {
  OutputProcessor c(nullptr, OutputOptions{});
  StepOutput out;
  for (int k = 0; k < tokens; ++k) out.new_tokens.push_back(k + 1);
  out.finished = true;
  out.finish_reason = reason;
  (void)c.apply(out, OutputProcessor::Clock::now());
  return c;
}

TEST(ResponsesApiTest, ItemsOpenInTheOrderTheModelWritesThem) {
  ResponsesRequest request = parse_ok(R"({"input": "x", "include": ["message.output_text.logprobs"]})");
  ResponsesAnswer answer("resp_1", 100, "m", request, nullptr);
  std::vector<json> events = events_of(answer.created_events());
  auto feed = [&](ChoiceDelta d) {
    for (json& e : events_of(answer.apply(d))) events.push_back(std::move(e));
  };
  ChoiceDelta d;
  d.reasoning = "think";
  d.tokens = {1};
  d.logprobs = {{1, -0.5f, {}, 0}};
  feed(d);
  d = {};
  d.reasoning = " more";
  d.content = "\n";  // whitespace: held until text or a call comes
  d.tokens = {2};
  d.logprobs = {{2, -0.25f, {}, 0}};
  feed(d);
  d = {};
  d.content = "Hi";
  d.tokens = {3};
  d.logprobs = {{3, -0.125f, {{3, -0.125f}}, 0}};
  feed(d);
  d = {};
  d.content = "\n\n";  // before a call, but a message is open: part of its text
  d.tool_calls = {{0, std::string("call_a"), std::string("f"), "{\"a\""}};
  feed(d);
  d = {};
  d.tool_calls = {{0, std::nullopt, std::nullopt, ": 1}"},
                  {1, std::string("call_b"), std::string("g"), "{}"}};
  feed(d);
  const OutputProcessor choice = finished_choice(5, FinishReason::kStop);
  for (json& e : events_of(answer.finish(choice, 9))) events.push_back(std::move(e));

  std::vector<std::string> types;
  for (size_t i = 0; i < events.size(); ++i) {
    EXPECT_EQ(events[i]["sequence_number"], i);
    types.push_back(events[i]["type"]);
  }
  const std::vector<std::string> want = {"response.created",
                                         "response.in_progress",
                                         "response.output_item.added",
                                         "response.content_part.added",
                                         "response.reasoning_text.delta",
                                         "response.reasoning_text.delta",
                                         "response.reasoning_text.done",
                                         "response.content_part.done",
                                         "response.output_item.done",
                                         "response.output_item.added",
                                         "response.content_part.added",
                                         "response.output_text.delta",
                                         "response.output_text.delta",
                                         "response.output_text.done",
                                         "response.content_part.done",
                                         "response.output_item.done",
                                         "response.output_item.added",
                                         "response.function_call_arguments.delta",
                                         "response.function_call_arguments.delta",
                                         "response.function_call_arguments.done",
                                         "response.output_item.done",
                                         "response.output_item.added",
                                         "response.function_call_arguments.delta",
                                         "response.function_call_arguments.done",
                                         "response.output_item.done",
                                         "response.completed"};
  EXPECT_EQ(types, want);
  const json& r = answer.response();
  EXPECT_EQ(r, events.back()["response"]);
  EXPECT_EQ(r["status"], "completed");
  ASSERT_EQ(r["output"].size(), 4u);
  EXPECT_EQ(r["output"][0]["content"][0]["text"], "think more");
  EXPECT_EQ(r["output"][1]["content"][0]["text"], "\nHi\n\n");
  // The whitespace's token waited for the text; the reasoning-only token has no logprob.
  const json& lps = r["output"][1]["content"][0]["logprobs"];
  ASSERT_EQ(lps.size(), 2u);
  EXPECT_EQ(lps[0]["logprob"], -0.25);
  EXPECT_EQ(lps[1]["top_logprobs"].size(), 1u);
  EXPECT_EQ(r["output"][2]["arguments"], "{\"a\": 1}");
  EXPECT_EQ(r["output"][2]["call_id"], "call_a");
  EXPECT_EQ(r["output"][3]["name"], "g");
  EXPECT_EQ(r["usage"], json::parse(R"({"input_tokens": 9, "input_tokens_details": {"cached_tokens": 0},
    "output_tokens": 5, "output_tokens_details": {"reasoning_tokens": 1}, "total_tokens": 14})"));
  const json m = answer.assistant_message();
  EXPECT_EQ(m["content"], "\nHi\n\n");
  EXPECT_EQ(m["reasoning_content"], "think more");
  EXPECT_EQ(m["tool_calls"].size(), 2u);
}

TEST(ResponsesApiTest, WhitespaceBeforeACallIsNoMessageAndAnEmptyAnswerIsOne) {
  ResponsesRequest request = parse_ok(R"({"input": "x"})");
  {
    ResponsesAnswer answer("resp_1", 0, "m", request, nullptr);
    ChoiceDelta d;
    d.content = "\n";
    (void)answer.apply(d);
    d = {};
    d.tool_calls = {{0, std::string("call_a"), std::string("f"), "{}"}};
    (void)answer.apply(d);
    (void)answer.finish(finished_choice(2, FinishReason::kStop), 1);
    ASSERT_EQ(answer.response()["output"].size(), 1u);
    EXPECT_EQ(answer.response()["output"][0]["type"], "function_call");
  }
  {
    ResponsesAnswer answer("resp_2", 0, "m", request, nullptr);
    const std::vector<json> events = events_of(answer.finish(finished_choice(1, FinishReason::kLength), 1));
    EXPECT_EQ(events.back()["type"], "response.incomplete");
    EXPECT_EQ(answer.response()["incomplete_details"]["reason"], "max_output_tokens");
    ASSERT_EQ(answer.response()["output"].size(), 1u);
    EXPECT_EQ(answer.response()["output"][0]["content"][0]["text"], "");
  }
  {
    ResponsesAnswer answer("resp_3", 0, "m", request, nullptr);
    const std::vector<json> events = events_of(answer.failed_event("boom", true));
    EXPECT_EQ(events[0]["type"], "response.failed");
    EXPECT_EQ(events[0]["response"]["error"]["message"], "boom");
  }
}

TEST(ResponsesApiTest, TheStoreKeepsTheNewest) {
  ResponseStore store(2);
  const std::vector<std::string> ids = {"r0", "r1", "r2", "r3", "r4", "r5", "r6", "r7", "r8", "r9"};
  for (int i = 0; i < 3; ++i) store.put(ids[i], json{{"id", i}}, json::array({i}), json::array());
  EXPECT_FALSE(store.response("r0").has_value());
  EXPECT_EQ(*store.conversation("r2"), json::array({2}));
  EXPECT_TRUE(store.erase("r1"));
  EXPECT_FALSE(store.erase("r1"));
  for (int i = 3; i < 10; ++i) store.put(ids[i], json{{"id", i}}, json::array(), json::array());
  EXPECT_EQ(store.size(), 2u);
  EXPECT_TRUE(store.response("r9").has_value() && store.response("r8").has_value());
  ResponseStore none(0);
  none.put("x", json::object(), json::array(), json::array());
  EXPECT_FALSE(none.response("x").has_value());
}

}  // namespace
}  // namespace inferd
