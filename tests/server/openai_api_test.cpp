#include "server/openai_api.h"

#include "engine/reasoning_splitter.h"

#include <gtest/gtest.h>

#include <tuple>

#include <random>

#include "test_support.h"

namespace inferd {
namespace {

GenerateRequest parse_ok(ApiEndpoint e, const std::string& body) {
  ParsedRequest p = parse_generate_request(e, body);
  EXPECT_TRUE(p.request.has_value()) << body << " -> " << p.error.message;
  return p.request ? *p.request : GenerateRequest{};
}

ApiError parse_error(ApiEndpoint e, const std::string& body) {
  ParsedRequest p = parse_generate_request(e, body);
  EXPECT_FALSE(p.request.has_value()) << body;
  return p.error;
}

TEST(OpenAiApiTest, ReadsEveryChatField) {
  GenerateRequest r = parse_ok(ApiEndpoint::kChat, R"({
    "model": "m", "messages": [{"role": "system", "content": "s"},
                               {"role": "user", "content": [{"type": "text", "text": "hi"}]},
                               {"role": "assistant", "content": null}, {"role": "tool", "content": "t"}],
    "max_completion_tokens": 7, "temperature": 0.5, "top_p": 0.9, "top_k": 40, "min_p": 0.1,
    "presence_penalty": 0.5, "frequency_penalty": -0.5, "repetition_penalty": 1.1, "stop": ["a", "b"],
    "seed": 42, "n": 3, "logprobs": true, "top_logprobs": 4, "stream": true,
    "stream_options": {"include_usage": true}, "ignore_eos": true, "priority": -2, "user": "u",
    "session_id": "s1", "logit_bias": {"5": -100, "17": 2.5}, "include_stop_str_in_output": true,
    "chat_template_kwargs": {"enable_thinking": false}, "metadata": {"k": "v"}, "store": false,
    "tools": null})");
  EXPECT_EQ(r.model, "m");
  EXPECT_EQ(r.generation.messages.size(), 4u);
  EXPECT_EQ(r.generation.max_tokens, 7);
  EXPECT_FLOAT_EQ(r.generation.sampling.temperature, 0.5f);
  EXPECT_FLOAT_EQ(r.generation.sampling.top_p, 0.9f);
  EXPECT_EQ(r.generation.sampling.top_k, 40);
  EXPECT_FLOAT_EQ(r.generation.sampling.min_p, 0.1f);
  EXPECT_FLOAT_EQ(r.generation.sampling.presence_penalty, 0.5f);
  EXPECT_FLOAT_EQ(r.generation.sampling.frequency_penalty, -0.5f);
  EXPECT_FLOAT_EQ(r.generation.sampling.repetition_penalty, 1.1f);
  EXPECT_EQ(r.generation.stop, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(r.generation.sampling.seed, 42u);
  EXPECT_EQ(r.generation.n, 3);
  EXPECT_TRUE(r.logprobs);
  EXPECT_EQ(r.generation.sampling.logprobs, 4);
  EXPECT_TRUE(r.stream && r.include_usage && r.generation.ignore_eos);
  EXPECT_EQ(r.generation.priority, -2);
  EXPECT_EQ(r.user, "u");
  EXPECT_EQ(r.generation.session_id, "s1");
  EXPECT_EQ(r.generation.sampling.logit_bias,
            (std::vector<std::pair<int32_t, float>>{{5, -100.0f}, {17, 2.5f}}));
  EXPECT_TRUE(r.generation.include_stop_str_in_output);
  EXPECT_EQ(r.generation.chat_template_kwargs,
            nlohmann::ordered_json::parse(R"({"enable_thinking": false})"));
  EXPECT_TRUE(parse_ok(ApiEndpoint::kCompletion, R"({"prompt": "x", "echo": true})").generation.echo);
}

// vLLM's sampling and prompt fields reach the generation request.
TEST(OpenAiApiTest, ReadsVllmsExtraFields) {
  auto r =
      parse_ok(ApiEndpoint::kChat, R"({"messages": [{"role": "user", "content": "x"}, {"role": "assistant",
      "content": "y"}], "min_tokens": 4, "allowed_token_ids": [3, 5], "bad_words": ["no", "never"],
      "skip_special_tokens": false, "spaces_between_special_tokens": false, "truncate_prompt_tokens": 9,
      "add_special_tokens": true, "add_generation_prompt": false, "continue_final_message": true,
      "return_tokens_as_token_ids": true, "prompt_logprobs": 2})");
  const GenerationRequest& g = r.generation;
  EXPECT_EQ(g.sampling.min_tokens, 4);
  EXPECT_EQ(g.sampling.allowed_token_ids, (std::vector<int32_t>{3, 5}));
  EXPECT_EQ(g.bad_words, (std::vector<std::string>{"no", "never"}));
  EXPECT_FALSE(g.skip_special_tokens);
  EXPECT_EQ(g.truncate_prompt_tokens, 9);
  EXPECT_EQ(g.add_special_tokens, true);
  EXPECT_EQ(g.add_generation_prompt, false);
  EXPECT_TRUE(g.continue_final_message);
  EXPECT_TRUE(r.return_tokens_as_token_ids);
  EXPECT_EQ(g.sampling.prompt_logprobs, 2);
  EXPECT_TRUE(r.prompt_logprobs_field);
  // echo with logprobs asks for the prompt's logprobs, with as many alternatives.
  auto echo = parse_ok(ApiEndpoint::kCompletion, R"({"prompt": "x", "echo": true, "logprobs": 3})");
  EXPECT_EQ(echo.generation.sampling.prompt_logprobs, 3);
  EXPECT_FALSE(echo.prompt_logprobs_field);
  EXPECT_EQ(
      parse_error(ApiEndpoint::kCompletion, R"({"prompt": "x", "echo": true, "logprobs": 1, "stream": true})")
          .param,
      "echo");
  EXPECT_EQ(
      parse_error(ApiEndpoint::kCompletion, R"({"prompt": "x", "prompt_logprobs": 1, "stream": true})").param,
      "prompt_logprobs");
  EXPECT_EQ(parse_ok(ApiEndpoint::kCompletion, R"({"prompt": "x", "suffix": "y"})").generation.suffix, "y");
  EXPECT_EQ(
      parse_error(ApiEndpoint::kChat, R"({"messages": [{"role": "user", "content": "x"}], "suffix": "y"})")
          .param,
      "suffix");
  auto defaults = parse_ok(ApiEndpoint::kCompletion, R"({"prompt": "x", "truncate_prompt_tokens": -1})");
  EXPECT_EQ(defaults.generation.truncate_prompt_tokens, -1);
  EXPECT_TRUE(defaults.generation.skip_special_tokens);
  EXPECT_FALSE(defaults.generation.add_special_tokens.has_value());
  EXPECT_FALSE(defaults.generation.add_generation_prompt.has_value());
  EXPECT_FALSE(defaults.return_tokens_as_token_ids);
}

// return_tokens_as_token_ids: logprobs entries name tokens "token_id:N" (with that string's bytes).
TEST(OpenAiApiTest, LogprobsNameTokensByIdWhenAsked) {
  auto tok = test::tiny_qwen_style_tokenizer();
  const int32_t id = tok->encode("a", false).at(0);
  OutputProcessor choice(tok.get(), {});
  StepOutput out;
  out.new_tokens = {id};
  out.logprobs = {-0.5f};
  out.top_logprobs = {{{id, -0.5f}}};
  out.finished = true;
  out.finish_reason = FinishReason::kLength;
  choice.apply(out, OutputProcessor::Clock::now());
  const std::vector<OutputProcessor> choices{choice};
  for (const ApiEndpoint e : {ApiEndpoint::kChat, ApiEndpoint::kCompletion}) {
    OpenAiAnswer answer(e, "x", 0, "m", tok.get(), true, false);
    auto plain = nlohmann::json::parse(answer.body(choices, Usage{1, 1}))["choices"][0]["logprobs"];
    answer.set_tokens_as_ids(true);
    auto ids = nlohmann::json::parse(answer.body(choices, Usage{1, 1}))["choices"][0]["logprobs"];
    const std::string name = "token_id:" + std::to_string(id);
    if (e == ApiEndpoint::kChat) {
      EXPECT_EQ(plain["content"][0]["token"], "a");
      EXPECT_EQ(ids["content"][0]["token"], name);
      EXPECT_EQ(ids["content"][0]["bytes"].size(), name.size());
      EXPECT_EQ(ids["content"][0]["top_logprobs"][0]["token"], name);
    } else {
      EXPECT_EQ(plain["tokens"][0], "a");
      EXPECT_EQ(ids["tokens"][0], name);
      EXPECT_TRUE(ids["top_logprobs"][0].contains(name));
    }
  }
}

