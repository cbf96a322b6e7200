// A Hugging Face model directory read and written by the tools that rewrite models (`inferd
// quantize`, `inferd prune`): config.json and the tensors of every safetensors shard in; a new
// directory out with model.safetensors, config.json and every other file (tokenizer, generation
// config, chat template) copied.
#pragma once

#include <filesystem>
#include <nlohmann/json.hpp>
#include <vector>

#include "common/status.h"
#include "formats/safetensors_file.h"
#include "formats/safetensors_writer.h"

namespace inferd {

struct HfDirectory {
  nlohmann::json config;                   // config.json
  std::vector<SafetensorsFile> shards;     // every *.safetensors file
  std::vector<const TensorView*> tensors;  // of every shard, by name
};

// Reads `input` to be rewritten into `output`. Refused: an output that is a file or the input
// itself, a config.json that is not a JSON object, a directory without .safetensors files.
Expected<HfDirectory> read_hf_directory(const std::filesystem::path& input,
                                        const std::filesystem::path& output);

// Creates `output` with `config` as config.json, `tensors` as model.safetensors (a shard index of
// the input is not copied) and every other regular file of `input` copied.
Status write_hf_directory(const std::filesystem::path& input, const std::filesystem::path& output,
                          const nlohmann::json& config, const SafetensorsWriter& tensors);

}  // namespace inferd
