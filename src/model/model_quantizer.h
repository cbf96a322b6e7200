// Model quantization (`inferd quantize`): rewrites a GGUF model with its matrices in another
// stored format, metadata (architecture, tokenizer, chat template) copied unchanged.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "common/status.h"
#include "tensor/dtype.h"

namespace inferd {

struct QuantizeReport {
  int64_t tensors = 0;
  int64_t converted = 0;  // matrices written in the target type
  int64_t kept = 0;       // 1-D tensors (norms, biases) written as F32
  int64_t fallback = 0;   // matrices whose rows do not fit the target's block: written as F16
  int64_t kept_q8 = 0;    // embedding / output matrices kept at Q8_0 (4-bit targets, not pure)
  uint64_t input_bytes = 0;
  uint64_t output_bytes = 0;
};

// progress(done, total, tensor name) after each tensor.
using QuantizeProgress = std::function<void(int64_t, int64_t, const std::string&)>;

// Every 2-D tensor of `input` (a GGUF file, any dtype inferd reads) is expanded to f32 and written
// as `target` (F32, F16, BF16, Q8_0, Q4_0, Q4_1) with llama.cpp's reference rounding; 1-D tensors
// become F32. general.file_type is set to match. A Hugging Face directory is not accepted yet.
// Unless `pure`, a 4-bit target keeps the token embedding and the output matrix at Q8_0 (as
// llama-quantize keeps them at higher precision): with tied embeddings that tensor is the LM head.
Expected<QuantizeReport> quantize_model(const std::string& input, const std::string& output, DType target,
                                        const QuantizeProgress& progress = {}, bool pure = false);

}  // namespace inferd
