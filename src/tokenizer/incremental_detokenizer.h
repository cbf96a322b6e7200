// IncrementalDetokenizer: turns generated token ids into text as they arrive, for streaming.
// Emits only complete UTF-8, never text that could still turn out to start a stop string, and
// nothing from the first stop string on. One per request; not thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace inferd {

class IncrementalDetokenizer final {
 public:
  struct Output {
    std::string text;          // new text safe to send now
    bool stopped = false;      // a stop string matched; text ends right before it
    std::string matched_stop;  // which one
  };

  // tokenizer: not owned. Special tokens are skipped unless keep_special. Stop strings are looked
  // for once min_tokens tokens were pushed (vLLM's min_tokens).
  IncrementalDetokenizer(const Tokenizer& tokenizer, std::vector<std::string> stop_strings,
                         bool keep_special = false, int64_t min_tokens = 0);

  // Adds one generated token. After a stop, further calls return nothing.
  Output push(int32_t id);
  // Flushes what was held back (the end of generation): an incomplete UTF-8 tail becomes U+FFFD.
  Output finish();

  // All text emitted so far.
  const std::string& emitted() const { return emitted_; }

 private:
  Output drain(bool final);

  const Tokenizer& tokenizer_;
  std::vector<std::string> stops_;
  bool keep_special_;
  int64_t min_tokens_;
  int64_t pushed_ = 0;
  std::string pending_;  // bytes decoded but not yet emitted
  std::string emitted_;
  bool stopped_ = false;
};

}  // namespace inferd
