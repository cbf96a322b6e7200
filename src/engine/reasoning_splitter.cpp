#include "engine/reasoning_splitter.h"

#include <algorithm>

#include "common/text.h"

namespace inferd {

namespace {
constexpr std::string_view kOpen = "<think>";
constexpr std::string_view kClose = "</think>";

}  // namespace

ReasoningSplitter::ReasoningSplitter(bool starts_in_reasoning) : starts_in_reasoning_(starts_in_reasoning) {}

ReasoningSplitter::Parts ReasoningSplitter::feed(std::string_view text) {
  pending_.append(text);
  return drain(false);
}

ReasoningSplitter::Parts ReasoningSplitter::finish() {
  return drain(true);
}

ReasoningSplitter::Parts ReasoningSplitter::drain(bool final) {
  Parts out;
  for (;;) {
    if (state_ == State::kStart) {
      // Leading whitespace, then either <think> or content.
      const size_t first = pending_.find_first_not_of(" \t\r\n");
      if (first == std::string::npos) {
        if (final) {
          (starts_in_reasoning_ ? out.reasoning : out.content) += pending_;
          pending_.clear();
        }
        return out;
      }
      std::string_view rest = std::string_view(pending_).substr(first);
      if (rest.substr(0, kOpen.size()) == kOpen) {
        pending_.erase(0, first + kOpen.size());
        state_ = State::kReasoning;
        continue;
      }
      if (!final && kOpen.substr(0, rest.size()) == rest) return out;  // may still become <think>
      state_ = starts_in_reasoning_ ? State::kReasoning : State::kContent;
      continue;
    }
    if (state_ == State::kReasoning) {
      const size_t close = pending_.find(kClose);
      if (close != std::string::npos) {
        out.reasoning += pending_.substr(0, close);
        pending_.erase(0, close + kClose.size());
        strip_newlines_ = true;  // the newline(s) a model writes after </think> belong to neither part
        state_ = State::kContent;
        continue;
      }
      const size_t hold = final ? 0 : partial_tag_suffix(pending_, kClose);
      out.reasoning += pending_.substr(0, pending_.size() - hold);
      pending_.erase(0, pending_.size() - hold);
      return out;
    }
    if (strip_newlines_) {
      const size_t body = pending_.find_first_not_of("\r\n");
      pending_.erase(0, body == std::string::npos ? pending_.size() : body);
      if (pending_.empty()) return out;
      strip_newlines_ = false;
    }
    out.content += pending_;
    pending_.clear();
    return out;
  }
}

}  // namespace inferd
