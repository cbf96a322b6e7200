#include "tokenizer/tokenizer_loader.h"

namespace inferd {

Expected<std::unique_ptr<Tokenizer>> load_tokenizer(const GgufFile* gguf, const std::string& source_path,
                                                    int64_t model_vocab_size) {
  Expected<Vocab> vocab = gguf != nullptr ? vocab_from_gguf(*gguf) : vocab_from_hf_dir(source_path);
  if (!vocab) return vocab.status();
  if (static_cast<int64_t>(vocab->tokens.size()) > model_vocab_size) {
    return invalid_argument(source_path + ": the tokenizer has " + std::to_string(vocab->tokens.size()) +
                            " tokens, more than the model's vocabulary of " +
                            std::to_string(model_vocab_size));
  }
  return Tokenizer::create(std::move(*vocab));
}

Expected<std::unique_ptr<ChatTemplate>> load_chat_template(const std::string& source_path,
                                                           const Tokenizer& tokenizer) {
  const std::string& source = tokenizer.vocab().chat_template;
  if (source.empty()) return std::unique_ptr<ChatTemplate>();
  auto compiled = ChatTemplate::compile(source);
  if (!compiled) return compiled.status().with_context(source_path + ": chat template");
  return std::make_unique<ChatTemplate>(std::move(*compiled));
}

}  // namespace inferd