// Prompt logprobs in the body: vLLM's prompt_logprobs field (null first, then each prompt token
// and the top alternatives by id, with ranks), and echo's prompt tokens before the output's.
TEST(OpenAiApiTest, PromptLogprobsInTheBody) {
  auto tok = test::tiny_qwen_style_tokenizer();
  const std::vector<int32_t> ids{tok->encode("a", false).at(0), tok->encode("b", false).at(0),
                                 tok->encode("c", false).at(0)};
  OutputOptions o;
  o.prompt_head = ids[0];
  OutputProcessor choice(tok.get(), o);
  StepOutput out;
  out.prompt_logprobs_from = 1;
  out.prompt_tokens = {ids[1], ids[2]};
  out.prompt_logprobs = {-1.5f, -0.25f};
  out.prompt_ranks = {4, 1};
  out.prompt_top_logprobs = {{{ids[0], -0.5f}, {ids[2], -1.0f}}, {{ids[2], -0.25f}, {ids[1], -2.0f}}};
  out.new_tokens = {ids[0]};
  out.logprobs = {-0.75f};
  out.top_logprobs = {{{ids[0], -0.75f}, {ids[1], -1.0f}}};
  out.finished = true;
  out.finish_reason = FinishReason::kLength;
  choice.apply(out, OutputProcessor::Clock::now());
  ASSERT_EQ(choice.prompt_logprobs().size(), 2u);
  const std::vector<OutputProcessor> choices{choice};
  OpenAiAnswer completion(ApiEndpoint::kCompletion, "x", 0, "m", tok.get(), true, false);
  completion.set_prompt_logprobs(true, true);
  const auto body = nlohmann::json::parse(completion.body(choices, Usage{3, 1}));
  const auto& c = body["choices"][0];
  const auto& pl = c["prompt_logprobs"];
  ASSERT_EQ(pl.size(), 3u);
  EXPECT_TRUE(pl[0].is_null());
  const std::string b = std::to_string(ids[1]), a = std::to_string(ids[0]), cc = std::to_string(ids[2]);
  EXPECT_EQ(pl[1].size(), 3u);  // the token itself and its two alternatives
  EXPECT_FLOAT_EQ(pl[1][b]["logprob"].get<float>(), -1.5f);
  EXPECT_EQ(pl[1][b]["rank"], 4);
  EXPECT_EQ(pl[1][b]["decoded_token"], "b");
  EXPECT_EQ(pl[1][a]["rank"], 1);
  EXPECT_EQ(pl[2].size(), 2u);  // the token is the best: one entry for it
  EXPECT_EQ(pl[2][cc]["rank"], 1);
  // echo: "a" (null), "b", "c", then the output's "a".
  const auto& lp = c["logprobs"];
  EXPECT_EQ(lp["tokens"], nlohmann::json::array({"a", "b", "c", "a"}));
  EXPECT_TRUE(lp["token_logprobs"][0].is_null());
  EXPECT_FLOAT_EQ(lp["token_logprobs"][1].get<float>(), -1.5f);
  EXPECT_FLOAT_EQ(lp["token_logprobs"][3].get<float>(), -0.75f);
  EXPECT_TRUE(lp["top_logprobs"][0].is_null());
  EXPECT_EQ(lp["top_logprobs"][1].size(), 2u);
  // Chat: the field once, at the top level.
  OpenAiAnswer chat(ApiEndpoint::kChat, "x", 0, "m", tok.get(), false, false);
  chat.set_prompt_logprobs(true, false);
  const auto chat_body = nlohmann::json::parse(chat.body(choices, Usage{3, 1}));
  EXPECT_EQ(chat_body["prompt_logprobs"], pl);
  EXPECT_FALSE(chat_body["choices"][0].contains("prompt_logprobs"));
}

TEST(OpenAiApiTest, ReadsEveryPromptForm) {
  EXPECT_EQ(parse_ok(ApiEndpoint::kCompletion, R"({"prompt": "x"})").generation.prompts.size(), 1u);
  auto ids = parse_ok(ApiEndpoint::kCompletion, R"({"prompt": [1, 2, 3], "logprobs": 2})");
  ASSERT_EQ(ids.generation.prompts.size(), 1u);
  EXPECT_TRUE(ids.generation.prompts[0].is_ids);
  EXPECT_EQ(ids.generation.prompts[0].ids, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(ids.generation.sampling.logprobs, 2);
  auto many = parse_ok(ApiEndpoint::kCompletion, R"({"prompt": ["a", [4, 5], "b"], "max_tokens": null})");
  ASSERT_EQ(many.generation.prompts.size(), 3u);
  EXPECT_FALSE(many.generation.max_tokens.has_value());
  EXPECT_TRUE(many.generation.prompts[1].is_ids);
}

TEST(OpenAiApiTest, ErrorsNameTheField) {
  struct Case {
    ApiEndpoint e;
    const char* body;
    const char* param;
  };
  const Case cases[] = {
      {ApiEndpoint::kChat, R"({"messages": []})", "messages"},
      {ApiEndpoint::kChat, R"({"messages": [{"role": "user"}]})", "messages[0].content"},
      {ApiEndpoint::kChat, R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})",
       "messages[0].content"},
      {ApiEndpoint::kChat, R"({"messages": [{"content": "x"}]})", "messages[0].role"},
      {ApiEndpoint::kChat, R"({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 3})",
       "top_logprobs"},
      {ApiEndpoint::kChat, R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 1.5})",
       "max_tokens"},
      {ApiEndpoint::kChat, R"({"messages": [{"role": "user", "content": "x"}], "seed": "1"})", "seed"},
      {ApiEndpoint::kChat, R"({"messages": [{"role": "user", "content": "x"}], "stream": 1})", "stream"},
      {ApiEndpoint::kChat, R"({"messages": [{"role": "user", "content": "x"}], "priority": 1e3})",
       "priority"},
      {ApiEndpoint::kCompletion, R"({"prompt": [1, -2]})", "prompt"},
      {ApiEndpoint::kCompletion, R"({"prompt": [[1], {"x": 1}]})", "prompt"},
      {ApiEndpoint::kCompletion, R"({"prompt": []})", "prompt"},
      {ApiEndpoint::kCompletion, R"({"prompt": "x", "stop_token_ids": ["a"]})", "stop_token_ids"},
      // Fields that would change the answer are read or refused, never ignored.
      {ApiEndpoint::kChat, R"({"messages": [{"role": "user", "content": "x"}], "unknown_field": 1})",
       "unknown_field"},
      {ApiEndpoint::kChat, R"({"messages": [{"role": "user", "content": "x"}], "tool_choice": "sometimes"})",
       "tool_choice"},
      {ApiEndpoint::kChat,
       R"({"messages": [{"role": "user", "content": "x"}], "tool_choice": {"type": "function"}})",
       "tool_choice"},
      {ApiEndpoint::kChat, R"({"messages": [{"role": "user", "content": "x"}], "parallel_tool_calls": 1})",
       "parallel_tool_calls"},
      {ApiEndpoint::kCompletion, R"({"prompt": "x", "tools": []})", "tools"},
      {ApiEndpoint::kChat,
       R"({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "xml"}})",
       "response_format"},
      {ApiEndpoint::kChat,
       R"({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_object"},
           "guided_regex": "a+"})",
       "guided_regex"},
      {ApiEndpoint::kCompletion, R"({"prompt": "x", "structured_outputs": {"whitespace_pattern": " "}})",
       "structured_outputs.whitespace_pattern"},
      {ApiEndpoint::kCompletion, R"({"prompt": "x", "guided_choice": []})", "guided_choice"},
      {ApiEndpoint::kCompletion, R"({"prompt": "x", "guided_json": "{not json"})", "guided_json"},
      {ApiEndpoint::kChat, R"({"messages": [{"role": "user", "content": "x"}], "echo": true})", "echo"},
      {ApiEndpoint::kCompletion, R"({"prompt": "x", "messages": []})", "messages"},
      {ApiEndpoint::kCompletion, R"({"prompt": "x", "max_completion_tokens": 3})", "max_completion_tokens"},
      {ApiEndpoint::kCompletion, R"({"prompt": "x", "logit_bias": [1]})", "logit_bias"},
      {ApiEndpoint::kCompletion, R"({"prompt": "x", "logit_bias": {"a": 1}})", "logit_bias"},
      {ApiEndpoint::kCompletion, R"({"prompt": "x", "logit_bias": {"-1": 1}})", "logit_bias"},
      {ApiEndpoint::kCompletion, R"({"prompt": "x", "logit_bias": {"1": "x"}})", "logit_bias"},
      {ApiEndpoint::kChat, R"({"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": 1})",
       "chat_template_kwargs"},
      {ApiEndpoint::kCompletion, R"({"prompt": "x", "min_tokens": -1})", "min_tokens"},
      {ApiEndpoint::kCompletion, R"({"prompt": "x", "min_tokens": 1.5})", "min_tokens"},
      {ApiEndpoint::kCompletion, R"({"prompt": "x", "allowed_token_ids": []})", "allowed_token_ids"},
      {ApiEndpoint::kCompletion, R"({"prompt": "x", "allowed_token_ids": [1, "2"]})", "allowed_token_ids"},
      {ApiEndpoint::kCompletion, R"({"prompt": "x", "bad_words": "word"})", "bad_words"},
      {ApiEndpoint::kCompletion, R"({"prompt": "x", "bad_words": ["a", 1]})", "bad_words"},
      {ApiEndpoint::kCompletion, R"({"prompt": "x", "skip_special_tokens": "no"})", "skip_special_tokens"},
      {ApiEndpoint::kCompletion, R"({"prompt": "x", "spaces_between_special_tokens": 0})",
       "spaces_between_special_tokens"},
      {ApiEndpoint::kCompletion, R"({"prompt": "x", "truncate_prompt_tokens": -2})",
       "truncate_prompt_tokens"},
      {ApiEndpoint::kCompletion, R"({"prompt": "x", "add_special_tokens": 1})", "add_special_tokens"},
      {ApiEndpoint::kCompletion, R"({"prompt": "x", "add_generation_prompt": false})",
       "add_generation_prompt"},
      {ApiEndpoint::kChat, R"({"messages": [{"role": "user", "content": "x"}], "continue_final_message": 1})",
       "continue_final_message"},
      {ApiEndpoint::kChat,
       R"({"messages": [{"role": "user", "content": "x"}], "return_tokens_as_token_ids": "yes"})",
       "return_tokens_as_token_ids"},
  };
  for (const Case& c : cases) {
    ApiError e = parse_error(c.e, c.body);
    EXPECT_EQ(e.status, 400) << c.body;
    EXPECT_EQ(e.param, c.param) << c.body << " -> " << e.message;
    EXPECT_FALSE(e.message.empty());
  }
  EXPECT_EQ(parse_error(ApiEndpoint::kChat, "{oops").param, "");
  EXPECT_EQ(parse_error(ApiEndpoint::kChat, "[1]").status, 400);
}

