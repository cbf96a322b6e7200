// Loading a model from a .gguf file or a Hugging Face directory (config.json + safetensors,
// single file or sharded). The first step of every command that runs a model.
#pragma once

#include <memory>
#include <string>

#include "common/status.h"
#include "model/model_weights.h"

namespace inferd {

// Loads `path` (a .gguf file or a directory with config.json). Every error names the file and
// what is wrong: bad format, unsupported architecture or feature, missing tensor, wrong shape.
Expected<std::unique_ptr<ModelWeights>> load_model(const std::string& path);

// Parses a Hugging Face config.json text into a validated ModelConfig; `name` is for messages.
Expected<ModelConfig> parse_hf_config(const std::string& name, const std::string& json_text);

// Reads a ModelConfig from GGUF metadata (the embedding shape gives the vocabulary size).
Expected<ModelConfig> parse_gguf_config(const GgufFile& file);

}  // namespace inferd
