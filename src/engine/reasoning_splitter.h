// ReasoningSplitter: the reasoning split of the output side (OutputProcessor): a reasoning
// model's <think>...</think> text goes to reasoning_content, the rest to content, as text streams in.
#pragma once

#include <string>
#include <string_view>

namespace inferd {

// Splits generated text into reasoning (inside <think>...</think>) and content, incrementally:
// feed() returns what may be sent now of each part; text that could still be the start of a tag
// is held back until finish().
class ReasoningSplitter final {
 public:
  // starts_in_reasoning: the prompt itself opened <think> (templates that add it).
  explicit ReasoningSplitter(bool starts_in_reasoning = false);
  struct Parts {
    std::string reasoning, content;
  };
  Parts feed(std::string_view text);
  Parts finish();

 private:
  Parts drain(bool final);
  enum class State { kStart, kReasoning, kContent } state_;
  bool strip_newlines_ = false;
  std::string pending_;
};

}  // namespace inferd