TEST(OpenAiApiTest, ReadsKvTransferParamsAndRefusesWhatCannotGoWithThem) {
  auto to_prefill = parse_ok(ApiEndpoint::kCompletion,
                             R"({"prompt": "x", "kv_transfer_params": {"do_remote_decode": true}})");
  ASSERT_TRUE(to_prefill.kv_transfer.has_value());
  EXPECT_TRUE(to_prefill.kv_transfer->do_remote_decode);
  EXPECT_FALSE(to_prefill.kv_transfer->remote.has_value());
  auto to_decode =
      parse_ok(ApiEndpoint::kChat, R"({"messages": [{"role": "user", "content": "x"}], "stream": true,
      "kv_transfer_params": {"remote_host": "10.0.0.2", "remote_port": 41234, "transfer_id": "5f0c2a9e1b3d4c77",
                             "num_tokens": 812, "first_token": 4512, "num_blocks": 51, "bytes": 1, "lease_seconds": 30}})");
  ASSERT_TRUE(to_decode.kv_transfer.has_value());
  ASSERT_TRUE(to_decode.kv_transfer->remote.has_value());
  EXPECT_EQ(to_decode.kv_transfer->remote->host, "10.0.0.2");
  EXPECT_EQ(to_decode.kv_transfer->remote->port, 41234);
  EXPECT_EQ(to_decode.kv_transfer->remote->transfer_id, 0x5f0c2a9e1b3d4c77u);
  EXPECT_EQ(to_decode.kv_transfer->remote->num_tokens, 812);
  EXPECT_EQ(to_decode.kv_transfer->first_token, 4512);
  EXPECT_EQ(transfer_id_text(0x5f0c2a9e1b3d4c77u), "5f0c2a9e1b3d4c77");
  EXPECT_EQ(transfer_id_text(1), "0000000000000001");
  EXPECT_FALSE(parse_transfer_id("5F0C2A9E1B3D4C77").has_value());
  EXPECT_FALSE(parse_transfer_id("123").has_value());
  EXPECT_FALSE(
      parse_generate_request(ApiEndpoint::kCompletion, R"({"prompt": "x", "kv_transfer_params": {}})")
          .request->kv_transfer.has_value());
  const std::string handle =
      R"("kv_transfer_params": {"remote_host": "h", "remote_port": 1, "transfer_id": "0000000000000001", "num_tokens": 3, "first_token": 2})";
  struct Case {
    std::string body;
    const char* param;
  };
  const Case cases[] = {
      {R"({"prompt": "x", "kv_transfer_params": 1})", "kv_transfer_params"},
      {R"({"prompt": "x", "kv_transfer_params": {"do_remote_decode": 1}})",
       "kv_transfer_params.do_remote_decode"},
      {R"({"prompt": "x", "stream": true, "kv_transfer_params": {"do_remote_decode": true}})", "stream"},
      {R"({"prompt": "x", "kv_transfer_params": {"remote_host": "h", "remote_port": 0, "transfer_id": "0000000000000001", "num_tokens": 3, "first_token": 2}})",
       "kv_transfer_params.remote_port"},
      {R"({"prompt": "x", "kv_transfer_params": {"remote_host": "h", "remote_port": 1, "transfer_id": "xyz", "num_tokens": 3, "first_token": 2}})",
       "kv_transfer_params.transfer_id"},
      {R"({"prompt": "x", "kv_transfer_params": {"remote_host": "h", "remote_port": 1, "transfer_id": "0000000000000001", "first_token": 2}})",
       "kv_transfer_params.num_tokens"},
      {R"({"prompt": "x", "kv_transfer_params": {"remote_host": "", "remote_port": 1}})",
       "kv_transfer_params.remote_host"},
      {R"({"prompt": "x", "n": 2, )" + handle + "}", "n"},
      {R"({"prompt": "x", "logprobs": 2, )" + handle + "}", "logprobs"},
      {R"({"prompt": "x", "guided_regex": "a+", )" + handle + "}", "guided_regex"},
      {R"({"prompt": "x", "kv_transfer_params": {"do_remote_decode": true, "remote_host": "h", "remote_port": 1, "transfer_id": "0000000000000001", "num_tokens": 3, "first_token": 2}})",
       "kv_transfer_params"},
  };
  for (const Case& c : cases)
    EXPECT_EQ(parse_error(ApiEndpoint::kCompletion, c.body).param, c.param) << c.body;
  parse_ok(ApiEndpoint::kCompletion, R"({"prompt": "x", "n": 1, "logprobs": null, )" + handle + "}");
}

