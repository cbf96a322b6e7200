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

}  // namespace
}  // namespace inferd
