// The input side of the request front end: every bound checked once, naming the field; the
// context window; what a model without tokenizer or template can serve; what reaches the engine.
#include "engine/input_processor.h"

#include <gtest/gtest.h>

#include <limits>

#include "test_support.h"
#include "tokenizer/vocab.h"

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
         r.sampling.prompt_logprobs = 0;
         r.n = 2;
       },
       "prompt_logprobs"},
      {[](GenerationRequest& r) { r.sampling.prompt_logprobs = 21; }, "prompt_logprobs"},
      {[](GenerationRequest& r) { r.chat_template_kwargs = 3; }, "chat_template_kwargs"},
      {[](GenerationRequest& r) { r.sampling.min_tokens = -1; }, "min_tokens"},
      {[](GenerationRequest& r) {
         r.max_tokens = 5;
         r.sampling.min_tokens = 6;
       },
       "min_tokens"},
      {[](GenerationRequest& r) { r.sampling.min_tokens = 62; }, "min_tokens"},  // 61 tokens fit
      {[](GenerationRequest& r) {
         r.sampling.allowed_token_ids = {3, 100};
       },
       "allowed_token_ids"},
      {[](GenerationRequest& r) { r.sampling.allowed_token_ids = {-1}; }, "allowed_token_ids"},
      {[](GenerationRequest& r) {
         r.bad_words = {"fine", " \t"};
       },
       "bad_words"},
      {[](GenerationRequest& r) { r.add_generation_prompt = true; }, "add_generation_prompt"},
      {[](GenerationRequest& r) { r.continue_final_message = true; }, "continue_final_message"},
      {[](GenerationRequest& r) { r.truncate_prompt_tokens = 0; }, "truncate_prompt_tokens"},
      {[](GenerationRequest& r) { r.truncate_prompt_tokens = -2; }, "truncate_prompt_tokens"},
      {[](GenerationRequest& r) { r.truncate_prompt_tokens = 65; }, "truncate_prompt_tokens"},
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
TEST(InputProcessorTest, AnEmbeddingMayFillTheContextWindowAndNoMore) {
  GenerationRequest r = ids_request(std::vector<int32_t>(64, 5));  // the whole window of 64
  r.prompts.push_back({"", {7, 8}, true});
  r.pooling = Pooling::kMean;
  r.normalize_embedding = false;
  InputProcessed p = processor().process(r);
  ASSERT_TRUE(p.input.has_value()) << p.error.message;
  ASSERT_EQ(p.input->requests.size(), 2u);
  for (const RequestSpec& spec : p.input->requests) {
    EXPECT_EQ(spec.pooling, Pooling::kMean);
    EXPECT_FALSE(spec.normalize_embedding);
    EXPECT_EQ(spec.limits.max_tokens, 0);
  }
  EXPECT_EQ(p.input->num_prompt_tokens, 66);
  r.prompts[0].ids.push_back(5);  // 65 tokens
  const InputError e = refused(r);
  EXPECT_EQ(e.kind, InputError::Kind::kContextLength);
  EXPECT_NE(e.message.find("the input has 65 tokens"), std::string::npos) << e.message;
}

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

