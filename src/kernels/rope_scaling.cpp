#include "kernels/rope_scaling.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "common/check.h"
#include "kernels/ops.h"

namespace inferd {

namespace {

// Each function mirrors its transformers counterpart (_compute_*_parameters); tensors there are
// f32 and Python scalars meet them as f32, so each step rounds to f32 where torch does.

std::vector<float> linear(int64_t head_dim, double theta, double factor) {
  std::vector<float> inv = rope_inverse_frequencies(head_dim, theta);
  for (float& f : inv) f /= static_cast<float>(factor);
  return inv;
}

// base * ((factor * seq_len / max_position_embeddings) - (factor - 1)) ** (dim / (dim - 2)),
// evaluated on f32 tensors as the forward pass does once seq_len outgrows the original context.
// Writes inv[head_dim / 2]; allocates nothing (the forward pass calls it per token).
void dynamic_ntk(int64_t head_dim, double theta, const RopeScaling& s, int64_t seq_len, float* inv) {
  float base = static_cast<float>(theta);
  if (seq_len > s.original_context) {
    const auto f = static_cast<float>(s.factor);
    const float ratio = f * static_cast<float>(seq_len) / static_cast<float>(s.original_context) -
                        static_cast<float>(s.factor - 1);
    const double exponent = static_cast<double>(head_dim) / static_cast<double>(head_dim - 2);
    base = static_cast<float>(theta) * std::pow(ratio, static_cast<float>(exponent));
  }
  for (int64_t i = 0; i < head_dim / 2; ++i) {
    const float e = static_cast<float>(2 * i) / static_cast<float>(head_dim);
    inv[i] = 1.0f / std::pow(base, e);
  }
}

// Interpolated (inv / factor) below the correction range, extrapolated (inv) above it, a linear
// ramp between; the range comes from beta_fast / beta_slow rotations in the original context.
std::vector<float> yarn(int64_t head_dim, double theta, const RopeScaling& s) {
  const auto dim = static_cast<double>(head_dim);
  auto correction_dim = [&](double rotations) {
    return dim * std::log(static_cast<double>(s.original_context) / (rotations * 2 * std::numbers::pi)) /
           (2 * std::log(theta));
  };
  double low = correction_dim(s.beta_fast), high = correction_dim(s.beta_slow);
  if (s.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, dim - 1);
  if (low == high) high += 0.001;  // transformers: "prevent singularity"
  const auto range = static_cast<float>(high - low);
  std::vector<float> inv(static_cast<size_t>(head_dim / 2));
  for (size_t i = 0; i < inv.size(); ++i) {
    const float pos_freq =
        std::pow(static_cast<float>(theta), static_cast<float>(2 * i) / static_cast<float>(dim));
    const float extrapolation = 1.0f / pos_freq;
    const float interpolation = 1.0f / (static_cast<float>(s.factor) * pos_freq);
    const float ramp = std::clamp((static_cast<float>(i) - static_cast<float>(low)) / range, 0.0f, 1.0f);
    const float extrapolation_factor = 1.0f - ramp;
    inv[i] = interpolation * (1.0f - extrapolation_factor) + extrapolation * extrapolation_factor;
  }
  return inv;
}

// Wavelengths longer than original_context / low_freq_factor are divided by factor, shorter
// than original_context / high_freq_factor kept, those between blended smoothly.
std::vector<float> llama3(int64_t head_dim, double theta, const RopeScaling& s) {
  std::vector<float> inv = rope_inverse_frequencies(head_dim, theta);
  const auto old_context = static_cast<double>(s.original_context);
  const auto low_wavelen = static_cast<float>(old_context / s.low_freq_factor);
  const auto high_wavelen = static_cast<float>(old_context / s.high_freq_factor);
  const auto factor = static_cast<float>(s.factor);
  for (float& f : inv) {
    const float wavelen = static_cast<float>(2 * std::numbers::pi) / f;
    const float scaled = wavelen > low_wavelen ? f / factor : f;
    const float smooth = (static_cast<float>(old_context) / wavelen - static_cast<float>(s.low_freq_factor)) /
                         static_cast<float>(s.high_freq_factor - s.low_freq_factor);
    const float smoothed = (1.0f - smooth) * scaled / factor + smooth * scaled;
    const bool medium = !(wavelen < high_wavelen) && !(wavelen > low_wavelen);
    f = medium ? smoothed : scaled;
  }
  return inv;
}

}  // namespace

std::string_view rope_scaling_name(RopeScalingType type) {
  switch (type) {
    case RopeScalingType::kNone: return "none";
    case RopeScalingType::kLinear: return "linear";
    case RopeScalingType::kDynamic: return "dynamic";
    case RopeScalingType::kYarn: return "yarn";
    case RopeScalingType::kLlama3: return "llama3";
  }
  return "?";
}

double yarn_attention_factor(double factor, double mscale, double mscale_all_dim) {
  auto get_mscale = [factor](double m) { return factor <= 1 ? 1.0 : 0.1 * m * std::log(factor) + 1.0; };
  if (mscale != 0 && mscale_all_dim != 0) return get_mscale(mscale) / get_mscale(mscale_all_dim);
  return get_mscale(1.0);
}

std::vector<float> rope_scaled_inverse_frequencies(int64_t head_dim, double theta, const RopeScaling& s,
                                                   int64_t seq_len) {
  switch (s.type) {
    case RopeScalingType::kNone: {
      std::vector<float> inv = rope_inverse_frequencies(head_dim, theta);
      if (!s.freq_factors.empty()) {
        INFERD_CHECK(s.freq_factors.size() == inv.size());
        for (size_t i = 0; i < inv.size(); ++i) inv[i] /= s.freq_factors[i];
      }
      return inv;
    }
    case RopeScalingType::kLinear: return linear(head_dim, theta, s.factor);
    case RopeScalingType::kDynamic: {
      std::vector<float> inv(static_cast<size_t>(head_dim / 2));
      dynamic_ntk(head_dim, theta, s, seq_len, inv.data());
      return inv;
    }
    case RopeScalingType::kYarn: return yarn(head_dim, theta, s);
    case RopeScalingType::kLlama3: return llama3(head_dim, theta, s);
  }
  return {};
}

std::vector<float> llama3_rope_freq_factors(int64_t head_dim, double theta, const RopeScaling& s) {
  std::vector<float> factors = rope_inverse_frequencies(head_dim, theta);
  const auto old_context = static_cast<double>(s.original_context);
  const double low_wavelen = old_context / s.low_freq_factor, high_wavelen = old_context / s.high_freq_factor;
  for (float& f : factors) {
    const float wavelen = static_cast<float>(2 * std::numbers::pi) / f;
    if (wavelen < static_cast<float>(high_wavelen)) {
      f = 1.0f;
    } else if (wavelen > static_cast<float>(low_wavelen)) {
      f = static_cast<float>(s.factor);
    } else {
      const float smooth =
          (static_cast<float>(old_context) / wavelen - static_cast<float>(s.low_freq_factor)) /
          static_cast<float>(s.high_freq_factor - s.low_freq_factor);
      f = 1.0f / ((1.0f - smooth) / static_cast<float>(s.factor) + smooth);
    }
  }
  return factors;
}

RopeFrequencies::RopeFrequencies(int64_t head_dim, double theta, RopeScaling scaling)
    : head_dim_(head_dim),
      theta_(theta),
      scaling_(std::move(scaling)),
      shared_(rope_scaled_inverse_frequencies(head_dim, theta, scaling_)) {}

void RopeFrequencies::compute(int64_t pos, float* out) const {
  if (!position_dependent(pos)) {
    std::copy(shared_.begin(), shared_.end(), out);
    return;
  }
  dynamic_ntk(head_dim_, theta_, scaling_, pos + 1, out);
}

}  // namespace inferd
