// Vocab: everything a byte-level BPE tokenizer needs from a model: tokens, merges, added and
// special tokens, pre-tokenizer patterns, BOS/EOS, the chat template. Loaded from GGUF metadata
// (tokenizer.ggml.*) or from Hugging Face tokenizer.json + tokenizer_config.json.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "formats/gguf_file.h"

namespace inferd {

struct AddedToken {
  int32_t id = 0;
  std::string content;   // raw text, not byte-level encoded
  bool special = false;  // control token: matched in text only when the caller allows specials
};

struct Vocab {
  std::vector<std::string> tokens;                          // id -> token string (byte-level alphabet)
  std::vector<std::pair<std::string, std::string>> merges;  // in rank order
  std::vector<AddedToken> added_tokens;
  std::vector<std::string> pre_tokenizer_patterns;
  bool nfc = false;            // NFC-normalize text before splitting (Qwen2)
  bool ignore_merges = false;  // a piece that is itself a token is not merged (Llama-3)
  std::optional<int32_t> bos_id, eos_id, pad_id;
  bool add_bos = false;
  // A token appended to a prompt with special tokens (GGUF's add_eos_token: the EOS; Hugging Face:
  // add_eos_token, or the trailing special token of a TemplateProcessing post-processor, which is
  // how Qwen3-Embedding asks for its <|endoftext|>). None for generative models.
  std::optional<int32_t> append_id;
  std::vector<int32_t> stop_ids;  // tokens that end generation (EOS, <|im_end|>, <|eot_id|>, ...)
  std::string chat_template;      // may be empty
};

// From GGUF metadata; errors name the file and the key.
Expected<Vocab> vocab_from_gguf(const GgufFile& file);

// From a Hugging Face model directory (tokenizer.json, tokenizer_config.json).
Expected<Vocab> vocab_from_hf_dir(const std::string& dir);

}  // namespace inferd
