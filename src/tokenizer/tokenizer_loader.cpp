#include "tokenizer/tokenizer_loader.h"

namespace inferd {

Expected<std::unique_ptr<Tokenizer>> load_tokenizer(const ModelWeights& model) {
  Expected<Vocab> vocab = model.gguf ? vocab_from_gguf(*model.gguf) : vocab_from_hf_dir(model.source_path);
  if (!vocab) return vocab.status();
  if (static_cast<int64_t>(vocab->tokens.size()) > model.config.vocab_size) {
    return invalid_argument(
        model.source_path + ": the tokenizer has " + std::to_string(vocab->tokens.size()) +
        " tokens, more than the model's vocabulary of " + std::to_string(model.config.vocab_size));
  }
  return Tokenizer::create(std::move(*vocab));
}

Expected<std::unique_ptr<ChatTemplate>> load_chat_template(const ModelWeights& model,
                                                           const Tokenizer& tokenizer) {
  const std::string& source = tokenizer.vocab().chat_template;
  if (source.empty()) return std::unique_ptr<ChatTemplate>();
  auto compiled = ChatTemplate::compile(source);
  if (!compiled) return compiled.status().with_context(model.source_path + ": chat template");
  return std::make_unique<ChatTemplate>(std::move(*compiled));
}

}  // namespace inferd
