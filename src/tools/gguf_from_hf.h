// The GGUF form of a Hugging Face model, as llama.cpp's convert_hf_to_gguf.py writes it, for
// `inferd quantize -i HF_DIR -o OUT.gguf`: the architecture's metadata keys, the tokenizer
// (tokenizer.json + tokenizer_config.json) as tokenizer.ggml.* keys, the tensor names, and the
// Llama Q / K row permutation (GGUF llama pairs RoPE dimensions interleaved, HF rotate-half).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "formats/gguf_writer.h"
#include "model/model_config.h"
#include "tokenizer/vocab.h"

namespace inferd {

// general.* and <arch>.* keys of `config`; `name` becomes general.name. Rope scaling as the
// converter writes it: linear and yarn as rope.scaling.* keys, llama3 as a tensor (below).
// Errors: scaling GGUF cannot carry (dynamic NTK, which the converter drops; untruncated yarn).
Status set_gguf_model_metadata(const ModelConfig& config, const std::string& name, GgufFileWriter& out);

// The rope_freqs.weight values of a llama3-scaled config ([head_dim / 2]); empty otherwise.
std::vector<float> gguf_rope_freqs(const ModelConfig& config);

// tokenizer.ggml.* and tokenizer.chat_template from a vocab read from a Hugging Face directory:
// tokens padded to `vocab_size` with unused "[PAD<id>]" entries, token types (control for
// special added tokens, user-defined for the others), merges, the GGUF pre-tokenizer name whose
// patterns equal the vocab's (an error when none does), BOS / EOS / padding ids, add_bos.
Status set_gguf_tokenizer_metadata(const Vocab& vocab, int64_t vocab_size, GgufFileWriter& out);

// The GGUF name of a Hugging Face tensor ("model.layers.3.mlp.up_proj.weight" ->
// "blk.3.ffn_up.weight"), or nullopt for a tensor the model does not use.
std::optional<std::string> gguf_tensor_name(const std::string& hf_name);

// How many heads the rows of `hf_name` hold when Llama's converter permutes them (q_proj:
// heads, k_proj: kv heads), else 0.
int64_t rope_permute_heads(const ModelConfig& config, const std::string& hf_name);

// Reorders the rows of w [rows, cols] (rows = heads * head_dim) from rotate-half pairs (i,
// i + head_dim / 2) to interleaved pairs (2i, 2i + 1) within each head.
void permute_rope_rows(float* w, int64_t rows, int64_t cols, int64_t heads);

}  // namespace inferd