TEST(OpenAiApiTest, ReadsAStreamingLlmWindowAndNamesWhatIsWrongWithOne) {
  const GenerateRequest r =
      parse_ok(ApiEndpoint::kCompletion,
               R"({"prompt": "x", "streaming_llm": {"sink_tokens": 4, "window_tokens": 1024}})");
  EXPECT_EQ(r.generation.streaming.sink_tokens, 4);
  EXPECT_EQ(r.generation.streaming.window_tokens, 1024);
  const GenerateRequest no_sink =
      parse_ok(ApiEndpoint::kChat,
               R"({"messages": [{"role": "user", "content": "x"}], "streaming_llm": {"window_tokens": 64}})");
  EXPECT_EQ(no_sink.generation.streaming.sink_tokens, 0);
  EXPECT_TRUE(no_sink.generation.streaming.enabled());
  EXPECT_FALSE(parse_ok(ApiEndpoint::kCompletion, R"({"prompt": "x"})").generation.streaming.enabled());
  struct Case {
    std::string body;
    const char* param;
  };
  const Case cases[] = {
      {R"({"prompt": "x", "streaming_llm": 4})", "streaming_llm"},
      {R"({"prompt": "x", "streaming_llm": {"sink_tokens": 4}})", "streaming_llm.window_tokens"},
      {R"({"prompt": "x", "streaming_llm": {"window_tokens": 8}})", "streaming_llm.window_tokens"},
      {R"({"prompt": "x", "streaming_llm": {"window_tokens": 64.5}})", "streaming_llm.window_tokens"},
      {R"({"prompt": "x", "streaming_llm": {"window_tokens": 64, "sink_tokens": -1}})",
       "streaming_llm.sink_tokens"},
      {R"({"prompt": "x", "streaming_llm": {"window_tokens": 64, "sinks": 4}})", "streaming_llm.sinks"},
      {R"({"prompt": "x", "streaming_llm": {"window_tokens": 64}, "kv_transfer_params": {"do_remote_decode": true}})",
       "streaming_llm"},
  };
  for (const Case& c : cases)
    EXPECT_EQ(parse_error(ApiEndpoint::kCompletion, c.body).param, c.param) << c.body;
}

TEST(OpenAiApiTest, ErrorBodyHasOpenAisShape) {
  auto j = nlohmann::json::parse(
      error_body(ApiError{404, "no", "invalid_request_error", "model", "model_not_found"}));
  EXPECT_EQ(j["error"]["message"], "no");
  EXPECT_EQ(j["error"]["type"], "invalid_request_error");
  EXPECT_EQ(j["error"]["param"], "model");
  EXPECT_EQ(j["error"]["code"], "model_not_found");
  auto k = nlohmann::json::parse(error_body(ApiError{400, "x", "invalid_request_error", "", ""}));
  EXPECT_TRUE(k["error"]["param"].is_null() && k["error"]["code"].is_null());
}

TEST(OpenAiApiTest, EmbeddingBodies) {
  const auto texts = parse_embedding_request(
      R"({"input": ["a", "b"], "model": "m", "encoding_format": "base64", "dimensions": 64, "normalize": false,
          "truncate_prompt_tokens": 8, "add_special_tokens": false, "priority": -2, "user": "u",
          "request_id": "r-1"})");
  ASSERT_TRUE(texts.request.has_value()) << texts.error.message;
  const EmbeddingRequest& e = *texts.request;
  EXPECT_EQ(e.generation.prompts.size(), 2u);
  EXPECT_EQ(e.generation.prompts[1].text, "b");
  EXPECT_TRUE(e.base64);
  EXPECT_EQ(e.dimensions, 64);
  EXPECT_EQ(e.normalize, false);
  EXPECT_EQ(e.generation.truncate_prompt_tokens, 8);
  EXPECT_EQ(e.generation.add_special_tokens, false);
  EXPECT_EQ(e.generation.priority, -2);
  EXPECT_EQ(e.request_id, "r-1");
  const auto ids = parse_embedding_request(R"({"input": [[1, 2], [3]]})");
  ASSERT_TRUE(ids.request.has_value());
  EXPECT_EQ(ids.request->generation.prompts[0].ids, (std::vector<int32_t>{1, 2}));
  EXPECT_TRUE(ids.request->generation.prompts[1].is_ids);
  const auto chat = parse_embedding_request(R"({"messages": [{"role": "user", "content": "x"}]})");
  ASSERT_TRUE(chat.request.has_value());
  EXPECT_EQ(chat.request->generation.add_generation_prompt, false);  // the conversation as it is
  EXPECT_TRUE(chat.request->generation.prompts.empty());
  for (const auto& [body, param] : std::vector<std::pair<std::string, std::string>>{
           {R"({})", "input"},
           {R"({"input": 3})", "input"},
           {R"({"input": [[1], "a", {}]})", "input"},
           {R"({"input": "x", "encoding_format": "fp16"})", "encoding_format"},
           {R"({"input": "x", "dimensions": 0})", "dimensions"},
           {R"({"input": "x", "temperature": 0})", "temperature"},
           {R"({"input": "x", "chat_template": "t"})", "chat_template"},
           {R"({"input": "x", "request_id": "a b"})", "request_id"},
           {R"({"input": "x", "messages": []})", "input"}}) {
    const auto bad = parse_embedding_request(body);
    EXPECT_FALSE(bad.request.has_value()) << body;
    EXPECT_EQ(bad.error.param, param) << body;
    EXPECT_NE(bad.error.message.find("'" + param + "'"), std::string::npos) << bad.error.message;
  }
}

TEST(OpenAiApiTest, Base64AndTheEmbeddingAnswer) {
  // RFC 4648's test vectors: every padding case.
  const std::pair<const char*, const char*> vectors[] = {{"", ""},
                                                         {"f", "Zg=="},
                                                         {"fo", "Zm8="},
                                                         {"foo", "Zm9v"},
                                                         {"foob", "Zm9vYg=="},
                                                         {"fooba", "Zm9vYmE="},
                                                         {"foobar", "Zm9vYmFy"}};
  for (const auto& [in, out] : vectors) EXPECT_EQ(base64_encode(in), out) << in;
  const float v[] = {1.0f, -2.5f};  // little-endian 00 00 80 3f, 00 00 20 c0
  EXPECT_EQ(base64_encode(std::string_view(reinterpret_cast<const char*>(v), sizeof v)), "AACAPwAAIMA=");
  const auto body = nlohmann::json::parse(embedding_body("embd-1", "m", {{1.0f, -2.5f}, {0.5f}}, false, 7));
  EXPECT_EQ(body["object"], "list");
  EXPECT_EQ(body["data"][1]["index"], 1);
  EXPECT_EQ(body["data"][1]["object"], "embedding");
  EXPECT_EQ(body["data"][0]["embedding"], nlohmann::json({1.0, -2.5}));
  EXPECT_EQ(body["usage"]["prompt_tokens"], 7);
  EXPECT_EQ(body["usage"]["total_tokens"], 7);
  const auto b64 = nlohmann::json::parse(embedding_body("embd-1", "m", {{1.0f, -2.5f}}, true, 2));
  EXPECT_EQ(b64["data"][0]["embedding"], "AACAPwAAIMA=");
}

