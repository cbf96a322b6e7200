// Tool calls found in streamed text: every chunking gives the same content and calls, the
// streamed argument fragments add up to the final arguments, ids and names come first.
#include "engine/tool_call_parser.h"

#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>

namespace inferd {
namespace {

struct Parsed {
  std::string content;
  std::vector<ToolCall> calls;
  std::map<int32_t, ToolCall> streamed;  // index -> what the deltas said
};

// Feeds `text` in three pieces cut at `a` and `b`, checking the delta order on the way.
Parsed parse(ToolCallFormat format, const std::string& text, size_t a, size_t b, int32_t max_calls = 8) {
  ToolCallParser p(format, max_calls);
  Parsed out;
  auto take = [&](ToolCallParser::Parts parts) {
    out.content += parts.content;
    for (const ToolCallDelta& d : parts.calls) {
      const bool first = out.streamed.count(d.index) == 0;
      EXPECT_EQ(first, d.id.has_value()) << "the id comes with a call's first delta only";
      EXPECT_EQ(first, d.name.has_value());
      ToolCall& c = out.streamed[d.index];
      if (d.id) c.id = *d.id;
      if (d.name) c.name = *d.name;
      c.arguments += d.arguments;
    }
  };
  take(p.feed(text.substr(0, a)));
  take(p.feed(text.substr(a, b - a)));
  take(p.feed(text.substr(b)));
  take(p.finish());
  out.calls = p.calls();
  return out;
}

// Every way of cutting `text` in three gives `content` and calls named `names` with `arguments`.
void expect_calls(ToolCallFormat format, const std::string& text, const std::string& content,
                  const std::vector<std::pair<std::string, std::string>>& calls, int32_t max_calls = 8) {
  for (size_t a = 0; a <= text.size(); ++a) {
    for (size_t b = a; b <= text.size(); b += 5) {
      const Parsed p = parse(format, text, a, b, max_calls);
      ASSERT_EQ(p.content, content) << text << " cut " << a << "," << b;
      ASSERT_EQ(p.calls.size(), calls.size()) << text << " cut " << a << "," << b;
      ASSERT_EQ(p.streamed.size(), calls.size());
      for (size_t i = 0; i < calls.size(); ++i) {
        EXPECT_EQ(p.calls[i].name, calls[i].first);
        EXPECT_EQ(p.calls[i].arguments, calls[i].second);
        const ToolCall& s = p.streamed.at(static_cast<int32_t>(i));
        EXPECT_EQ(s.name, calls[i].first);
        EXPECT_EQ(s.arguments, calls[i].second) << "fragments add up to the arguments";
        EXPECT_EQ(s.id, p.calls[i].id);
        EXPECT_EQ(s.id.rfind("call_", 0), 0u);
        EXPECT_TRUE(nlohmann::json::accept(p.calls[i].arguments));
      }
    }
  }
}

TEST(ToolCallParserTest, HermesBlocksAreCallsAndTheRestIsContent) {
  expect_calls(ToolCallFormat::kHermes,
               "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", "
               "\"unit\": \"c\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n"
               "</tool_call>",
               "Let me check.\n", {{"get_weather", R"({"city": "Paris", "unit": "c"})"}, {"get_time", "{}"}});
  // Braces and quotes inside strings; arguments before the name; no arguments at all.
  expect_calls(ToolCallFormat::kHermes,
               "<tool_call>{\"arguments\": {\"q\": \"a \\\"}\\\" {b\", \"n\": [1, {\"x\": null}]}, \"name\": "
               "\"search\"}</tool_call><tool_call>{\"name\": \"ping\"}</tool_call>",
               "", {{"search", R"({"q": "a \"}\" {b", "n": [1, {"x": null}]})"}, {"ping", "{}"}});
  expect_calls(ToolCallFormat::kHermes, "No tools needed <tool", "No tools needed <tool", {});
}

TEST(ToolCallParserTest, CallsBeyondTheLimitAreDroppedAndBrokenOnesAreContent) {
  const std::string two =
      "<tool_call>{\"name\": \"a\", \"arguments\": {\"k\": 1}}</tool_call>\n<tool_call>{\"name\": \"b\", "
      "\"arguments\": {}}</tool_call>";
  expect_calls(ToolCallFormat::kHermes, two, "", {{"a", R"({"k": 1})"}}, /*max_calls=*/1);
  expect_calls(ToolCallFormat::kHermes, "x<tool_call>not json</tool_call>",
               "x<tool_call>not json</tool_call>", {});
  // A call the output never finishes: announced and streamed, but not a call of the answer.
  const Parsed cut =
      parse(ToolCallFormat::kHermes, "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": ", 5, 9);
  EXPECT_TRUE(cut.calls.empty());
  EXPECT_EQ(cut.streamed.at(0).name, "f");
}

TEST(ToolCallParserTest, Llama3JsonCallsOpenTheOutput) {
  expect_calls(ToolCallFormat::kLlama3Json,
               "{\"name\": \"f\", \"parameters\": {\"a\": [1, {\"b\": \"}\"}]}}; {\"name\": \"g\", "
               "\"parameters\": {}}",
               "", {{"f", R"({"a": [1, {"b": "}"}]})"}, {"g", "{}"}});
  expect_calls(ToolCallFormat::kLlama3Json, "<|python_tag|>{\"name\": \"f\", \"parameters\": {\"x\": 2}}", "",
               {{"f", R"({"x": 2})"}});
  expect_calls(ToolCallFormat::kLlama3Json, "The answer is {not a call}.", "The answer is {not a call}.", {});
}

}  // namespace
}  // namespace inferd
