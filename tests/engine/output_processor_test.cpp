// The output side of the request front end: text, stop strings, the reasoning split, logprobs,
// finish reasons and token timings, from engine outputs fed in any chunking.
#include "engine/output_processor.h"

#include <gtest/gtest.h>

#include "test_support.h"

namespace inferd {
namespace {

using Clock = OutputProcessor::Clock;

std::unique_ptr<Tokenizer> tiny() {
  return test::tiny_qwen_style_tokenizer();
}

StepOutput output(std::vector<int32_t> tokens, bool finished = false,
                  std::optional<FinishReason> reason = std::nullopt) {
  StepOutput o;
  o.new_tokens = std::move(tokens);
  o.finished = finished;
  o.finish_reason = reason;
  return o;
}

// Feeds `ids` in chunks of `chunk` tokens, the last output finishing with kLength.
OutputProcessor feed(const Tokenizer* tok, const OutputOptions& options, const std::vector<int32_t>& ids,
                     size_t chunk, std::vector<ChoiceDelta>* deltas = nullptr) {
  OutputProcessor p(tok, options);
  const auto t0 = Clock::now();
  for (size_t i = 0; i < ids.size(); i += chunk) {
    const size_t end = std::min(ids.size(), i + chunk);
    StepOutput o =
        output({ids.begin() + static_cast<std::ptrdiff_t>(i), ids.begin() + static_cast<std::ptrdiff_t>(end)},
               end == ids.size(), FinishReason::kLength);
    const ChoiceDelta d = p.apply(o, t0 + std::chrono::milliseconds(10 * static_cast<int>(i)));
    if (deltas != nullptr) deltas->push_back(d);
    if (d.finished) break;
  }
  return p;
}

TEST(OutputProcessorTest, TextIsTheDecodedTokensInAnyChunking) {
  auto tok = tiny();
  const std::string text = "Hello wörld, twice: hello wörld!";
  const auto ids = tok->encode(text, false);
  for (size_t chunk : {1, 2, 3, 7, 100}) {
    OutputProcessor p = feed(tok.get(), {}, ids, chunk);
    EXPECT_EQ(p.text(), text) << chunk;
    EXPECT_EQ(p.token_ids(), ids);
    EXPECT_EQ(p.finish_reason(), FinishReason::kLength);
    EXPECT_TRUE(p.first_token_at() && p.last_token_at() && *p.first_token_at() <= *p.last_token_at());
  }
}

TEST(OutputProcessorTest, AStopStringEndsTheChoiceBeforeIt) {
  auto tok = tiny();
  const auto ids = tok->encode("one two STOP three four", false);
  for (size_t chunk : {1, 4, 100}) {
    std::vector<ChoiceDelta> deltas;
    OutputProcessor p = feed(tok.get(), OutputOptions{{"STOP"}}, ids, chunk, &deltas);
    EXPECT_EQ(p.text(), "one two ") << chunk;
    EXPECT_EQ(p.finish_reason(), FinishReason::kStop);
    ASSERT_FALSE(deltas.empty());
    EXPECT_TRUE(deltas.back().stop_string && deltas.back().finished);
    EXPECT_LT(p.token_ids().size(), ids.size());
    // Outputs after the stop add nothing.
    EXPECT_TRUE(p.apply(output(ids), Clock::now()).tokens.empty());
  }
}

TEST(OutputProcessorTest, ReasoningIsSplitFromTheContent) {
  auto tok = tiny();
  const auto ids = tok->encode("<think>first think</think>\n\nthe answer", false);
  for (size_t chunk : {1, 2, 5, 100}) {
    OutputProcessor split =
        feed(tok.get(), OutputOptions{{}, false, ReasoningParser::kQwen3, false}, ids, chunk);
    EXPECT_EQ(split.reasoning(), "first think") << chunk;
    EXPECT_EQ(split.text(), "the answer") << chunk;
    OutputProcessor whole = feed(tok.get(), {}, ids, chunk);
    EXPECT_EQ(whole.text(), "<think>first think</think>\n\nthe answer");
    EXPECT_TRUE(whole.reasoning().empty());
  }
  // A template that opened <think> itself: the output starts inside the reasoning.
  OutputProcessor opened = feed(tok.get(), OutputOptions{{}, false, ReasoningParser::kQwen3, true},
                                tok->encode("why</think>so", false), 3);
  EXPECT_EQ(opened.reasoning(), "why");
  EXPECT_EQ(opened.text(), "so");
}

TEST(OutputProcessorTest, DeepSeekR1RulesStartInsideTheReasoning) {
  auto tok = tiny();
  for (size_t chunk : {1, 3, 100}) {
    OutputOptions r1;
    r1.reasoning = ReasoningParser::kDeepSeekR1;
    OutputProcessor tagged = feed(tok.get(), r1, tok->encode("<think>hmm</think>\n\nok", false), chunk);
    EXPECT_EQ(tagged.reasoning(), "hmm") << chunk;
    EXPECT_EQ(tagged.text(), "ok");
    OutputProcessor untagged = feed(tok.get(), r1, tok->encode("hmm</think>ok", false), chunk);
    EXPECT_EQ(untagged.reasoning(), "hmm");
    EXPECT_EQ(untagged.text(), "ok");
    OutputProcessor unclosed = feed(tok.get(), r1, tok->encode("still thinking", false), chunk);
    EXPECT_EQ(unclosed.reasoning(), "still thinking");
    EXPECT_EQ(unclosed.text(), "");
    // qwen3's rules: no tags, no reasoning.
    OutputOptions q3;
    q3.reasoning = ReasoningParser::kQwen3;
    OutputProcessor plain = feed(tok.get(), q3, tok->encode("just text", false), chunk);
    EXPECT_EQ(plain.text(), "just text");
    EXPECT_EQ(plain.reasoning(), "");
  }
}

TEST(OutputProcessorTest, EchoAndIncludedStopStrings) {
  auto tok = tiny();
  const auto ids = tok->encode("one two STOP three", false);
  for (size_t chunk : {1, 4, 100}) {
    OutputOptions o;
    o.stop = {"STOP"};
    o.include_stop_str_in_output = true;
    o.echo = "prompt: ";
    std::vector<ChoiceDelta> deltas;
    OutputProcessor p = feed(tok.get(), o, ids, chunk, &deltas);
    EXPECT_EQ(p.text(), "prompt: one two STOP") << chunk;
    EXPECT_EQ(p.finish_reason(), FinishReason::kStop);
    ASSERT_FALSE(deltas.empty());
    EXPECT_EQ(deltas.front().content.rfind("prompt: ", 0), 0u);  // the echo comes first
  }
}

TEST(OutputProcessorTest, LogprobsErrorsAndIdsWithoutATokenizer) {
  OutputProcessor p(nullptr, {});
  StepOutput o = output({7, 8});
  o.logprobs = {-0.5f, -1.5f};
  o.top_logprobs = {{{7, -0.5f}, {3, -2.0f}}, {{8, -1.5f}}};
  ChoiceDelta d = p.apply(o, Clock::now());
  EXPECT_EQ(d.content, "7 8");
  ASSERT_EQ(d.logprobs.size(), 2u);
  EXPECT_EQ(d.logprobs[0].top.size(), 2u);
  EXPECT_FLOAT_EQ(d.logprobs[1].logprob, -1.5f);
  StepOutput fail = output({}, true, FinishReason::kError);
  fail.error = "out of KV blocks";
  d = p.apply(fail, Clock::now());
  EXPECT_TRUE(d.finished);
  EXPECT_EQ(p.finish_reason(), FinishReason::kError);
  EXPECT_EQ(p.error(), "out of KV blocks");
  EXPECT_EQ(p.text(), "7 8");
  EXPECT_EQ(p.logprobs().size(), 2u);
}

// vLLM's rules for the token that ends a choice and for special tokens: a stop token adds no
// text (unless include_stop_str_in_output), special tokens add theirs with skip_special_tokens off.
TEST(OutputProcessorTest, StopTokensAndSpecialTokensText) {
  auto tok = tiny();
  const int32_t im_start = tok->encode("<|im_start|>", true).at(0);
  const int32_t stop = tok->encode("x", false).at(0);  // a plain token used as a stop token id
  auto ids = tok->encode("ab", false);
  ids.push_back(im_start);
  ids.push_back(stop);
  for (const bool skip : {true, false}) {
    for (const bool include : {false, true}) {
      OutputOptions o;
      o.skip_special_tokens = skip;
      o.include_stop_str_in_output = include;
      OutputProcessor p(tok.get(), o);
      p.apply(output(ids, true, FinishReason::kStop), Clock::now());
      const std::string expected = std::string("ab") + (skip ? "" : "<|im_start|>") + (include ? "x" : "");
      EXPECT_EQ(p.text(), expected) << "skip " << skip << " include " << include;
      EXPECT_EQ(p.token_ids(), ids);
    }
  }
  // Ended by length, the last token is text like any other.
  OutputProcessor p(tok.get(), {});
  p.apply(output(ids, true, FinishReason::kLength), Clock::now());
  EXPECT_EQ(p.text(), "abx");
}

// min_tokens: a stop string in the text of the first min_tokens tokens does not end the choice.
TEST(OutputProcessorTest, StopStringsCountFromMinTokensOn) {
  auto tok = tiny();
  std::vector<int32_t> ids;
  for (const char* piece : {"a", "b", "c", "b", "c", "d"}) ids.push_back(tok->encode(piece, false).at(0));
  for (const int32_t min_tokens : {0, 2, 3, 5, 6}) {
    OutputOptions o;
    o.stop = {"bc"};
    o.min_tokens = min_tokens;
    OutputProcessor p = feed(tok.get(), o, ids, 1);
    // "bc" ends at token 3 and token 5; found where it ends at or after min_tokens tokens.
    const std::string expected = min_tokens <= 3 ? "a" : min_tokens <= 5 ? "abc" : "abcbcd";
    EXPECT_EQ(p.text(), expected) << min_tokens;
    EXPECT_EQ(p.finish_reason(), min_tokens <= 5 ? FinishReason::kStop : FinishReason::kLength) << min_tokens;
  }
}

}  // namespace
}  // namespace inferd
