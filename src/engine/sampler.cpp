#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/cpu_isa.h"
#include "kernels/sampling_kernels.h"

namespace inferd {

std::optional<SamplingParams::FieldError> SamplingParams::check() const {
  auto bad = [](const char* field, const char* range) {
    return FieldError{field, std::string("'") + field + "' must be in " + range};
  };
  // The ranges OpenAI documents (temperature up to 2, penalties in [-2, 2]); top_k and min_p as vLLM.
  if (!(temperature >= 0.0f && temperature <= 2.0f)) return bad("temperature", "[0, 2]");
  if (top_k < 0) return bad("top_k", "[0, 2^30] (or -1 for all)");
  if (!(top_p > 0.0f && top_p <= 1.0f)) return bad("top_p", "(0, 1]");
  if (!(min_p >= 0.0f && min_p <= 1.0f)) return bad("min_p", "[0, 1]");
  if (!(repetition_penalty > 0.0f && repetition_penalty <= 2.0f)) return bad("repetition_penalty", "(0, 2]");
  if (!(presence_penalty >= -2.0f && presence_penalty <= 2.0f)) return bad("presence_penalty", "[-2, 2]");
  if (!(frequency_penalty >= -2.0f && frequency_penalty <= 2.0f)) return bad("frequency_penalty", "[-2, 2]");
  if (logprobs && (*logprobs < 0 || *logprobs > 20)) return bad("logprobs", "[0, 20]");
  if (prompt_logprobs && (*prompt_logprobs < 0 || *prompt_logprobs > 20))
    return bad("prompt_logprobs", "[0, 20]");
  if (min_tokens < 0) return bad("min_tokens", "[0, max_tokens]");
  for (int32_t id : allowed_token_ids) {
    if (id < 0)
      return FieldError{"allowed_token_ids", "'allowed_token_ids' must be token ids (non-negative)"};
  }
  for (const auto& w : bad_words) {
    if (w.empty()) return FieldError{"bad_words", "'bad_words' entries must not be empty"};
  }
  for (const auto& [id, bias] : logit_bias) {
    if (id < 0)
      return FieldError{"logit_bias", "'logit_bias' keys must be token ids (non-negative integers)"};
    if (!(bias >= -100.0f && bias <= 100.0f))
      return FieldError{"logit_bias",
                        "'logit_bias' values must be in [-100, 100] (token " + std::to_string(id) + ")"};
  }
  return std::nullopt;
}

Status SamplingParams::validate() const {
  if (auto e = check()) return invalid_argument(e->message);
  return Status::ok();
}

// The first of the largest (kernels/sampling_kernels.h).
int32_t argmax(std::span<const float> values) {
  return static_cast<int32_t>(argmax(values.data(), static_cast<int64_t>(values.size()), active_isa()));
}

Sampler::Sampler(const SamplingParams& params)
    : params_(params), rng_(params.seed ? *params.seed : std::random_device{}()) {
  if (params_.grammar) matcher_.emplace(params_.grammar->grammar, params_.grammar->vocab);
}

int32_t Sampler::sample(std::span<const float> logits) {
  return draw(logits);
}

SampleResult Sampler::sample(std::span<const float> logits, std::span<const int32_t> prompt,
                             std::span<const int32_t> output) {
  const bool penalize = params_.repetition_penalty != 1.0f || params_.presence_penalty != 0.0f ||
                        params_.frequency_penalty != 0.0f;
  const bool masked = has_masks();
  SampleResult r;
  masks_dead_end_ = false;
  if (!penalize && params_.logit_bias.empty() && !matcher_ && !masked) {
    r.token = draw(logits);
  } else {
    adjusted_.assign(logits.begin(), logits.end());
    if (penalize) apply_penalties(prompt, output);
    for (const auto& [id, bias] : params_.logit_bias) {
      if (static_cast<size_t>(id) < adjusted_.size()) adjusted_[static_cast<size_t>(id)] += bias;
    }
    if (masked) apply_masks(output);
    if (matcher_ && !apply_grammar_mask()) {
      r.dead_end = true;
      r.token = argmax(logits);
    } else {
      r.token = draw(adjusted_);
      // Only a row with every token masked draws a masked one (model logits are finite).
      if (adjusted_[static_cast<size_t>(r.token)] == -std::numeric_limits<float>::infinity()) {
        r.dead_end = true;
        masks_dead_end_ = true;
        r.token = argmax(logits);
      } else if (matcher_ && !matcher_->accept_token(r.token)) {
        r.dead_end = true;
      }
    }
  }
  if (params_.logprobs) fill_logprobs(logits, &r, *params_.logprobs);
  return r;
}

SampleResult Sampler::logprobs_of(std::span<const float> logits, int32_t token, int32_t k) {
  SampleResult r;
  r.token = token;
  fill_logprobs(logits, &r, k);
  const float x = logits[static_cast<size_t>(token)];
  r.rank = 1 + std::count_if(logits.begin(), logits.end(), [x](float v) { return v > x; });
  return r;
}

std::string Sampler::dead_end_error() const {
  if (masks_dead_end_)
    return matcher_
               ? "the output grammar, with allowed_token_ids, bad_words and min_tokens, allows no token here"
               : "allowed_token_ids, bad_words and min_tokens together rule out every token here";
  return matcher_ && matcher_->failed() ? matcher_->error() : std::string();
}

void Sampler::apply_masks(std::span<const int32_t> output) {
  constexpr float kBanned = -std::numeric_limits<float>::infinity();
  const size_t vocab = adjusted_.size();
  auto ban = [&](int32_t id) {
    if (id >= 0 && static_cast<size_t>(id) < vocab) adjusted_[static_cast<size_t>(id)] = kBanned;
  };
  if (!params_.allowed_token_ids.empty()) {
    if (allowed_.size() != vocab) {  // once: the flags of the allowed ids
      allowed_.assign(vocab, 0);
      for (int32_t id : params_.allowed_token_ids) {
        if (id >= 0 && static_cast<size_t>(id) < vocab) allowed_[static_cast<size_t>(id)] = 1;
      }
    }
    for (size_t i = 0; i < vocab; ++i) {
      if (allowed_[i] == 0) adjusted_[i] = kBanned;
    }
  }
  if (static_cast<int64_t>(output.size()) < params_.min_tokens) {
    for (int32_t id : params_.end_token_ids) ban(id);
  }
  for (const auto& word : params_.bad_words) {
    const size_t prefix = word.size() - 1;
    if (output.size() >= prefix &&
        std::equal(word.begin(), word.end() - 1, output.end() - static_cast<std::ptrdiff_t>(prefix)))
      ban(word.back());
  }
}

void Sampler::prepare_grammar_mask(size_t num_logits) {
  if (!matcher_) return;
  bitmask_.resize(GrammarMatcher::bitmask_words(num_logits));
  matcher_->fill_next_token_bitmask(bitmask_);
  mask_prepared_ = true;
}

bool Sampler::apply_grammar_mask() {
  // A prepared mask stays valid until a token is accepted (only sample() accepts one).
  if (!mask_prepared_ || bitmask_.size() != GrammarMatcher::bitmask_words(adjusted_.size())) {
    bitmask_.resize(GrammarMatcher::bitmask_words(adjusted_.size()));
    matcher_->fill_next_token_bitmask(bitmask_);
  }
  mask_prepared_ = false;
  bool any = false;
  constexpr float kBanned = -std::numeric_limits<float>::infinity();
  for (size_t w = 0; w < bitmask_.size(); ++w) {
    const uint32_t bits = bitmask_[w];
    const size_t end = std::min(adjusted_.size(), (w + 1) * 32);
    if (bits == ~uint32_t{0} && end == (w + 1) * 32) {
      any = true;
      continue;
    }
    for (size_t i = w * 32; i < end; ++i) {
      if ((bits >> (i - w * 32)) & 1u) {
        any = true;
      } else {
        adjusted_[i] = kBanned;
      }
    }
  }
  return any;
}

void Sampler::apply_penalties(std::span<const int32_t> prompt, std::span<const int32_t> output) {
  // Only the tokens of the prompt and the output change: counts_ and seen_ are all zero between
  // calls, and touched_ lists the tokens this call marked, so a call costs the history's length,
  // not passes over the vocabulary (allocated once, on the first call).
  const size_t vocab = adjusted_.size();
  if (counts_.size() != vocab) {
    counts_.assign(vocab, 0);
    seen_.assign(vocab, 0);
    touched_.clear();
    touched_.reserve(vocab);
  }
  auto touch = [&](int32_t t) {
    const auto i = static_cast<size_t>(t);
    if (!seen_[i]) {
      seen_[i] = 1;
      touched_.push_back(t);
    }
  };
  for (int32_t t : prompt) {
    if (t >= 0 && static_cast<size_t>(t) < vocab) touch(t);
  }
  for (int32_t t : output) {
    if (t >= 0 && static_cast<size_t>(t) < vocab) {
      touch(t);
      ++counts_[static_cast<size_t>(t)];
    }
  }
  for (const int32_t t : touched_) {
    const auto i = static_cast<size_t>(t);
    float& x = adjusted_[i];
    if (params_.repetition_penalty != 1.0f) {
      x = x > 0 ? x / params_.repetition_penalty : x * params_.repetition_penalty;
    }
    if (counts_[i] > 0)
      x -= params_.presence_penalty + params_.frequency_penalty * static_cast<float>(counts_[i]);
    counts_[i] = 0;
    seen_[i] = 0;
  }
  touched_.clear();
}

double Sampler::weigh(std::span<const float> logits, float temperature, float* max_scaled) {
  const auto n = static_cast<int64_t>(logits.size());
  const auto blocks = static_cast<size_t>((n + kSoftmaxBlock - 1) / kSoftmaxBlock);
  if (weights_.size() < logits.size()) weights_.resize(logits.size());
  if (block_sums_.size() < blocks) block_sums_.resize(blocks);
  *max_scaled =
      softmax_weights(logits.data(), n, temperature, weights_.data(), block_sums_.data(), active_isa());
  double total = 0;
  for (size_t b = 0; b < blocks; ++b) total += block_sums_[b];
  return total;
}

void Sampler::fill_logprobs(std::span<const float> logits, SampleResult* r, int32_t top) {
  // log Z = max + log(sum of exp(logit - max)), the sum from the vector weights' block sums (the
  // raw logits: temperature 1); a pass over the vocabulary, not a double exp per token.
  float max_logit = 0.0f;
  const double sum = weigh(logits, 1.0f, &max_logit);
  const double log_z = static_cast<double>(max_logit) + std::log(sum);
  r->logprob = static_cast<float>(logits[static_cast<size_t>(r->token)] - log_z);
  const auto k = std::min(static_cast<size_t>(top), logits.size());
  if (k == 0) return;
  // The k best (logit descending, id ascending on ties) in one pass in id order: a token enters
  // the sorted list only above its last (an equal logit there has the smaller id), behind every
  // entry at least as large.
  auto& best = r->top_logprobs;
  best.clear();
  best.reserve(k);
  bool full = false;
  float floor = 0.0f;  // once full, the last entry's logit: a token must be above it
  for (size_t i = 0; i < logits.size(); ++i) {
    const float x = logits[i];
    if (full && !(x > floor)) continue;
    if (full) best.pop_back();
    auto at = best.end();
    while (at != best.begin() && (at - 1)->second < x) --at;
    best.insert(at, {static_cast<int32_t>(i), x});
    full = best.size() == k;
    floor = best.back().second;
  }
  for (auto& [id, value] : best) value = static_cast<float>(value - log_z);
}

// No top-k, so top-p or min-p decides what is kept (the whole-distribution case never gets
// here): the tokens of the nucleus, or those within min_p of the top, usually tens to hundreds
// of the 49k-152k candidates. Sorting all of them took 3.5 ms (49k) to 11 ms (152k) per token,
// as much as a decode step; this sorts a prefix that grows 8x at a time until it holds every
// kept candidate, taking the same tokens in the same order as a full sort. top_p's running
// share divides by the sum over all candidates, summed here in vocabulary order.
template <typename Less>
size_t Sampler::sort_kept_prefix(Less by_logit) {
  const size_t n = candidates_.size();
  float max_logit = candidates_[0].first;
  for (const auto& c : candidates_) max_logit = std::max(max_logit, c.first);
  double all = 0;
  if (params_.top_p < 1.0f) {
    for (const auto& c : candidates_) all += std::exp(c.first - max_logit);
  }
  size_t keep = n, sorted = 0, want = std::min<size_t>(n, 256);
  double cumulative = 0;
  bool decided = false;
  while (!decided) {
    // The first `sorted` are the largest, in order; bring the next ones up behind them
    // (the first 256 by a heap; later, selection then a sort of only those; the whole rest
    // once it is a quarter of all).
    const auto first = candidates_.begin() + static_cast<std::ptrdiff_t>(sorted);
    if (want * 4 >= n) {
      want = n;
      std::sort(first, candidates_.end(), by_logit);
    } else if (sorted == 0) {
      std::partial_sort(first, candidates_.begin() + static_cast<std::ptrdiff_t>(want), candidates_.end(),
                        by_logit);
    } else {
      const auto last = candidates_.begin() + static_cast<std::ptrdiff_t>(want);
      std::nth_element(first, last - 1, candidates_.end(), by_logit);
      std::sort(first, last, by_logit);
    }
    for (; sorted < want && !decided; ++sorted) {
      const float w = std::exp(candidates_[sorted].first - max_logit);
      candidates_[sorted].first = w;
      if (params_.top_p < 1.0f) {
        cumulative += w / all;
        if (cumulative >= params_.top_p) {
          keep = sorted + 1;
          decided = true;
        }
      } else if (sorted > 0 && w < params_.min_p) {
        keep = sorted;  // min_p alone: the first candidate below it ends the prefix
        decided = true;
      }
    }
    if (want == n) break;
    want = std::min(n, want * 8);
  }
  return keep;
}

int32_t Sampler::draw(std::span<const float> logits) {
  if (params_.temperature == 0.0f) return argmax(logits);
  constexpr float kMasked = -std::numeric_limits<float>::infinity();  // ruled out by a grammar
  if (params_.top_k == 0 && params_.top_p >= 1.0f && params_.min_p == 0.0f) {
    // The whole distribution: no order needed, so no sort and no candidate list. The weights
    // come with sums per block of kSoftmaxBlock tokens; the draw finds its block from those, then
    // its token inside the block: two short scans, not one over the vocabulary (49k-152k).
    const auto n = static_cast<int64_t>(logits.size());
    const auto blocks = static_cast<size_t>((n + kSoftmaxBlock - 1) / kSoftmaxBlock);
    float max_scaled = 0.0f;
    const double total = weigh(logits, params_.temperature, &max_scaled);
    if (!(total > 0)) return argmax(logits);  // every token ruled out
    const double r = std::uniform_real_distribution<double>(0.0, total)(rng_);
    double acc = 0;
    size_t b = 0;
    while (b + 1 < blocks && !(r < acc + block_sums_[b])) acc += block_sums_[b++];
    const auto first = static_cast<int64_t>(b) * kSoftmaxBlock;
    const int64_t end = std::min(n, first + kSoftmaxBlock);
    for (int64_t i = first; i < end; ++i) {
      acc += weights_[static_cast<size_t>(i)];
      if (r < acc && weights_[static_cast<size_t>(i)] > 0.0f) return static_cast<int32_t>(i);
    }
    // r fell past the block's tokens summed in order (the block's sum rounds differently): its
    // last token with weight, or, for a block with none, the last one before it.
    for (int64_t i = end - 1; i >= 0; --i)
      if (weights_[static_cast<size_t>(i)] > 0.0f) return static_cast<int32_t>(i);
    return argmax(logits);
  }
  // Tokens a grammar ruled out (-inf) are never candidates.
  candidates_.clear();
  for (size_t i = 0; i < logits.size(); ++i) {
    if (logits[i] != kMasked)
      candidates_.emplace_back(logits[i] / params_.temperature, static_cast<int32_t>(i));
  }
  if (candidates_.empty()) return argmax(logits);
  auto by_logit = [](const auto& a, const auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  // Both branches leave the kept candidates as a prefix of candidates_ in by_logit order, each
  // holding its weight exp(logit - max), and `total`, the sum of the kept weights.
  size_t keep = candidates_.size();
  double total = 0;
  if (params_.top_k > 0 && static_cast<size_t>(params_.top_k) < keep) {
    keep = static_cast<size_t>(params_.top_k);
    std::partial_sort(candidates_.begin(), candidates_.begin() + static_cast<std::ptrdiff_t>(keep),
                      candidates_.end(), by_logit);
    // Softmax over the kept candidates (sorted, largest first).
    const float max_logit = candidates_[0].first;
    for (size_t i = 0; i < keep; ++i) {
      candidates_[i].first = std::exp(candidates_[i].first - max_logit);
      total += candidates_[i].first;
    }
    if (params_.top_p < 1.0f) {
      double cumulative = 0;
      for (size_t i = 0; i < keep; ++i) {
        cumulative += candidates_[i].first / total;
        if (cumulative >= params_.top_p) {
          keep = i + 1;
          break;
        }
      }
      total = 0;
      for (size_t i = 0; i < keep; ++i) total += candidates_[i].first;
    }
  } else {
    keep = sort_kept_prefix(by_logit);
    for (size_t i = 0; i < keep; ++i) total += candidates_[i].first;
  }
  if (params_.min_p > 0.0f) {
    // candidates_[0] holds the top probability's weight exp(0) = 1.
    size_t k = 1;
    while (k < keep && candidates_[k].first >= params_.min_p) ++k;
    keep = k;
    total = 0;
    for (size_t i = 0; i < keep; ++i) total += candidates_[i].first;
  }
  const double r = std::uniform_real_distribution<double>(0.0, total)(rng_);
  double acc = 0;
  for (size_t i = 0; i < keep; ++i) {
    acc += candidates_[i].first;
    if (r < acc) return candidates_[i].second;
  }
  return candidates_[keep - 1].second;
}

}  // namespace inferd
