// Tokenizer: byte-level BPE (GPT-2 style) with added/special tokens, exact to Hugging Face
// `tokenizers` for the families we serve. The server and CLI encode prompts with it; the
// incremental detokenizer decodes generated ids with it.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/vocab.h"

namespace inferd {

class Tokenizer final {
 public:
  // Builds the merge table and special-token matcher; errors on an inconsistent vocab.
  static Expected<std::unique_ptr<Tokenizer>> create(Vocab vocab);

  // Token ids of `text` (no BOS). Special tokens written in the text become their ids only when
  // allow_special; otherwise they are encoded as the plain characters they are made of
  // (non-special added tokens, like Qwen's <think>, always match, as in `tokenizers`).
  // Ill-formed UTF-8 is first replaced by U+FFFD per maximal subpart. Thread-safe.
  std::vector<int32_t> encode(std::string_view text, bool allow_special) const;

  // encode() with specials allowed except where they would overlap one of `plain_ranges`
  // ([begin, end) byte offsets, sorted): a rendered chat prompt whose message contents must not
  // inject control tokens.
  std::vector<int32_t> encode(std::string_view text,
                              std::span<const std::pair<size_t, size_t>> plain_ranges) const;

  // encode() with the model's BOS in front and its appended token (Vocab::append_id) after, when
  // its tokenizer config asks for them.
  std::vector<int32_t> encode_prompt(std::string_view text, bool allow_special) const;

  // Bytes of the ids concatenated (may end inside a UTF-8 character); special tokens skipped
  // when skip_special.
  std::string decode(std::span<const int32_t> ids, bool skip_special = false) const;

  // The id of the vocabulary entry spelled `token` (in the vocabulary's own alphabet, e.g. "Ġyes"
  // for " yes" in byte-level BPE), as transformers' convert_tokens_to_ids; nullopt when none is.
  std::optional<int32_t> token_id(const std::string& token) const {
    auto it = token_to_id_.find(token);
    if (it == token_to_id_.end()) return std::nullopt;
    return it->second;
  }
  // The raw bytes token `id` stands for.
  const std::string& token_bytes(int32_t id) const { return token_bytes_[static_cast<size_t>(id)]; }
  bool is_special(int32_t id) const { return is_special_[static_cast<size_t>(id)] != 0; }
  int32_t vocab_size() const { return static_cast<int32_t>(vocab_.tokens.size()); }
  const Vocab& vocab() const { return vocab_; }

 private:
  Tokenizer(Vocab vocab, PreTokenizer pre);
  Status build();
  std::vector<int32_t> encode_impl(std::string_view text, bool allow_special,
                                   std::span<const std::pair<size_t, size_t>> plain_ranges) const;
  void encode_text(std::string_view text, std::vector<int32_t>* out) const;
  void encode_piece(std::string_view piece, std::vector<int32_t>* out) const;
  void bpe(std::string_view piece, std::vector<int32_t>* out) const;

  struct Merge {
    int32_t rank;
    int32_t merged_id;
  };

  Vocab vocab_;
  PreTokenizer pre_;
  std::unordered_map<std::string, int32_t> token_to_id_;
  std::unordered_map<uint64_t, Merge> merges_;  // (left id << 32 | right id) -> merge
  std::vector<std::string> token_bytes_;
  std::vector<uint8_t> is_special_;
  std::vector<int32_t> byte_ids_;  // id of each single byte's token, -1 if none
  // Added tokens by their first byte, longest first.
  std::vector<std::vector<const AddedToken*>> added_by_first_byte_;

  mutable std::mutex mutex_;  // guards the pre-tokenizer scratch and the piece cache
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;
};

}  // namespace inferd
