// Loads the tokenizer that belongs to a loaded model: from the GGUF metadata, or from the
// Hugging Face directory's tokenizer.json + tokenizer_config.json. Used by the CLI and server.
#pragma once

#include <memory>

#include "common/status.h"
#include "model/model_weights.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace inferd {

// Error (naming the source) when the model carries no tokenizer inferd can use.
Expected<std::unique_ptr<Tokenizer>> load_tokenizer(const ModelWeights& model);

// The model's chat template compiled once, at load time (null when the model has none); a
// template inferd cannot parse is an error here, not at request time.
Expected<std::unique_ptr<ChatTemplate>> load_chat_template(const ModelWeights& model,
                                                           const Tokenizer& tokenizer);

}  // namespace inferd
