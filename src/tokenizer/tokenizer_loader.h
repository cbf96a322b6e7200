// Loads the tokenizer that belongs to a model: from its GGUF metadata, or from its Hugging Face
// directory's tokenizer.json + tokenizer_config.json. Used by the CLI, the server and the tools;
// takes the model's file, not the model, so the tokenizer does not depend on model/.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "common/status.h"
#include "formats/gguf_file.h"
#include "jinja/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace inferd {

// `gguf`: the model's GGUF file (not owned), or null for a Hugging Face directory at
// `source_path`. Error (naming the source) when there is no tokenizer inferd can use, or when
// it has more tokens than the model's vocabulary of `model_vocab_size`.
Expected<std::unique_ptr<Tokenizer>> load_tokenizer(const GgufFile* gguf, const std::string& source_path,
                                                    int64_t model_vocab_size);

// The model's chat template compiled once, at load time (null when the model has none); a
// template inferd cannot parse is an error here (naming `source_path`), not at request time.
Expected<std::unique_ptr<ChatTemplate>> load_chat_template(const std::string& source_path,
                                                           const Tokenizer& tokenizer);

}  // namespace inferd
