// GPTQ rounding for inferd's INT4 (Q4_G128 / Q4_G64), `inferd quantize --calibration TEXT`.
//
// The model runs over a calibration text on the f32 path while CalibrationStats collects, for
// every layer and linear input (attention, O, MLP, down), H = sum over tokens of x x^T. Each
// matrix is then rounded one input column at a time (Frantar et al., "GPTQ", 2022), the inputs
// with the largest second moment first ("act order"): a column's rounding error, scaled by the
// inverse Hessian's Cholesky factor, is spread over the columns not yet rounded, so the layer's
// output on the calibration inputs moves as little as possible. Group scales and minimums are
// chosen up front by quantize_row's search on the original weights ("static groups", since a
// group's columns are scattered through the order). H goes through OpenBLAS (ssyrk) and LAPACK
// (dpotrf, dtrtri).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "common/status.h"
#include "common/thread_pool.h"
#include "model/model_weights.h"
#include "model/transformer.h"

namespace inferd {

class CalibrationStats final : public LinearObserver {
 public:
  explicit CalibrationStats(const ModelConfig& config);
  void observe(int64_t layer, LinearInput input, const float* x, int64_t tokens, int64_t k) override;

  // sum_t x x^T of the input, [k, k] row-major (upper triangle filled), or null if never seen.
  const std::vector<float>* hessian(int64_t layer, LinearInput input) const;
  int64_t tokens() const { return tokens_; }

 private:
  std::vector<std::vector<float>> h_;  // [layer * 4 + input]
  std::vector<int64_t> k_;
  int64_t tokens_ = 0;
};

// Runs `weights` (f32 path) over `tokens` in chunks of `context` (as perplexity does) and returns
// the statistics. Needs at least one whole chunk.
Expected<CalibrationStats> calibrate(const ModelWeights& weights, std::span<const int32_t> tokens,
                                     int64_t context, int64_t max_chunks, ThreadPool& pool);

// The layer and linear input a weight tensor belongs to, from its GGUF or Hugging Face name
// ("blk.3.ffn_down.weight", "model.layers.3.mlp.down_proj.weight"); false for other tensors.
bool linear_input_of(const std::string& tensor_name, int64_t* layer, LinearInput* input);

// Rounds w (rows x k values, `w_f32` row-major) to `dtype` (Q4_G128 or Q4_G64) into out
// (dtype_bytes(dtype, k) per row) with GPTQ against hessian ([k, k], upper triangle), damped by
// 1 % of its mean diagonal.
Status gptq_quantize(DType dtype, const float* w_f32, int64_t rows, int64_t k,
                     const std::vector<float>& hessian, std::byte* out, ThreadPool& pool);

}  // namespace inferd