TEST(OpenAiApiTest, ScoreAndRerankBodies) {
  const auto one_to_many =
      parse_score_request(false, R"({"text_1": "q", "text_2": ["a", "b"], "priority": 1})");
  ASSERT_TRUE(one_to_many.request.has_value()) << one_to_many.error.message;
  EXPECT_EQ(one_to_many.request->num_queries, 1u);
  ASSERT_EQ(one_to_many.request->embedding.generation.prompts.size(), 3u);
  EXPECT_EQ(one_to_many.request->embedding.generation.prompts[2].text, "b");
  EXPECT_TRUE(
      parse_score_request(false, R"({"text_1": ["q", "r"], "text_2": ["a", "b"]})").request.has_value());
  const auto rerank = parse_score_request(
      true, R"({"query": "q", "documents": ["a", "b", "c"], "top_n": 2, "return_documents": false})");
  ASSERT_TRUE(rerank.request.has_value()) << rerank.error.message;
  EXPECT_EQ(rerank.request->documents, (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(rerank.request->top_n, 2);
  EXPECT_FALSE(rerank.request->return_documents);
  for (const auto& [rr, body, param] : std::vector<std::tuple<bool, std::string, std::string>>{
           {false, R"({"text_2": ["a"]})", "text_1"},
           {false, R"({"text_1": ["q", "r"], "text_2": ["a", "b", "c"]})", "text_1"},
           {false, R"({"text_1": "q", "text_2": []})", "text_2"},
           {false, R"({"text_1": "q", "text_2": [1]})", "text_2"},
           {false, R"({"text_1": "q", "text_2": "a", "query": "x"})", "query"},
           {true, R"({"query": ["q"], "documents": ["a"]})", "query"},
           {true, R"({"query": "q", "documents": "a"})", "documents"},
           {true, R"({"query": "q"})", "documents"},
           {true, R"({"query": "q", "documents": ["a"], "top_n": -1})", "top_n"},
           {true, R"({"query": "q", "documents": ["a"], "text_1": "x"})", "text_1"}}) {
    const auto bad = parse_score_request(rr, body);
    EXPECT_FALSE(bad.request.has_value()) << body;
    EXPECT_EQ(bad.error.param, param) << body;
  }
  // Scores are cosine similarities; the rerank answer is best first, cut to top_n.
  const std::vector<std::vector<float>> e = {{1, 0}, {1, 0}, {0, 1}, {0.6f, 0.8f}};
  ScoreRequest sr = *parse_score_request(false, R"({"text_1": "q", "text_2": ["a", "b", "c"]})").request;
  const auto scores = nlohmann::json::parse(score_body("score-1", "m", sr, cosine_scores(sr, e), 9));
  ASSERT_EQ(scores["data"].size(), 3u);
  EXPECT_DOUBLE_EQ(scores["data"][0]["score"].get<double>(), 1.0);
  EXPECT_DOUBLE_EQ(scores["data"][1]["score"].get<double>(), 0.0);
  EXPECT_NEAR(scores["data"][2]["score"].get<double>(), 0.6, 1e-6);
  EXPECT_EQ(scores["data"][2]["object"], "score");
  EXPECT_EQ(scores["usage"]["prompt_tokens"], 9);
  ScoreRequest rq =
      *parse_score_request(true, R"({"query": "q", "documents": ["a", "b", "c"], "top_n": 2})").request;
  const auto ranked = nlohmann::json::parse(score_body("rerank-1", "m", rq, cosine_scores(rq, e), 9));
  ASSERT_EQ(ranked["results"].size(), 2u);
  EXPECT_EQ(ranked["results"][0]["index"], 0);
  EXPECT_EQ(ranked["results"][1]["index"], 2);
  EXPECT_EQ(ranked["results"][1]["document"]["text"], "c");
  // Pair by pair: query k against document k.
  ScoreRequest pairs = *parse_score_request(false, R"({"text_1": ["q", "r"], "text_2": ["a", "b"]})").request;
  const auto paired = nlohmann::json::parse(
      score_body("score-2", "m", pairs, cosine_scores(pairs, {{1, 0}, {0, 1}, {0, 1}, {0, 1}}), 4));
  EXPECT_DOUBLE_EQ(paired["data"][0]["score"].get<double>(), 0.0);
  EXPECT_DOUBLE_EQ(paired["data"][1]["score"].get<double>(), 1.0);
}

TEST(OpenAiApiTest, MatryoshkaDimensions) {
  EXPECT_FALSE(check_dimensions(64, 64, std::nullopt).has_value());
  const auto plain = check_dimensions(32, 64, std::nullopt);
  ASSERT_TRUE(plain.has_value());
  EXPECT_NE(plain->find("must be 64"), std::string::npos) << *plain;
  EXPECT_FALSE(check_dimensions(32, 64, std::vector<int64_t>{}).has_value());  // any size
  EXPECT_TRUE(check_dimensions(65, 64, std::vector<int64_t>{}).has_value());
  EXPECT_FALSE(check_dimensions(16, 64, std::vector<int64_t>{16, 32}).has_value());
  const auto listed = check_dimensions(20, 64, std::vector<int64_t>{16, 32});
  ASSERT_TRUE(listed.has_value());
  EXPECT_NE(listed->find("(16, 32)"), std::string::npos) << *listed;
  std::vector<float> v = {0.6f, 0.0f, 0.8f, 0.0f};
  shorten_embedding(&v, 2, false);
  EXPECT_EQ(v, (std::vector<float>{0.6f, 0.0f}));
  std::vector<float> w = {3.0f, 4.0f, 12.0f};
  shorten_embedding(&w, 2, true);
  ASSERT_EQ(w.size(), 2u);
  EXPECT_FLOAT_EQ(w[0], 0.6f);
  EXPECT_FLOAT_EQ(w[1], 0.8f);
}

TEST(OpenAiApiTest, TokenizeAndDetokenizeBodies) {
  EXPECT_EQ(parse_tokenize_request(R"({"prompt": "hi"})").request->prompt, "hi");
  EXPECT_EQ(parse_tokenize_request(R"({"messages": [{"role": "user", "content": "x"}]})")
                .request->chat.messages.size(),
            1u);
  EXPECT_FALSE(parse_tokenize_request(R"({"prompt": 3})").request.has_value());
  const auto chat = parse_tokenize_request(
      R"({"messages": [{"role": "user", "content": "x"}], "add_generation_prompt": false,
          "continue_final_message": true, "add_special_tokens": true, "chat_template_kwargs": {"a": 1},
          "chat_template": "{{ messages[0].content }}", "documents": [{"text": "d"}], "reasoning_effort": "low",
          "tools": [{"type": "function", "function": {"name": "f"}}]})");
  ASSERT_TRUE(chat.request.has_value()) << chat.error.message;
  const GenerationRequest& g = chat.request->chat;
  EXPECT_EQ(g.add_generation_prompt, false);
  EXPECT_TRUE(g.continue_final_message);
  EXPECT_EQ(g.add_special_tokens, true);
  EXPECT_EQ(g.chat_template_kwargs["a"], 1);
  EXPECT_EQ(g.chat_template, "{{ messages[0].content }}");
  EXPECT_EQ(g.documents[0]["text"], "d");
  EXPECT_EQ(g.reasoning_effort, "low");
  EXPECT_EQ(g.tools[0]["function"]["name"], "f");
  EXPECT_EQ(parse_tokenize_request(R"({"prompt": "x", "documents": []})").error.param, "documents");
  // A field /tokenize would not honour is refused, naming it, never ignored.
  EXPECT_EQ(parse_tokenize_request(R"({"prompt": "x", "return_token_strs": true})").error.param,
            "return_token_strs");
  EXPECT_EQ(parse_tokenize_request(R"({"prompt": "x", "add_generation_prompt": true})").error.param,
            "add_generation_prompt");
  EXPECT_EQ(*parse_detokenize_request(R"({"tokens": [1, 2]})").tokens, (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(parse_detokenize_request(R"({"tokens": [1, "x"]})").error.param, "tokens");
}

// Feeding the text in every possible split gives the same parts as feeding it whole.
void expect_split(const std::string& text, bool opens, const std::string& reasoning,
                  const std::string& content) {
  for (size_t cut = 0; cut <= text.size(); ++cut) {
    for (size_t cut2 = cut; cut2 <= text.size(); cut2 += 3) {
      ReasoningSplitter s(opens);
      std::string r, c;
      for (auto piece : {text.substr(0, cut), text.substr(cut, cut2 - cut), text.substr(cut2)}) {
        auto p = s.feed(piece);
        r += p.reasoning;
        c += p.content;
      }
      auto p = s.finish();
      r += p.reasoning;
      c += p.content;
      ASSERT_EQ(r, reasoning) << text << " cut " << cut << "," << cut2;
      ASSERT_EQ(c, content) << text << " cut " << cut << "," << cut2;
    }
  }
}

TEST(ReasoningSplitterTest, SplitsThinkBlocksAcrossAnyChunking) {
  expect_split("<think>plan it</think>\n\nThe answer.", false, "plan it", "The answer.");
  expect_split("  <think>a<b</think>c", false, "a<b", "c");
  expect_split("No thinking here.", false, "", "No thinking here.");
  expect_split("<thin", false, "", "<thin");  // an unfinished tag at the end is content
  expect_split("already thinking</think>done", true, "already thinking", "done");
  expect_split("<think>never closed", false, "never closed", "");
  // deepseek_r1 (and a prompt that opened <think>): reasoning first, with or without the tag.
  expect_split("<think>\nplan</think>\n\nanswer", true, "\nplan", "answer");
  expect_split("plan, never closed", true, "plan, never closed", "");
  expect_split("<thin", true, "<thin", "");
}

TEST(OpenAiApiTest, ReadsEveryOutputConstraint) {
  using Kind = StructuredOutput::Kind;
  struct Case {
    const char* fields;
    Kind kind;
    const char* field;
  };
  const Case cases[] = {
      {R"("response_format": {"type": "json_object"})", Kind::kJsonObject, "response_format"},
      {R"("response_format": {"type": "json_schema", "json_schema": {"name": "n", "strict": true,
          "schema": {"type": "object"}}})",
       Kind::kJsonSchema, "response_format"},
      {R"("structured_outputs": {"regex": "[0-9]+"})", Kind::kRegex, "structured_outputs.regex"},
      {R"("structured_outputs": {"choice": ["a", "b"]})", Kind::kChoice, "structured_outputs.choice"},
      {R"("structured_outputs": {"grammar": "root ::= \"x\""})", Kind::kGrammar,
       "structured_outputs.grammar"},
      {R"("structured_outputs": {"json": "{\"type\": \"integer\"}"})", Kind::kJsonSchema,
       "structured_outputs.json"},
      {R"("guided_json": {"type": "string"}, "guided_decoding_backend": "xgrammar")", Kind::kJsonSchema,
       "guided_json"},
      {R"("guided_choice": ["yes", "no"])", Kind::kChoice, "guided_choice"},
  };
  for (const Case& c : cases) {
    auto r = parse_ok(ApiEndpoint::kCompletion, std::string(R"({"prompt": "x", )") + c.fields + "}");
    ASSERT_TRUE(r.generation.structured_output.has_value()) << c.fields;
    EXPECT_EQ(r.generation.structured_output->kind, c.kind) << c.fields;
    EXPECT_EQ(r.generation.structured_output->field, c.field);
  }
  auto text = parse_ok(ApiEndpoint::kChat, R"({"messages": [{"role": "user", "content": "x"}],
                                               "response_format": {"type": "text"}})");
  EXPECT_FALSE(text.generation.structured_output.has_value());
  auto choice = parse_ok(ApiEndpoint::kCompletion, R"({"prompt": "x", "guided_choice": ["yes", "no"]})");
  EXPECT_EQ(choice.generation.structured_output->choices, (std::vector<std::string>{"yes", "no"}));
}