// vLLM's prompt options: left truncation, the BOS of a text prompt, and what min_tokens,
// allowed_token_ids and bad_words give the engine.
TEST(InputProcessorTest, TruncationBosAndTheSamplingMasks) {
  auto vocab = vocab_from_hf_dir(test::fixture_path("tokenizer/tiny_llama3_style"));
  ASSERT_TRUE(vocab.has_value()) << vocab.status().message();
  auto tok = Tokenizer::create(std::move(*vocab));
  ASSERT_TRUE(tok.has_value()) << tok.status().message();
  const Tokenizer& t = **tok;
  const InputProcessor p(&t, nullptr, InputLimits{64, t.vocab_size(), 4});
  const int32_t bos = *t.vocab().bos_id;
  const std::string text = "the quick brown fox jumps over the lazy dog";
  const std::vector<int32_t> body = t.encode(text, true);
  ASSERT_GT(body.size(), 5u);
  GenerationRequest r;
  r.prompts.push_back({text, {}, false});
  r.echo = true;
  InputProcessed in = p.process(r);
  ASSERT_TRUE(in.input.has_value()) << in.error.message;
  EXPECT_EQ(in.input->requests[0].prompt.front(), bos);  // add_special_tokens: true by default
  EXPECT_EQ(in.input->echo[0], text);
  r.add_special_tokens = false;
  in = p.process(r);
  ASSERT_TRUE(in.input.has_value()) << in.error.message;
  EXPECT_EQ(in.input->requests[0].prompt, body);
  r.truncate_prompt_tokens = 3;  // the last 3 tokens; echo shows what the model saw
  in = p.process(r);
  ASSERT_TRUE(in.input.has_value()) << in.error.message;
  const std::vector<int32_t> last3(body.end() - 3, body.end());
  EXPECT_EQ(in.input->requests[0].prompt, last3);
  EXPECT_EQ(in.input->echo[0], t.decode(last3));
  EXPECT_EQ(in.input->requests[0].limits.max_tokens, 61);  // the window after truncation
  r.truncate_prompt_tokens = 40;                           // longer than the prompt: all of it
  in = p.process(r);
  ASSERT_TRUE(in.input.has_value()) << in.error.message;
  EXPECT_EQ(in.input->requests[0].prompt, body);

  GenerationRequest m;
  m.prompts.push_back({"hello", {}, false});
  m.stop_token_ids = {5};
  m.sampling.min_tokens = 4;
  m.sampling.allowed_token_ids = {5, 6, 7};
  m.bad_words = {"fox", "  lazy dog"};
  m.skip_special_tokens = false;
  in = p.process(m);
  ASSERT_TRUE(in.input.has_value()) << in.error.message;
  const SamplingParams& s = in.input->requests[0].sampling;
  EXPECT_EQ(s.min_tokens, 4);
  EXPECT_EQ(in.input->min_tokens, 4);
  EXPECT_FALSE(in.input->skip_special_tokens);
  EXPECT_EQ(s.allowed_token_ids, (std::vector<int32_t>{5, 6, 7}));
  // min_tokens holds back every stop token: the request's and the model's.
  EXPECT_EQ(s.end_token_ids, in.input->requests[0].limits.stop_token_ids);
  EXPECT_NE(std::find(s.end_token_ids.begin(), s.end_token_ids.end(), 5), s.end_token_ids.end());
  EXPECT_GT(s.end_token_ids.size(), 1u);
  // Each word alone and after a space, as vLLM tokenizes them (the leading blanks of "  lazy dog"
  // dropped first). The spaced form counts only when it starts with another token and has as
  // many: " fox" does (a token of its own for " f"), " lazy dog" does not (a lone space token).
  const auto fox = t.encode("fox", true), spaced_fox = t.encode(" fox", true);
  const auto lazy = t.encode("lazy dog", true), spaced_lazy = t.encode(" lazy dog", true);
  ASSERT_NE(fox[0], spaced_fox[0]);
  ASSERT_EQ(fox.size(), spaced_fox.size());
  ASSERT_EQ(spaced_lazy.size(), lazy.size() + 1);
  EXPECT_EQ(s.bad_words, (std::vector<std::vector<int32_t>>{fox, spaced_fox, lazy}));
  // Without a tokenizer bad_words cannot be tokenized.
  GenerationRequest ids = ids_request();
  ids.bad_words = {"x"};
  EXPECT_EQ(refused(ids).kind, InputError::Kind::kUnsupported);
  EXPECT_EQ(refused(ids).field, "bad_words");
}

