// libFuzzer target: the tokenizer on a request's text. Any bytes are encoded (with and without
// special tokens), decoded back (plain text must round-trip when it is valid UTF-8 and no special
// token was parsed), and token ids read from the input are decoded and streamed through the
// incremental detokenizer with stop strings. Tokenizers: the two tiny fixtures (Qwen-style and
// Llama-3-style pre-tokenizers).
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tokenizer/incremental_detokenizer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"
#include "tokenizer/vocab.h"

namespace {

const std::vector<std::unique_ptr<inferd::Tokenizer>>& tokenizers() {
  static const auto all = [] {
    std::vector<std::unique_ptr<inferd::Tokenizer>> out;
    for (const char* name : {"tiny_qwen_style", "tiny_llama3_style"}) {
      auto vocab = inferd::vocab_from_hf_dir(std::string(INFERD_FIXTURES_DIR) + "/tokenizer/" + name);
      if (!vocab) __builtin_trap();
      auto t = inferd::Tokenizer::create(std::move(*vocab));
      if (!t) __builtin_trap();
      out.push_back(std::move(*t));
    }
    return out;
  }();
  return all;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const inferd::Tokenizer& tok = *tokenizers()[data[0] % 2];
  const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  const std::vector<int32_t> plain = tok.encode(text, false);
  for (int32_t id : plain) {
    if (id < 0 || id >= tok.vocab_size()) __builtin_trap();
  }
  const bool normalizes = data[0] % 2 == 0;  // tiny_qwen_style applies NFC
  if (!normalizes && inferd::is_valid_utf8(text) && tok.decode(plain) != text) __builtin_trap();
  (void)tok.encode(text, true);
  (void)tok.encode_prompt(text, true);
  // Ids from the input's bytes (in range: the engine only produces those) through the streaming
  // detokenizer.
  inferd::IncrementalDetokenizer detok(tok, {"\n\n", text.substr(0, 3)}, data[0] % 4 < 2);
  std::vector<int32_t> ids;
  for (size_t i = 1; i + 1 < size; i += 2) {
    ids.push_back(static_cast<int32_t>((data[i] | (data[i + 1] << 8)) % tok.vocab_size()));
  }
  std::string streamed;
  bool stopped = false;
  for (int32_t id : ids) {
    auto out = detok.push(id);
    streamed += out.text;
    stopped = stopped || out.stopped;
  }
  streamed += detok.finish().text;
  if (!inferd::is_valid_utf8(streamed)) __builtin_trap();  // streaming sends only whole characters
  (void)tok.decode(ids, true);
  (void)stopped;
  return 0;
}
