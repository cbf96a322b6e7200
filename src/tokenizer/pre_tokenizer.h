// PreTokenizer: splits text into the pieces BPE runs on, with the regexes of the model family
// (PCRE2 with UTF + Unicode properties + JIT, so \p{L}, \p{N}, \s are right for all of Unicode).
// The tokenizer calls it on each run of text between special tokens.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace inferd {

// The GPT-2 pattern that byte-level BPE uses when nothing else is given.
extern const char* const kGpt2Pattern;
extern const char* const kLlama3Pattern;
extern const char* const kQwen2Pattern;

class PreTokenizer final {
 public:
  // Each pattern splits every piece the previous one produced: matches become pieces, and so
  // does the text between matches. An invalid pattern is an error naming it.
  static Expected<PreTokenizer> create(const std::vector<std::string>& patterns);
  // The patterns of a GGUF `tokenizer.ggml.pre` name ("smollm", "qwen2", "llama-bpe", ...).
  static Expected<std::vector<std::string>> patterns_for_gguf_pre(const std::string& pre);

  PreTokenizer(PreTokenizer&&) noexcept;
  PreTokenizer& operator=(PreTokenizer&&) noexcept;
  ~PreTokenizer();

  // Appends the pieces of `text` (well-formed UTF-8) to `pieces`, views into `text`.
  // Thread-safe after creation only with one caller at a time (it owns match scratch).
  void split(std::string_view text, std::vector<std::string_view>* pieces) const;

 private:
  struct Impl;
  explicit PreTokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace inferd