// add_generation_prompt off, and continue_final_message: the prompt ends inside the last
// message (transformers' rule), so the model continues it.
TEST(InputProcessorTest, ChatPromptsThatContinueTheLastMessage) {
  auto tok = test::tiny_qwen_style_tokenizer();
  auto tmpl = ChatTemplate::compile(
      "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content | trim }}<|im_end|>\n{% endfor %}"
      "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}");
  ASSERT_TRUE(tmpl.has_value()) << tmpl.status().message();
  const InputProcessor p(tok.get(), &*tmpl, InputLimits{256, tok->vocab_size(), 4});
  auto prompt_text = [&](const GenerationRequest& r) {
    InputProcessed in = p.process(r);
    EXPECT_TRUE(in.input.has_value()) << in.error.message;
    return in.input ? tok->decode(in.input->requests[0].prompt) : std::string();
  };
  GenerationRequest r;
  r.messages = nlohmann::ordered_json::array(
      {{{"role", "user"}, {"content", "hi"}}, {{"role", "assistant"}, {"content", "Sure, here "}}});
  EXPECT_EQ(
      prompt_text(r),
      "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nSure, here<|im_end|>\n<|im_start|>assistant\n");
  r.add_generation_prompt = false;
  EXPECT_EQ(prompt_text(r), "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nSure, here<|im_end|>\n");
  r.add_generation_prompt.reset();
  r.continue_final_message = true;  // the template trimmed the trailing space: cut after "here"
  EXPECT_EQ(prompt_text(r), "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nSure, here");
  r.add_generation_prompt = true;
  EXPECT_EQ(refused(r).field, "continue_final_message");
  r.add_generation_prompt = false;
  r.messages[1]["content"] = "  ";
  InputProcessed blank = p.process(r);
  ASSERT_FALSE(blank.input.has_value());
  EXPECT_EQ(blank.error.field, "messages");
  // A template that rewrites the content: the prompt cannot end inside it.
  auto upper = ChatTemplate::compile("{% for m in messages %}{{ m.content | upper }}{% endfor %}");
  ASSERT_TRUE(upper.has_value());
  const InputProcessor q(tok.get(), &*upper, InputLimits{256, tok->vocab_size(), 4});
  r.messages[1]["content"] = "more";
  InputProcessed rewritten = q.process(r);
  ASSERT_FALSE(rewritten.input.has_value());
  EXPECT_NE(rewritten.error.message.find("continue_final_message"), std::string::npos);
}

// vLLM's chat_template (where the server trusts requests' templates), documents and
// reasoning_effort: rendered by the template that reads them; refused, naming the field, where
// nothing would change (the template does not use them) or the server does not trust templates.
TEST(InputProcessorTest, RequestTemplatesDocumentsAndReasoningEffort) {
  auto tok = test::tiny_qwen_style_tokenizer();
  auto model_template = ChatTemplate::compile(
      "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}");
  ASSERT_TRUE(model_template.has_value());
  InputLimits limits{256, tok->vocab_size(), 4};
  const InputProcessor untrusting(tok.get(), &*model_template, limits);
  limits.trust_request_chat_template = true;
  const InputProcessor trusting(tok.get(), &*model_template, limits);
  auto prompt_text = [&](const InputProcessor& p, const GenerationRequest& r) {
    InputProcessed in = p.process(r);
    EXPECT_TRUE(in.input.has_value()) << in.error.message;
    return in.input ? tok->decode(in.input->requests[0].prompt) : std::string();
  };
  auto error_of = [&](const InputProcessor& p, const GenerationRequest& r) {
    InputProcessed in = p.process(r);
    EXPECT_FALSE(in.input.has_value());
    return in.error;
  };
  GenerationRequest r;
  r.messages = nlohmann::ordered_json::array({{{"role", "user"}, {"content", "hi"}}});
  EXPECT_EQ(prompt_text(untrusting, r), "<|im_start|>user\nhi<|im_end|>\n");
  const std::string rag =
      "{% if reasoning_effort is defined %}[effort {{ reasoning_effort }}]{% endif %}"
      "{% for d in documents | default([]) %}[doc {{ d.title }}: {{ d.text }}]{% endfor %}"
      "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}";
  r.chat_template = rag;
  const InputError untrusted = error_of(untrusting, r);
  EXPECT_EQ(untrusted.field, "chat_template");
  EXPECT_NE(untrusted.message.find("--trust-request-chat-template"), std::string::npos);
  EXPECT_EQ(prompt_text(trusting, r), "user: hi\n");
  r.documents = nlohmann::ordered_json::array(
      {{{"title", "A"}, {"text", "alpha"}}, {{"title", "B"}, {"text", "beta"}}});
  r.reasoning_effort = "low";
  EXPECT_EQ(prompt_text(trusting, r), "[effort low][doc A: alpha][doc B: beta]user: hi\n");
  // The same template through chat_template_kwargs (vLLM takes it there too).
  GenerationRequest k = r;
  k.chat_template.reset();
  k.chat_template_kwargs = {{"chat_template", rag}};
  EXPECT_EQ(prompt_text(trusting, k), "[effort low][doc A: alpha][doc B: beta]user: hi\n");
  EXPECT_EQ(error_of(untrusting, k).field, "chat_template_kwargs");
  // The model's template reads neither documents nor reasoning_effort.
  GenerationRequest plain = r;
  plain.chat_template.reset();
  plain.reasoning_effort.reset();
  EXPECT_EQ(error_of(trusting, plain).field, "documents");
  plain.documents = nullptr;
  plain.reasoning_effort = "high";
  EXPECT_EQ(error_of(trusting, plain).field, "reasoning_effort");
  // Values: the effort's names, documents as objects of strings; a template that does not
  // compile names the field; completions take none of them.
  GenerationRequest bad = r;
  bad.reasoning_effort = "extreme";
  EXPECT_EQ(error_of(trusting, bad).field, "reasoning_effort");
  bad = r;
  bad.documents = nlohmann::ordered_json::array({{{"title", 1}}});
  EXPECT_EQ(error_of(trusting, bad).field, "documents");
  bad = r;
  bad.chat_template = "{% for %}";
  const InputError broken = error_of(trusting, bad);
  EXPECT_EQ(broken.field, "chat_template");
  EXPECT_NE(broken.message.find("line 1"), std::string::npos) << broken.message;
  bad.documents = nullptr;
  bad.reasoning_effort.reset();
  bad.chat_template = "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}";
  EXPECT_EQ(error_of(trusting, bad).field, "chat_template");  // the render's loop limit
  GenerationRequest completion = ids_request();
  completion.reasoning_effort = "low";
  EXPECT_EQ(refused(completion).field, "reasoning_effort");
}