// vLLM's JSON layout options, in structured_outputs or as guided_whitespace_pattern; refused
// without a JSON constraint and in contradiction.
TEST(OpenAiApiTest, ReadsTheJsonLayoutOptions) {
  using W = JsonGrammarOptions::Whitespace;
  auto r = parse_ok(ApiEndpoint::kCompletion, R"({"prompt": "x", "structured_outputs": {
      "whitespace_pattern": "[ ]?", "json": {"type": "object"}, "disable_additional_properties": false,
      "disable_fallback": true}})");
  const auto& json = r.generation.structured_output->json;
  EXPECT_EQ(json.whitespace, W::kPattern);
  EXPECT_EQ(json.whitespace_pattern, "[ ]?");
  EXPECT_TRUE(json.additional_properties_by_default);
  auto old =
      parse_ok(ApiEndpoint::kCompletion,
               R"({"prompt": "x", "guided_json": {"type": "object"}, "guided_whitespace_pattern": "\\s*"})");
  EXPECT_EQ(old.generation.structured_output->json.whitespace_pattern, "\\s*");
  auto compact = parse_ok(ApiEndpoint::kChat, R"({"messages": [{"role": "user", "content": "x"}],
      "response_format": {"type": "json_object"}, "structured_outputs": {"disable_any_whitespace": true}})");
  EXPECT_EQ(compact.generation.structured_output->json.whitespace, W::kNone);
  auto plain = parse_ok(
      ApiEndpoint::kCompletion,
      R"({"prompt": "x", "guided_json": {}, "structured_outputs": {"disable_any_whitespace": false}})");
  EXPECT_EQ(plain.generation.structured_output->json, JsonGrammarOptions{});
  const std::pair<const char*, const char*> bad[] = {
      {R"("guided_regex": "a+", "guided_whitespace_pattern": " *")", "guided_whitespace_pattern"},
      {R"("structured_outputs": {"whitespace_pattern": " *"})", "structured_outputs.whitespace_pattern"},
      {R"("structured_outputs": {"json": {}, "whitespace_pattern": ""})",
       "structured_outputs.whitespace_pattern"},
      {R"("structured_outputs": {"json": {}, "disable_any_whitespace": true, "whitespace_pattern": " "})",
       "structured_outputs.whitespace_pattern"},
      {R"("structured_outputs": {"json": {}, "disable_fallback": 1})", "structured_outputs.disable_fallback"},
      {R"("structured_outputs": {"json": {}, "structural_tag": {}})", "structured_outputs.structural_tag"},
  };
  for (auto [fields, param] : bad) {
    EXPECT_EQ(parse_error(ApiEndpoint::kCompletion, std::string(R"({"prompt": "x", )") + fields + "}").param,
              param)
        << fields;
  }
}

TEST(OpenAiApiTest, ReadsTools) {
  auto r = parse_ok(ApiEndpoint::kChat, R"({"messages": [{"role": "user", "content": "x"}],
    "tools": [{"type": "function", "function": {"name": "f"}}],
    "tool_choice": {"type": "function", "function": {"name": "f"}}, "parallel_tool_calls": false})");
  EXPECT_EQ(r.generation.tools.size(), 1u);
  ASSERT_TRUE(r.generation.tool_choice.has_value());
  EXPECT_EQ(r.generation.tool_choice->kind, ToolChoice::Kind::kNamed);
  EXPECT_EQ(r.generation.tool_choice->name, "f");
  EXPECT_FALSE(r.generation.parallel_tool_calls);
  for (auto [text, kind] :
       {std::pair{"auto", ToolChoice::Kind::kAuto}, std::pair{"none", ToolChoice::Kind::kNone},
        std::pair{"required", ToolChoice::Kind::kRequired}}) {
    auto c = parse_ok(ApiEndpoint::kChat, std::string(R"({"messages": [{"role": "user", "content": "x"}],
      "tool_choice": ")") + text + "\"}");
    EXPECT_EQ(c.generation.tool_choice->kind, kind);
  }
}

