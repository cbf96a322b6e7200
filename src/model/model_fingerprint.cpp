#include "model/model_fingerprint.h"

#include <string>
#include <vector>

#include <xxhash.h>

namespace inferd {

namespace {

constexpr size_t kWindow = 64 * 1024;

class Hasher final {
 public:
  void bytes(const void* p, size_t n) {
    const auto* b = static_cast<const char*>(p);
    buf_.insert(buf_.end(), b, b + n);
  }
  template <typename T>
  void value(const T& v) {
    bytes(&v, sizeof v);
  }
  void text(const std::string& s) {
    value(s.size());
    bytes(s.data(), s.size());
  }
  void tensor(const TensorView& t) {
    text(t.name);
    value(static_cast<int>(t.dtype));
    value(t.num_dims);
    value(t.shape);
    value(t.num_bytes);
    if (t.data == nullptr) return;
    if (t.num_bytes <= 2 * kWindow) {
      value(XXH3_64bits(t.data, t.num_bytes));
    } else {
      value(XXH3_64bits(t.data, kWindow));
      value(XXH3_64bits(t.data + t.num_bytes - kWindow, kWindow));
    }
  }
  void floats(const std::vector<float>& v) {
    value(v.size());
    if (!v.empty()) value(XXH3_64bits(v.data(), v.size() * sizeof(float)));
  }
  ModelFingerprint digest() const {
    const XXH128_hash_t h = XXH3_128bits(buf_.data(), buf_.size());
    return ModelFingerprint{h.low64, h.high64};
  }

 private:
  std::vector<char> buf_;
};

}  // namespace

ModelFingerprint model_fingerprint(const ModelWeights& w) {
  Hasher h;
  const ModelConfig& c = w.config;
  h.text(c.arch_name);
  for (int64_t v : {c.vocab_size, c.hidden_size, c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim,
                    c.intermediate_size, c.max_position_embeddings})
    h.value(v);
  h.value(c.rms_norm_eps);
  h.value(c.rope_theta);
  h.value(static_cast<int>(c.rope_pairing));
  // Rope scaling changes every cached key; hashed only when present, so unscaled models keep
  // the fingerprints (and offloaded KV blocks) they had.
  const RopeScaling& r = c.rope_scaling;
  if (r.type != RopeScalingType::kNone || !r.freq_factors.empty()) {
    h.value(static_cast<int>(r.type));
    h.value(r.original_context);
    for (double v :
         {r.factor, r.low_freq_factor, r.high_freq_factor, r.beta_fast, r.beta_slow, r.attention_factor})
      h.value(v);
    h.value(r.truncate);
    h.floats(r.freq_factors);
  }
  h.value(c.tie_word_embeddings);
  h.value(c.attention_bias);
  h.value(c.qk_norm);
  for (int64_t v : {c.num_experts, c.num_experts_per_tok, c.moe_intermediate_size,
                    c.shared_expert_intermediate_size, c.decoder_sparse_step})
    h.value(v);
  h.value(c.norm_topk_prob);
  for (int64_t v : c.mlp_only_layers) h.value(v);
  h.tensor(w.token_embedding);
  for (const LayerWeights& l : w.layers) {
    for (const TensorView* t : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down}) h.tensor(*t);
    const MoeWeights& m = l.moe;
    for (const TensorView* t :
         {&m.router, &m.shared_gate, &m.shared_up, &m.shared_down, &m.shared_expert_gate})
      h.tensor(*t);
    for (const auto* experts : {&m.expert_gate, &m.expert_up, &m.expert_down}) {
      for (const TensorView& t : *experts) h.tensor(t);
    }
    for (const std::vector<float>* v : {&l.attn_norm, &l.bq, &l.bk, &l.bv, &l.q_norm, &l.k_norm, &l.ffn_norm})
      h.floats(*v);
  }
  h.floats(w.final_norm);
  h.tensor(w.lm_head);
  return h.digest();
}

}  // namespace inferd
