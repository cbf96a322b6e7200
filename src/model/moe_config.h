// The mixture-of-experts fields of a ModelConfig (Qwen2-MoE, Qwen3-MoE): read from a Hugging Face
// config.json or from GGUF metadata. Called by the config parsers (config_parsers.cpp) at load.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string>

#include "common/status.h"
#include "formats/gguf_file.h"
#include "model/model_config.h"

namespace inferd {

// Sets c's expert fields from config.json `j` (num_experts, num_experts_per_tok,
// moe_intermediate_size, shared_expert_intermediate_size, norm_topk_prob, decoder_sparse_step,
// mlp_only_layers), with transformers' defaults for the absent ones; `name` is for messages.
Status parse_hf_moe_config(const std::string& name, const nlohmann::json& j, ModelConfig* c);

// Sets c's expert fields from `{arch}.expert_*` metadata. A layer is MoE where the file has its
// router (blk.N.ffn_gate_inp.weight); the others are recorded as mlp_only_layers. Top-k weights
// are renormalized as llama.cpp does for the architecture (qwen3moe yes, qwen2moe no) unless
// `{arch}.expert_weights_norm` says otherwise. c->num_layers must be set.
Status parse_gguf_moe_config(const GgufFile& f, ModelConfig* c);

}  // namespace inferd
