// RoPE frequency scaling (linear, dynamic NTK, YaRN, Llama 3) computed as Hugging Face
// transformers' modeling_rope_utils.py does, in f32 in the same order. ModelConfig carries a
// RopeScaling; the Transformer turns it into RopeFrequencies once and rotates q / k with them.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

namespace inferd {

enum class RopeScalingType { kNone, kLinear, kDynamic, kYarn, kLlama3 };

// "none", "linear", "dynamic", "yarn", "llama3" (transformers' rope_type names; "none" is its "default").
std::string_view rope_scaling_name(RopeScalingType type);

// The parameters of one scaling type; fields another type does not read keep their defaults.
struct RopeScaling {
  RopeScalingType type = RopeScalingType::kNone;
  double factor = 1.0;  // linear, dynamic, yarn, llama3
  // yarn, llama3: original_max_position_embeddings; dynamic: max_position_embeddings (the
  // context past which transformers grows the base).
  int64_t original_context = 0;
  double low_freq_factor = 1.0;   // llama3
  double high_freq_factor = 4.0;  // llama3
  double beta_fast = 32.0;        // yarn
  double beta_slow = 1.0;         // yarn
  bool truncate = true;           // yarn: the correction range rounded out to whole dimensions
  double attention_factor = 1.0;  // yarn: multiplies cos and sin (transformers' attention_scaling)
  // GGUF rope_freqs.weight (llama.cpp's form of llama3 scaling): inv_freq[i] /= freq_factors[i].
  // Empty, or head_dim / 2 values; only with kNone.
  std::vector<float> freq_factors;

  bool operator==(const RopeScaling&) const = default;
};

// YaRN's attention factor when the config gives none: transformers' get_mscale(factor, mscale)
// / get_mscale(factor, mscale_all_dim) when both are non-zero, else get_mscale(factor).
double yarn_attention_factor(double factor, double mscale, double mscale_all_dim);

// Inverse frequencies [head_dim / 2] of `scaling` for a sequence of `seq_len` tokens; seq_len
// matters only to kDynamic (transformers' seq_len: at most original_context gives the unscaled
// frequencies).
std::vector<float> rope_scaled_inverse_frequencies(int64_t head_dim, double theta, const RopeScaling& scaling,
                                                   int64_t seq_len = 0);

// The rope_freqs.weight llama.cpp's converter writes for llama3 scaling: per-dimension divisors
// (1, factor, or 1 / ((1 - smooth) / factor + smooth)), in f32 as its torch code rounds them.
std::vector<float> llama3_rope_freq_factors(int64_t head_dim, double theta, const RopeScaling& llama3);

// One model's rotary frequencies by position. Every type but dynamic NTK uses one table for all
// positions. Dynamic NTK rotates the token at position p with the frequencies of a sequence of
// p + 1 tokens (unscaled inside the original context): what transformers' generate() gives each
// token it decodes, and independent of batching and of the keys already cached. docs/model.md.
// Immutable; any thread.
class RopeFrequencies final {
 public:
  RopeFrequencies(int64_t head_dim, double theta, RopeScaling scaling);

  int64_t size() const { return static_cast<int64_t>(shared_.size()); }  // head_dim / 2
  // Whether position `pos` has frequencies of its own (dynamic NTK past the original context).
  bool position_dependent(int64_t pos) const {
    return scaling_.type == RopeScalingType::kDynamic && pos + 1 > scaling_.original_context;
  }
  // The frequencies of every position that is not position_dependent.
  const float* shared() const { return shared_.data(); }
  // Writes the frequencies of position `pos` to out[size()].
  void compute(int64_t pos, float* out) const;
  // Multiplies cos and sin (YaRN's mscale; 1 for the other types).
  float attention_factor() const { return static_cast<float>(scaling_.attention_factor); }

 private:
  int64_t head_dim_;
  double theta_;
  RopeScaling scaling_;
  std::vector<float> shared_;
};

}  // namespace inferd