// A hermes call of get_weather(city: Paris) and the stop token after it, one token per output,
// through `choice` and `answer`: the JSON of every stream chunk.
std::vector<nlohmann::json> stream_weather_call(const Tokenizer& tok, OutputProcessor* choice,
                                                const OpenAiAnswer& answer) {
  auto ids = tok.encode(
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>", false);
  ids.push_back(*tok.vocab().eos_id);  // the stop token that ends it (kStop)
  std::string events;
  for (size_t i = 0; i < ids.size(); ++i) {
    StepOutput out;
    out.new_tokens = {ids[i]};
    out.finished = i + 1 == ids.size();
    if (out.finished) out.finish_reason = FinishReason::kStop;
    const ChoiceDelta d = choice->apply(out, OutputProcessor::Clock::now());
    events += answer.stream_events(0, d, *choice, i == 0);
  }
  std::vector<nlohmann::json> chunks;
  for (size_t at = 0; (at = events.find("data: ", at)) != std::string::npos;) {
    const size_t end = events.find("\n\n", at);
    chunks.push_back(nlohmann::json::parse(events.substr(at + 6, end - at - 6)));
    at = end;
  }
  return chunks;
}

// An answer with tool calls, in OpenAI's shapes: the body's message.tool_calls with
// finish_reason "tool_calls", and the stream's id-and-name delta, then argument fragments.
TEST(OpenAiApiTest, ToolCallsInTheBodyAndTheStream) {
  auto tok = test::tiny_qwen_style_tokenizer();
  OutputOptions o;
  o.tool_calls = ToolCallFormat::kHermes;
  o.max_tool_calls = 8;
  std::vector<OutputProcessor> choices{OutputProcessor(tok.get(), o)};
  const OpenAiAnswer answer(ApiEndpoint::kChat, "chatcmpl-1", 0, "m", tok.get(), false, false);
  std::string arguments, name, id, finish;
  for (const nlohmann::json& chunk : stream_weather_call(*tok, &choices[0], answer)) {
    const auto& choice = chunk["choices"][0];
    if (choice["finish_reason"].is_string()) finish = choice["finish_reason"];
    const auto& delta = choice["delta"];
    if (!delta.contains("tool_calls")) continue;
    const auto& call = delta["tool_calls"][0];
    EXPECT_EQ(call["index"], 0);
    if (call.contains("id")) {
      EXPECT_TRUE(id.empty()) << "one header per call";
      id = call["id"];
      name = call["function"]["name"];
      EXPECT_EQ(call["type"], "function");
    } else {
      EXPECT_FALSE(id.empty()) << "the header comes first";
    }
    arguments += call["function"]["arguments"].get<std::string>();
  }
  EXPECT_EQ(name, "get_weather");
  EXPECT_EQ(arguments, R"({"city": "Paris"})");
  EXPECT_EQ(finish, "tool_calls");
  const auto body = nlohmann::json::parse(answer.body(choices, Usage{1, 1}));
  const auto& message = body["choices"][0]["message"];
  EXPECT_TRUE(message["content"].is_null());
  EXPECT_EQ(message["tool_calls"][0]["id"], id);
  EXPECT_EQ(message["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(message["tool_calls"][0]["function"]["arguments"], arguments);
  EXPECT_EQ(body["choices"][0]["finish_reason"], "tool_calls");
}

TEST(OpenAiApiTest, ReadsTheChatTemplateFields) {
  auto r = parse_ok(ApiEndpoint::kChat, R"({"messages": [{"role": "user", "content": "x"}],
    "chat_template": "{{ 1 }}", "documents": [{"title": "t", "text": "d"}], "reasoning_effort": "high"})");
  EXPECT_EQ(r.generation.chat_template, "{{ 1 }}");
  EXPECT_EQ(r.generation.documents[0]["title"], "t");
  EXPECT_EQ(r.generation.reasoning_effort, "high");
  EXPECT_EQ(parse_error(ApiEndpoint::kChat,
                        R"({"messages": [{"role": "user", "content": "x"}], "chat_template": 1})")
                .param,
            "chat_template");
  EXPECT_EQ(
      parse_error(ApiEndpoint::kChat, R"({"messages": [{"role": "user", "content": "x"}], "documents": {}})")
          .param,
      "documents");
  // Completions have no chat: the fields are unknown there.
  EXPECT_EQ(parse_error(ApiEndpoint::kCompletion, R"({"prompt": "x", "reasoning_effort": "low"})").param,
            "reasoning_effort");
}

// OpenAI's older function calling: functions become tools, function_call the tool choice, one
// call at most; a conversation's function_call and "function" messages become tool calls and
// their "tool" answers.
TEST(OpenAiApiTest, ReadsLegacyFunctions) {
  auto r = parse_ok(ApiEndpoint::kChat, R"({"messages": [{"role": "user", "content": "x"},
      {"role": "assistant", "content": null, "function_call": {"name": "f", "arguments": "{\"a\": 1}"}},
      {"role": "function", "name": "f", "content": "42"}],
    "functions": [{"name": "f", "parameters": {"type": "object"}}], "function_call": {"name": "f"}})");
  EXPECT_TRUE(r.legacy_functions);
  ASSERT_EQ(r.generation.tools.size(), 1u);
  EXPECT_EQ(r.generation.tools[0]["type"], "function");
  EXPECT_EQ(r.generation.tools[0]["function"]["name"], "f");
  ASSERT_TRUE(r.generation.tool_choice.has_value());
  EXPECT_EQ(r.generation.tool_choice->kind, ToolChoice::Kind::kNamed);
  EXPECT_EQ(r.generation.tool_choice->name, "f");
  EXPECT_FALSE(r.generation.parallel_tool_calls);
  const auto& m = r.generation.messages;
  EXPECT_FALSE(m[1].contains("function_call"));
  ASSERT_EQ(m[1]["tool_calls"].size(), 1u);
  EXPECT_EQ(m[1]["tool_calls"][0]["function"]["name"], "f");
  EXPECT_EQ(m[1]["tool_calls"][0]["function"]["arguments"], "{\"a\": 1}");
  EXPECT_EQ(m[2]["role"], "tool");
  EXPECT_EQ(m[2]["tool_call_id"], m[1]["tool_calls"][0]["id"]);
  EXPECT_EQ(m[2]["name"], "f");
  for (auto [text, kind] :
       {std::pair{"auto", ToolChoice::Kind::kAuto}, std::pair{"none", ToolChoice::Kind::kNone}}) {
    auto c = parse_ok(ApiEndpoint::kChat, std::string(R"({"messages": [{"role": "user", "content": "x"}],
      "functions": [{"name": "f"}], "function_call": ")") +
                                              text + "\"}");
    EXPECT_EQ(c.generation.tool_choice->kind, kind);
  }
  EXPECT_FALSE(parse_ok(ApiEndpoint::kChat, R"({"messages": [{"role": "user", "content": "x"}],
      "tools": [{"type": "function", "function": {"name": "f"}}]})")
                   .legacy_functions);
  const std::pair<const char*, const char*> bad[] = {
      {R"("function_call": "auto")", "function_call"},
      {R"("functions": [{"name": "f"}], "function_call": "required")", "function_call"},
      {R"("functions": {"name": "f"})", "functions"},
      {R"("functions": [{"name": "f"}], "tools": [{"type": "function", "function": {"name": "f"}}])",
       "functions"},
      {R"("functions": [{"name": "f"}], "parallel_tool_calls": true)", "parallel_tool_calls"},
  };
  for (auto [fields, param] : bad) {
    EXPECT_EQ(parse_error(ApiEndpoint::kChat,
                          std::string(R"({"messages": [{"role": "user", "content": "x"}], )") + fields + "}")
                  .param,
              param)
        << fields;
  }
  EXPECT_EQ(parse_error(ApiEndpoint::kChat, R"({"messages": [{"role": "function", "content": "1"}]})").param,
            "messages[0].name");
  EXPECT_EQ(parse_error(ApiEndpoint::kChat,
                        R"({"messages": [{"role": "assistant", "function_call": {"name": "f"}}]})")
                .param,
            "messages[0].function_call");
}

// The answer to a request with functions: the call in message.function_call, finish_reason
// "function_call"; streamed as a function_call delta with the name, then argument fragments.
TEST(OpenAiApiTest, LegacyFunctionCallInTheBodyAndTheStream) {
  auto tok = test::tiny_qwen_style_tokenizer();
  OutputOptions o;
  o.tool_calls = ToolCallFormat::kHermes;
  o.max_tool_calls = 1;
  std::vector<OutputProcessor> choices{OutputProcessor(tok.get(), o)};
  OpenAiAnswer answer(ApiEndpoint::kChat, "chatcmpl-1", 0, "m", tok.get(), false, false);
  answer.set_legacy_functions(true);
  std::string arguments, name, finish;
  for (const nlohmann::json& chunk : stream_weather_call(*tok, &choices[0], answer)) {
    const auto& choice = chunk["choices"][0];
    if (choice["finish_reason"].is_string()) finish = choice["finish_reason"];
    const auto& delta = choice["delta"];
    EXPECT_FALSE(delta.contains("tool_calls"));
    if (!delta.contains("function_call")) continue;
    const auto& call = delta["function_call"];
    if (call.contains("name")) {
      EXPECT_TRUE(name.empty()) << "the name comes once";
      name = call["name"];
    } else {
      EXPECT_FALSE(name.empty()) << "the name comes first";
    }
    arguments += call["arguments"].get<std::string>();
  }
  EXPECT_EQ(name, "get_weather");
  EXPECT_EQ(arguments, R"({"city": "Paris"})");
  EXPECT_EQ(finish, "function_call");
  const auto body = nlohmann::json::parse(answer.body(choices, Usage{1, 1}));
  const auto& message = body["choices"][0]["message"];
  EXPECT_TRUE(message["content"].is_null());
  EXPECT_FALSE(message.contains("tool_calls"));
  EXPECT_EQ(message["function_call"]["name"], "get_weather");
  EXPECT_EQ(message["function_call"]["arguments"], arguments);
  EXPECT_EQ(body["choices"][0]["finish_reason"], "function_call");
}

