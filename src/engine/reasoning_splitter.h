// ReasoningSplitter: the reasoning split of the output side (OutputProcessor): a reasoning
// model's <think>...</think> text goes to reasoning_content, the rest to content, as text streams in.
#pragma once

#include <string>
#include <string_view>

namespace inferd {

// How a reasoning model marks its reasoning (vLLM's --reasoning-parser names).
//   qwen3:       reasoning only inside <think>...</think> (Qwen3; with enable_thinking false
//                the output has no tags and is all content); a prompt that ends in an open
//                <think> starts the output inside it.
//   deepseek_r1: the output starts inside the reasoning whether or not it writes <think> (its
//                templates, and QwQ's, open it in the prompt); text before </think> is
//                reasoning, and an output that never closes it is all reasoning.
enum class ReasoningParser { kQwen3, kDeepSeekR1 };

// Splits generated text into reasoning (inside <think>...</think>) and content, incrementally:
// feed() returns what may be sent now of each part; text that could still be the start of a tag
// is held back until finish().
class ReasoningSplitter final {
 public:
  // starts_in_reasoning: text that does not open with <think> is reasoning until </think> (the
  // prompt itself opened <think>, or the deepseek_r1 rule); a leading <think> is dropped either way.
  explicit ReasoningSplitter(bool starts_in_reasoning = false);
  ReasoningSplitter(ReasoningParser parser, bool prompt_opens_think)
      : ReasoningSplitter(parser == ReasoningParser::kDeepSeekR1 || prompt_opens_think) {}
  struct Parts {
    std::string reasoning, content;
  };
  Parts feed(std::string_view text);
  Parts finish();

 private:
  Parts drain(bool final);
  enum class State { kStart, kReasoning, kContent } state_ = State::kStart;
  bool starts_in_reasoning_;
  bool strip_newlines_ = false;
  std::string pending_;
};

}  // namespace inferd