// best_of: each prompt is sampled best_of times, with the chosen tokens' logprobs to rank them.
TEST(InputProcessorTest, BestOfSamplesMoreThanItAnswers) {
  GenerationRequest r = ids_request();
  r.n = 2;
  r.best_of = 5;
  InputProcessed in = processor().process(r);
  ASSERT_TRUE(in.input.has_value()) << in.error.message;
  EXPECT_EQ(in.input->requests[0].n, 5);
  EXPECT_EQ(in.input->answered, 2);
  EXPECT_EQ(in.input->requests[0].sampling.logprobs, 0);
  r.sampling.logprobs = 3;  // the client's own logprobs are kept
  EXPECT_EQ(processor().process(r).input->requests[0].sampling.logprobs, 3);
  EXPECT_EQ(processor().process(ids_request()).input->answered, 0);
  r.best_of = 1;  // below n
  EXPECT_EQ(refused(r).field, "best_of");
  r.best_of = kMaxSamples + 1;
  EXPECT_EQ(refused(r).field, "best_of");
  r = ids_request();
  r.best_of = 2;
  r.sampling.prompt_logprobs = 1;
  EXPECT_EQ(refused(r).field, "best_of");
}

// Beam search: what would shape sampling is refused with it; length_penalty needs it.
TEST(InputProcessorTest, BeamSearchRefusesWhatItWouldIgnore) {
  GenerationRequest r = ids_request();
  r.use_beam_search = true;
  r.n = 3;
  r.length_penalty = 0.5f;
  r.sampling.logprobs = 2;
  InputProcessed in = processor().process(r);
  ASSERT_TRUE(in.input.has_value()) << in.error.message;
  EXPECT_EQ(in.input->beam_length_penalty, 0.5f);
  EXPECT_EQ(in.input->requests[0].n, 3);
  EXPECT_FALSE(processor().process(ids_request()).input->beam_length_penalty.has_value());
  auto conflict = [&](auto set, const char* field) {
    GenerationRequest c = r;
    set(c);
    EXPECT_EQ(refused(c).field, field);
  };
  conflict([](GenerationRequest& c) { c.sampling.temperature = 0.7f; }, "temperature");
  conflict([](GenerationRequest& c) { c.sampling.top_p = 0.9f; }, "top_p");
  conflict([](GenerationRequest& c) { c.sampling.top_k = 5; }, "top_k");
  conflict([](GenerationRequest& c) { c.sampling.repetition_penalty = 1.2f; }, "repetition_penalty");
  conflict([](GenerationRequest& c) { c.sampling.logit_bias = {{1, 5.0f}}; }, "logit_bias");
  conflict([](GenerationRequest& c) { c.stop = {"."}; }, "stop");
  conflict([](GenerationRequest& c) { c.best_of = 4; }, "best_of");
  conflict([](GenerationRequest& c) { c.session_id = "s"; }, "session_id");
  conflict([](GenerationRequest& c) { c.length_penalty = std::numeric_limits<float>::infinity(); },
           "length_penalty");
  conflict(
      [](GenerationRequest& c) {
        c.use_beam_search = false;
        c.sampling.logprobs.reset();
      },
      "length_penalty");
}