// best_of: the field's rules, and the choice of the answered samples (the highest mean
// log-probability per token of each prompt's candidates).
TEST(OpenAiApiTest, BestOfKeepsTheLikeliestSamplesPerPrompt) {
  EXPECT_EQ(parse_ok(ApiEndpoint::kCompletion, R"({"prompt": "x", "n": 2, "best_of": 5})").generation.best_of,
            5);
  EXPECT_EQ(parse_error(ApiEndpoint::kCompletion, R"({"prompt": "x", "best_of": 3, "stream": true})").param,
            "best_of");
  EXPECT_EQ(parse_error(ApiEndpoint::kCompletion, R"({"prompt": "x", "best_of": "3"})").param, "best_of");
  EXPECT_EQ(parse_error(ApiEndpoint::kCompletion,
                        R"({"prompt": "x", "best_of": 2, "kv_transfer_params": {"do_remote_decode": true}})")
                .param,
            "best_of");
  auto tok = test::tiny_qwen_style_tokenizer();
  // Two prompts of three candidates; mean logprobs -1, -0.5, -2 and -3, (no tokens), -0.25.
  const std::vector<std::vector<float>> lps = {{-1, -1}, {-0.25f, -0.75f}, {-2}, {-3, -3, -3}, {}, {-0.25f}};
  std::vector<OutputProcessor> candidates;
  for (const auto& lp : lps) {
    candidates.emplace_back(tok.get(), OutputOptions{});
    StepOutput out;
    out.new_tokens.assign(lp.size(), 5);
    out.logprobs = lp;
    out.top_logprobs.resize(lp.size());
    out.finished = true;
    out.finish_reason = FinishReason::kLength;
    candidates.back().apply(out, OutputProcessor::Clock::now());
  }
  EXPECT_EQ(best_of_choices(candidates, 3, 1), (std::vector<size_t>{1, 5}));
  EXPECT_EQ(best_of_choices(candidates, 3, 2), (std::vector<size_t>{1, 0, 5, 3}));
  EXPECT_EQ(best_of_choices(candidates, 3, 3), (std::vector<size_t>{1, 0, 2, 5, 3, 4}));
  EXPECT_EQ(best_of_choices(candidates, 6, 2), (std::vector<size_t>{5, 1}));
}

TEST(OpenAiApiTest, ReadsBeamSearchFields) {
  auto r = parse_ok(ApiEndpoint::kCompletion,
                    R"({"prompt": "x", "n": 3, "use_beam_search": true, "length_penalty": 0.5})");
  EXPECT_TRUE(r.generation.use_beam_search);
  EXPECT_EQ(r.generation.length_penalty, 0.5f);
  EXPECT_EQ(
      parse_error(
          ApiEndpoint::kChat,
          R"({"messages": [{"role": "user", "content": "x"}], "use_beam_search": true, "stream": true})")
          .param,
      "use_beam_search");
  EXPECT_EQ(parse_error(ApiEndpoint::kCompletion, R"({"prompt": "x", "use_beam_search": 1})").param,
            "use_beam_search");
  EXPECT_EQ(parse_error(ApiEndpoint::kCompletion, R"({"prompt": "x", "length_penalty": "1"})").param,
            "length_penalty");
}

// OpenAI's predicted outputs: the content as text (parts joined); the usage's details of how
// many drafted prediction tokens were kept and rejected.
TEST(OpenAiApiTest, ReadsAPredictionAndReportsItsTokens) {
  EXPECT_EQ(parse_ok(ApiEndpoint::kChat, R"({"messages": [{"role": "user", "content": "x"}],
      "prediction": {"type": "content", "content": "abc"}})")
                .generation.prediction,
            "abc");
  EXPECT_EQ(parse_ok(ApiEndpoint::kCompletion, R"({"prompt": "x", "prediction": {"type": "content",
      "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}})")
                .generation.prediction,
            "ab");
  for (const char* bad :
       {R"("abc")", R"({"type": "text", "content": "a"})", R"({"type": "content"})",
        R"({"type": "content", "content": 3})", R"({"type": "content", "content": "a", "x": 1})",
        R"({"type": "content", "content": [{"type": "image_url"}]})"}) {
    EXPECT_EQ(
        parse_error(ApiEndpoint::kCompletion, std::string(R"({"prompt": "x", "prediction": )") + bad + "}")
            .param,
        "prediction")
        << bad;
  }
  const OpenAiAnswer answer(ApiEndpoint::kCompletion, "cmpl-1", 0, "m", nullptr, false, false);
  Usage u{3, 10};
  EXPECT_FALSE(nlohmann::json::parse(answer.body({}, u))["usage"].contains("completion_tokens_details"));
  u.prediction.emplace(7, 2);
  const auto usage = nlohmann::json::parse(answer.body({}, u))["usage"];
  EXPECT_EQ(usage["completion_tokens_details"]["accepted_prediction_tokens"], 7);
  EXPECT_EQ(usage["completion_tokens_details"]["rejected_prediction_tokens"], 2);
  const std::string event = answer.usage_event(u);
  EXPECT_NE(event.find("\"accepted_prediction_tokens\":7"), std::string::npos) << event;
}

// vLLM's request_id and cache_salt; modalities and mm_processor_kwargs only where they ask for
// text alone.
TEST(OpenAiApiTest, ReadsRequestIdCacheSaltAndTheTextOnlyFields) {
  auto r = parse_ok(ApiEndpoint::kChat, R"({"messages": [{"role": "user", "content": "x"}],
      "request_id": "job-7.a:b_c", "cache_salt": "s3cr3t", "modalities": ["text"], "mm_processor_kwargs": {}})");
  EXPECT_EQ(r.request_id, "job-7.a:b_c");
  EXPECT_EQ(r.generation.cache_salt, "s3cr3t");
  const std::pair<const char*, const char*> bad[] = {
      {R"("request_id": "")", "request_id"},
      {R"("request_id": "a b")", "request_id"},
      {R"("request_id": "x\r\nSet-Cookie: y")", "request_id"},
      {R"("cache_salt": "")", "cache_salt"},
      {R"("cache_salt": 5)", "cache_salt"},
      {R"("modalities": ["text", "audio"])", "modalities"},
      {R"("modalities": [])", "modalities"},
      {R"("mm_processor_kwargs": {"num_crops": 4})", "mm_processor_kwargs"},
      {R"("logits_processors": ["x"])", "logits_processors"},
  };
  for (auto [fields, param] : bad) {
    EXPECT_EQ(parse_error(ApiEndpoint::kChat,
                          std::string(R"({"messages": [{"role": "user", "content": "x"}], )") + fields + "}")
                  .param,
              param)
        << fields;
  }
  EXPECT_FALSE(is_request_id(std::string(129, 'a')));
  EXPECT_TRUE(is_request_id(std::string(128, 'a')));
}

TEST(OpenAiApiTest, RandomBodiesNeverCrashTheParser) {
  std::mt19937 rng(3);
  const std::string seed =
      R"({"messages": [{"role": "user", "content": "x"}], "n": 2, "stop": ["a"], "prompt": [1, [2]]})";
  for (int i = 0; i < 20000; ++i) {
    std::string s = seed;
    for (int k = 0; k < 1 + static_cast<int>(rng() % 4); ++k)
      s[rng() % s.size()] = static_cast<char>(rng() % 128);
    parse_generate_request(i % 2 ? ApiEndpoint::kChat : ApiEndpoint::kCompletion, s);
    parse_tokenize_request(s);
    parse_detokenize_request(s);
  }
}

}  // namespace
}  // namespace inferd
