// The input side of the request front end: every bound checked once, naming the field; the
// context window; what a model without tokenizer or template can serve; what reaches the engine.
#include "engine/input_processor.h"

#include <gtest/gtest.h>

#include "test_support.h"

namespace inferd {
namespace {

GenerationRequest ids_request(std::vector<int32_t> ids = {1, 2, 3}) {
  GenerationRequest r;
  r.prompts.push_back({"", std::move(ids), true});
  return r;
}

const InputProcessor& processor() {
  static const InputProcessor p(nullptr, nullptr, InputLimits{64, 100, 4});
  return p;
}

InputError refused(GenerationRequest r) {
  InputProcessed p = processor().process(std::move(r));
  EXPECT_FALSE(p.input.has_value());
  return p.error;
}

TEST(InputProcessorTest, EveryBoundNamesItsField) {
  struct Case {
    void (*set)(GenerationRequest&);
    const char* field;
  };
  const Case cases[] = {
      {[](GenerationRequest& r) { r.sampling.temperature = 2.5f; }, "temperature"},
      {[](GenerationRequest& r) { r.sampling.temperature = -0.1f; }, "temperature"},
      {[](GenerationRequest& r) { r.sampling.top_p = 0; }, "top_p"},
      {[](GenerationRequest& r) { r.sampling.top_p = 1.5f; }, "top_p"},
      {[](GenerationRequest& r) { r.sampling.top_k = -3; }, "top_k"},
      {[](GenerationRequest& r) { r.sampling.min_p = 1.1f; }, "min_p"},
      {[](GenerationRequest& r) { r.sampling.repetition_penalty = 0; }, "repetition_penalty"},
      {[](GenerationRequest& r) { r.sampling.presence_penalty = 2.5f; }, "presence_penalty"},
      {[](GenerationRequest& r) { r.sampling.frequency_penalty = -3; }, "frequency_penalty"},
      {[](GenerationRequest& r) { r.sampling.logprobs = 21; }, "logprobs"},
      {[](GenerationRequest& r) { r.n = 0; }, "n"},
      {[](GenerationRequest& r) { r.n = kMaxSamples + 1; }, "n"},
      {[](GenerationRequest& r) { r.max_tokens = 0; }, "max_tokens"},
      {[](GenerationRequest& r) {
         r.stop = {"ok", ""};
       },
       "stop"},
      {[](GenerationRequest& r) { r.stop_token_ids = {100}; }, "stop_token_ids"},
      {[](GenerationRequest& r) { r.prompts.clear(); }, "prompt"},
      {[](GenerationRequest& r) {
         r.prompts.assign(5, {"", {1}, true});
       },
       "prompt"},
      {[](GenerationRequest& r) { r.prompts[0].ids = {}; }, "prompt"},
      {[](GenerationRequest& r) {
         r.prompts[0].ids = {1, 100};
       },
       "prompt"},
      {[](GenerationRequest& r) {
         r.sampling.logit_bias = {{3, 100.5f}};
       },
       "logit_bias"},
      {[](GenerationRequest& r) {
         r.sampling.logit_bias = {{100, 1.0f}};
       },
       "logit_bias"},
      {[](GenerationRequest& r) {
         r.sampling.logit_bias = {{-1, 1.0f}};
       },
       "logit_bias"},
      {[](GenerationRequest& r) {
         r.echo = true;
         r.sampling.logprobs = 0;
       },
       "echo"},
      {[](GenerationRequest& r) { r.chat_template_kwargs = 3; }, "chat_template_kwargs"},
  };
  for (const Case& c : cases) {
    GenerationRequest r = ids_request();
    c.set(r);
    const InputError e = refused(r);
    EXPECT_EQ(e.kind, InputError::Kind::kInvalid) << c.field;
    EXPECT_EQ(e.field, c.field) << e.message;
    EXPECT_NE(e.message.find(c.field == std::string("prompt") ? "" : c.field), std::string::npos)
        << e.message;
  }
}

TEST(InputProcessorTest, TheContextWindowNamesBothNumbers) {
  GenerationRequest r = ids_request(std::vector<int32_t>(10, 1));
  r.max_tokens = 60;
  const InputError e = refused(r);
  EXPECT_EQ(e.kind, InputError::Kind::kContextLength);
  EXPECT_EQ(e.field, "max_tokens");
  EXPECT_NE(e.message.find("64"), std::string::npos);
  EXPECT_NE(e.message.find("10 tokens"), std::string::npos);
  EXPECT_NE(e.message.find("70 in total"), std::string::npos);
  // Without max_tokens a request may generate up to the rest of the window.
  InputProcessed ok = processor().process(ids_request(std::vector<int32_t>(10, 1)));
  ASSERT_TRUE(ok.input.has_value()) << ok.error.message;
  EXPECT_EQ(ok.input->requests[0].limits.max_tokens, 54);
}

// A StreamingLLM window lets the prompt and the output run past the context window (without
// max_tokens: a context's worth of output); its sink + window must fit the context.
TEST(InputProcessorTest, AStreamingWindowRunsPastTheContextWindow) {
  GenerationRequest r = ids_request(std::vector<int32_t>(100, 1));
  r.streaming = {4, 32};
  r.max_tokens = 500;
  InputProcessed ok = processor().process(r);
  ASSERT_TRUE(ok.input.has_value()) << ok.error.message;
  EXPECT_EQ(ok.input->requests[0].limits.max_tokens, 500);
  EXPECT_EQ(ok.input->requests[0].streaming.window_tokens, 32);
  EXPECT_EQ(ok.input->requests[0].streaming.sink_tokens, 4);
  r.max_tokens.reset();
  ok = processor().process(r);
  ASSERT_TRUE(ok.input.has_value()) << ok.error.message;
  EXPECT_EQ(ok.input->requests[0].limits.max_tokens, 64);
  r.streaming = {40, 32};
  EXPECT_EQ(refused(r).field, "streaming_llm");
}

TEST(InputProcessorTest, WithoutTokenizerOnlyTokenIdsAreServed) {
  GenerationRequest text;
  text.prompts.push_back({"hello", {}, false});
  EXPECT_EQ(refused(text).kind, InputError::Kind::kUnsupported);
  GenerationRequest chat;
  chat.messages = nlohmann::ordered_json::array({{{"role", "user"}, {"content", "hi"}}});
  const InputError e = refused(chat);
  EXPECT_EQ(e.kind, InputError::Kind::kUnsupported);
  EXPECT_EQ(e.field, "messages");
}

TEST(InputProcessorTest, EveryPromptBecomesOneEngineRequestWithTheSharedFields) {
  GenerationRequest r = ids_request({4, 5});
  r.prompts.push_back({"", {6, 7, 8}, true});
  r.sampling.temperature = 0.7f;
  r.sampling.seed = 9;
  r.max_tokens = 5;
  r.n = 3;
  r.priority = -2;
  r.session_id = "s";
  r.stop = {"END"};
  r.stop_token_ids = {42};
  r.ignore_eos = true;
  r.echo = true;
  r.include_stop_str_in_output = true;
  r.sampling.logit_bias = {{99, -5.0f}};
  InputProcessed p = processor().process(r);
  ASSERT_TRUE(p.input.has_value()) << p.error.message;
  ASSERT_EQ(p.input->requests.size(), 2u);
  EXPECT_EQ(p.input->num_prompt_tokens, 5);
  EXPECT_EQ(p.input->num_sequences(), 6);
  EXPECT_EQ(p.input->stop, std::vector<std::string>{"END"});
  EXPECT_TRUE(p.input->include_stop_str_in_output);
  EXPECT_EQ(p.input->echo, (std::vector<std::string>{"4 5 ", "6 7 8 "}));  // no tokenizer: the ids
  for (const RequestSpec& s : p.input->requests) {
    EXPECT_FLOAT_EQ(s.sampling.temperature, 0.7f);
    EXPECT_EQ(s.sampling.seed, 9u);
    EXPECT_EQ(s.limits.max_tokens, 5);
    EXPECT_EQ(s.limits.stop_token_ids, std::vector<int32_t>{42});
    EXPECT_TRUE(s.limits.ignore_eos);
    EXPECT_EQ(s.n, 3);
    EXPECT_EQ(s.priority, -2);
    EXPECT_EQ(s.session_id, "s");
    EXPECT_EQ(s.sampling.logit_bias.size(), 1u);
  }
  EXPECT_EQ(p.input->requests[1].prompt, (std::vector<int32_t>{6, 7, 8}));
}

// Tools: their shape, tool_choice against them, and what the server's flags allow.
TEST(InputProcessorTest, ToolsAreCheckedAndPlanned) {
  auto tok = test::tiny_qwen_style_tokenizer();
  auto tmpl = ChatTemplate::compile(
      "{% if tools %}{% for t in tools %}[{{ t.function.name }}]{% endfor %}{% endif %}"
      "{% for m in messages %}{{ m.role }}:{{ m.content }}"
      "{% for c in m.tool_calls or [] %}<{{ c.function.name }} {{ c.function.arguments | tojson }}>{% endfor "
      "%}"
      "{% endfor %}");
  ASSERT_TRUE(tmpl.has_value()) << tmpl.status().message();
  InputLimits limits{4096, tok->vocab_size(), 4};
  auto chat = [](const char* tools, std::optional<ToolChoice> choice = std::nullopt) {
    GenerationRequest r;
    r.messages = nlohmann::ordered_json::parse(
        R"([{"role": "user", "content": "hi"}, {"role": "assistant", "content": null, "tool_calls":
           [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"a\": 1}"}}]},
           {"role": "tool", "tool_call_id": "c1", "content": "2"}])");
    r.tools = nlohmann::ordered_json::parse(tools);
    r.tool_choice = choice;
    return r;
  };
  const char* good = R"([{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}])";
  // No parser: tools the model may call are refused; "none" is served without them.
  const InputProcessor plain(tok.get(), &*tmpl, limits);
  EXPECT_EQ(plain.process(chat(good)).error.field, "tools");
  auto none = plain.process(chat(good, ToolChoice{ToolChoice::Kind::kNone, ""}));
  ASSERT_TRUE(none.input.has_value()) << none.error.message;
  EXPECT_FALSE(none.input->tool_calls.has_value());
  limits.tool_call_parser = ToolCallFormat::kHermes;
  const InputProcessor no_auto(tok.get(), &*tmpl, limits);
  EXPECT_EQ(no_auto.process(chat(good)).error.field, "tool_choice");
  limits.enable_auto_tool_choice = true;
  const InputProcessor tools(tok.get(), &*tmpl, limits);
  auto planned = tools.process(chat(good));
  ASSERT_TRUE(planned.input.has_value()) << planned.error.message;
  EXPECT_EQ(planned.input->tool_calls, ToolCallFormat::kHermes);
  EXPECT_GT(planned.input->max_tool_calls, 1);
  // The template saw the tools and the history's arguments as an object.
  EXPECT_EQ(tok->decode(planned.input->requests[0].prompt), "[f]user:hiassistant:<f {\"a\": 1}>tool:2");
  auto single = chat(good);
  single.parallel_tool_calls = false;
  EXPECT_EQ(tools.process(single).input->max_tool_calls, 1);
  struct Case {
    const char* tools;
    std::optional<ToolChoice> choice;
    const char* field;
  };
  const Case bad[] = {
      {R"({"type": "function"})", std::nullopt, "tools"},
      {R"([{"type": "code"}])", std::nullopt, "tools[0]"},
      {R"([{"type": "function", "function": {"name": "has space"}}])", std::nullopt,
       "tools[0].function.name"},
      {R"([{"type": "function", "function": {"name": "f"}}, {"type": "function", "function": {"name": "f"}}])",
       std::nullopt, "tools[1].function.name"},
      {R"([{"type": "function", "function": {"name": "f", "parameters": "x"}}])", std::nullopt,
       "tools[0].function.parameters"},
      {good, ToolChoice{ToolChoice::Kind::kNamed, "g"}, "tool_choice"},
      {"null", ToolChoice{ToolChoice::Kind::kRequired, ""}, "tool_choice"},
  };
  for (const Case& c : bad) {
    auto p = tools.process(chat(c.tools, c.choice));
    EXPECT_FALSE(p.input.has_value()) << c.tools;
    EXPECT_EQ(p.error.field, c.field) << c.tools << " -> " << p.error.message;
  }
  GenerationRequest broken = chat(good);
  broken.messages[1]["tool_calls"][0]["function"]["arguments"] = "not json";
  EXPECT_EQ(tools.process(broken).error.field, "messages");
}

}  // namespace
}  // namespace inferd