// suffix: fill in the middle in the model's FIM tokens (prefix, prompt, suffix token, suffix,
// middle token); refused for a model without them, for token-id prompts and for chat.
TEST(InputProcessorTest, SuffixFillsInTheMiddle) {
  auto vocab = vocab_from_hf_dir(test::fixture_path("tokenizer/tiny_qwen_style"));
  ASSERT_TRUE(vocab.has_value()) << vocab.status().message();
  const auto plain_tok = Tokenizer::create(*vocab);
  ASSERT_TRUE(plain_tok.has_value());
  for (const char* name : {"<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"}) {
    const auto id = static_cast<int32_t>(vocab->tokens.size());
    vocab->tokens.emplace_back(name);
    vocab->added_tokens.push_back({id, name, true});
  }
  auto tok = Tokenizer::create(std::move(*vocab));
  ASSERT_TRUE(tok.has_value()) << tok.status().message();
  const Tokenizer& t = **tok;
  const InputProcessor p(&t, nullptr, InputLimits{256, t.vocab_size(), 4});
  GenerationRequest r;
  r.prompts.push_back({"def add(a, b):\n    ", {}, false});
  r.suffix = "\n\nprint(add(1, 2))";
  InputProcessed in = p.process(r);
  ASSERT_TRUE(in.input.has_value()) << in.error.message;
  const auto fim = t.encode("<|fim_prefix|>", true);
  ASSERT_EQ(fim.size(), 1u);
  std::vector<int32_t> expected{fim[0]};
  for (int32_t id : t.encode("def add(a, b):\n    ", true)) expected.push_back(id);
  expected.push_back(t.encode("<|fim_suffix|>", true).at(0));
  for (int32_t id : t.encode("\n\nprint(add(1, 2))", true)) expected.push_back(id);
  expected.push_back(t.encode("<|fim_middle|>", true).at(0));
  EXPECT_EQ(in.input->requests[0].prompt, expected);
  EXPECT_EQ(t.decode(in.input->requests[0].prompt),
            "<|fim_prefix|>def add(a, b):\n    <|fim_suffix|>\n\nprint(add(1, 2))<|fim_middle|>");
  // A model without FIM tokens, token ids, chat: each a refusal naming suffix.
  const InputProcessor no_fim(plain_tok->get(), nullptr, InputLimits{256, t.vocab_size(), 4});
  InputProcessed refused_fim = no_fim.process(r);
  ASSERT_FALSE(refused_fim.input.has_value());
  EXPECT_EQ(refused_fim.error.kind, InputError::Kind::kUnsupported);
  EXPECT_EQ(refused_fim.error.field, "suffix");
  GenerationRequest ids = ids_request();
  ids.suffix = "x";
  EXPECT_EQ(refused(ids).field, "suffix");
  GenerationRequest chat;
  chat.messages = nlohmann::ordered_json::array({{{"role", "user"}, {"content", "hi"}}});
  chat.suffix = "x";
  EXPECT_EQ(refused(chat).field, "suffix");
}

}  // namespace
}  // namespace inferd
