// Model quantization (`inferd quantize`): rewrites a GGUF model (to a GGUF file) or a Hugging Face
// directory (to a directory of safetensors, or to GGUF) with its matrices in another stored
// format; metadata (architecture, tokenizer, chat template) copied or converted.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "common/status.h"
#include "tensor/dtype.h"

namespace inferd {

struct QuantizeReport {
  int64_t tensors = 0;
  int64_t converted = 0;         // matrices written in the target type
  int64_t kept = 0;              // 1-D tensors (norms, biases) written as F32
  int64_t fallback = 0;          // matrices whose rows do not fit the target's block: written as F16
  int64_t kept_q8 = 0;           // embedding / output matrices kept at Q8_0 (4-bit targets, not pure)
  int64_t kept_f32_routers = 0;  // MoE routers and shared-expert gates kept at F32
  int64_t smaller_groups = 0;    // int4 matrices in groups of 64: rows not a multiple of 128
  int64_t gptq = 0;              // matrices rounded with GPTQ (calibrated int4)
  int64_t lora_merged = 0;       // matrices with a LoRA update merged in (options.lora)
  int64_t calibration_tokens = 0;
  uint64_t input_bytes = 0;
  uint64_t output_bytes = 0;
};

struct QuantizeOptions {
  // 4-bit targets: quantize the token embedding and output matrix too (else kept at Q8_0).
  bool pure = false;
  // int4 only: a text to calibrate on; matrices are then rounded with GPTQ (tools/gptq.h).
  std::string calibration_file;
  int64_t calibration_context = 512;  // tokens per calibration chunk
  int64_t calibration_chunks = 0;     // 0 = every whole chunk of the text
  // A LoRA adapter (PEFT directory or GGUF adapter) merged into the weights before they are
  // converted: W + scale * B A in f32, then rounded to the target (not with a calibration).
  std::string lora;
};

// progress(done, total, tensor name) after each tensor.
using QuantizeProgress = std::function<void(int64_t, int64_t, const std::string&)>;

// Every 2-D tensor of `input` is expanded to f32 and written as `target`:
// - GGUF in, GGUF out: F32, F16, BF16, Q8_0, Q4_0, Q4_1 (llama.cpp's rounding), I8 (int8, per-row
//   scale), F8_E4M3 (fp8, per-row scale), Q4_G128 (int4); the per-row scales as F32 tensors
//   "<name>_scale"; 1-D tensors become F32; general.file_type is set (removed for inferd's types).
// - A Hugging Face directory in, a directory out (`output`): model.safetensors plus config.json
//   (with a quantization_config) and every other file copied; targets I8, F8_E4M3, Q4_G128, F32,
//   F16, BF16; 1-D tensors keep their dtype.
// - A Hugging Face directory in, `output` ending in ".gguf": a GGUF file as llama.cpp's converter
//   writes it (architecture keys, the tokenizer when tokenizer.json is there, GGUF tensor names,
//   Llama's Q / K rows permuted), any target.
// Unless `pure`, a 4-bit target keeps the token embedding and the output matrix at Q8_0 (as
// llama-quantize keeps them at higher precision): with tied embeddings that tensor is the LM head.
// Q4_G128 takes groups of 64 (Q4_G64) for rows not a multiple of 128; rows that fit no block of
// the target are written as F16.
// With a calibration file (int4 only) the model first runs over the text on the f32 path and
// every layer's linear matrices are rounded with GPTQ; the report counts them.
Expected<QuantizeReport> quantize_model(const std::string& input, const std::string& output, DType target,
                                        const QuantizeProgress& progress = {},
                                        const QuantizeOptions& options = {});

}  // namespace inferd
