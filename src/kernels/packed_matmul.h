// Integer matmul for block-quantized weights (GGUF Q8_0, Q5_0, Q5_1, Q4_0, Q4_1, Q2_K, Q3_K,
// Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS, IQ3_XXS, IQ3_S, IQ2_S, IQ2_XS, IQ2_XXS, IQ1_S, IQ1_M, TQ1_0, TQ2_0):
// activations are quantized per token to int8 in blocks of 32, each weight block's dot product is an exact
// int32 sum (AMX-INT8 tdpbssd for 16 tokens, AVX512-VNNI vpdpbusd, AVX2 vpmaddubsw, or scalar), then scaled
// and accumulated in f32.
//
// Weights are repacked once, at load, into tiles of 16 output rows: for each block of 32 inputs a
// tile holds the 16 rows' scales (and mins, and Q6_K's two half-block scales) and their quants
// as u8, interleaved four bytes per row, so one 64-byte load feeds one vpdpbusd for all 16 rows:
//
//   tile  = block 0 | block 1 | ... | block K/32-1
//   block = scale[16] f16 | min[16] f16 (formats with a min) | quants
//   quants, bytes   (Q8_0, I8): 8 groups x 16 rows x 4 u8, group g = values 4g..4g+3
//   quants, nibbles (Q4_*, Q5_*, Q6_K): 4 groups x 16 rows x 4 u8, low nibble value 4g+j, high
//                   nibble value 16+4g+j; then the bits above the nibble (Q5_*: 1, Q6_K: 2) in
//                   planes of the same 16 x 4 byte layout (bit g, or bits 2(g%4) of plane g/4)
//   quants, crumbs  (Q2_K, Q3_K, IQ2, IQ1, TQ): 2 groups x 16 rows x 4 u8, value 4(g+2c)+j in bits 2c..2c+1;
//                   Q3_K's, IQ2's and IQ1's third bit in a plane (bit g)
//   K-quants pack a superblock (8 blocks) as one group: a head with the 16 rows' f16 d (and
//   dmin) and each block's integer sub-scales (sc and mn u8, or Q6_K's two i8 half scales),
//   then the 8 blocks' quants; a block's scale is d * sc, its min -(dmin * mn) (exact in f32)
//   e.g. Q8_0 544 bytes, Q4_0 288, Q4_1 320, Q5_0 352, Q4_K 296, Q5_K 360, Q6_K 420 per 16 x 32
//   values: what the file holds, but for Q4_K / Q5_K's 6-bit sub-scales and sub-mins kept as
//   whole bytes (3 % more); IQ4_NL / IQ4_XS pack like Q4_0 / Q4_K (IQ4_XS's head: d and each
//   block's ls - 32 as i8), their nibbles indices into kIq4Values, looked up in the kernel
//   as u8 value + 128 (offset 128, as Q8_0); IQ3_XXS / IQ3_S pack as IQ4_XS, each grid point's
//   values expanded at load to nibble codes sign << 3 | level into a table of their signed levels
//   (276 bytes against the files' 196 / 220), the head's i8 the block's 2s + 1 (IQ3_XXS: scale
//   d * m / 4); IQ2_S / IQ2_XS / IQ2_XXS pack as Q3_K, each grid point's values expanded to 3-bit
//   codes sign << 2 | level (crumb and plane bit) into a table of their signed levels, the head
//   Q6_K's (each half block's 2s + 1; IQ2_XXS: IQ3_XXS's head), scale d * m / 8 (228 bytes, files:
//   164 / 148; IQ2_XXS 212, file 132); IQ1_S / IQ1_M as IQ2_XXS / IQ2_XS, the codes
//   minus << 2 | level standing for 8 * level -+ 1 (212 / 228 bytes, files: 100 / 112);
//   TQ1_0 / TQ2_0 plain crumbs with offset 1 and Q4_0's per-block f16 d (160 bytes, files:
//   108 / 132); Q2_K 168 and Q3_K 228 (file: 220) bytes, their
//   heads holding two sub-scales per block (Q3_K's as Q6_K's, Q2_K's sc | mn << 4 of each half)
//
// Per (token, row, block): i = sum_j (q_j - offset) * x_j exactly (offset 128 for Q8_0 whose
// quants are stored + 128, and the looked-up grid and IQ4 types, 16 for Q5_0, 8 for Q4_0, 32 for
// Q6_K, 4 for Q3_K, 1 for TQ1_0 / TQ2_0, else 0; Q6_K, Q3_K, Q2_K, IQ2_S, IQ2_XS, IQ1_M: i = s0 * i_lo + s1 *
// i_hi over the halves), then acc = fma(d_w * d_x, float(i), acc), and with a min acc = fma(m_w, d_x * sum_j
// x_j, acc) (Q2_K: acc = fma(-dmin * d_x, float(m0 * sum x_lo + m1 * sum x_hi), acc)). Every ISA path
// performs exactly these f32 operations in this order, so all paths give bit-identical results, and a token's
// result never depends on the other tokens of the batch (the thread split is over tiles of rows): batch
// invariance holds.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "common/status.h"
#include "common/thread_pool.h"
#include "kernels/cpu_isa.h"
#include "tensor/tensor_view.h"

namespace inferd {

inline constexpr int64_t kQuantTileRows = 16;
inline constexpr int64_t kQuantBlockValues = 32;

// Activations [tokens, k] quantized per token in blocks of 32: q = round(x / d), d = max|x| / 127
// (d = 0 and q = 0 for an all-zero block), with each block's sum of q and d * sum.
class QuantizedActivations final {
 public:
  // Quantizes x [tokens, k]; k must be a multiple of 32. Allocates only when larger than before.
  // `isa` picks the path (tests); every path gives the reference's bits. With a pool, a batch of
  // kPoolRows tokens or more is split over its threads (each row is quantized alone: the same
  // bits either way).
  void quantize(const float* x, int64_t tokens, int64_t k, Isa isa = active_isa(),
                ThreadPool* pool = nullptr);
  // quantize() of rms_norm(x) row by row, each normalised row quantized while in L1 (the same
  // bits as rms_norm then quantize). x: [tokens, k]; weight: [k].
  void quantize_rms_norm(const float* x, const float* weight, float eps, int64_t tokens, int64_t k,
                         Isa isa = active_isa(), ThreadPool* pool = nullptr);

  int64_t tokens() const { return tokens_; }
  int64_t k() const { return k_; }
  int64_t blocks() const { return k_ / kQuantBlockValues; }
  const int8_t* q(int64_t t) const { return q_.get() + t * k_; }
  const float* scale(int64_t t) const { return scale_.data() + t * blocks(); }
  const int32_t* sum(int64_t t) const { return sum_.data() + t * blocks(); }
  const float* scaled_sum(int64_t t) const { return scaled_sum_.data() + t * blocks(); }
  // Sums of each block's two halves of 16 (Q6_K's sub-blocks): [2 * blocks].
  const int32_t* half_sum(int64_t t) const { return half_sum_.data() + 2 * t * blocks(); }

 private:
  void reserve(int64_t tokens, int64_t k);
  using RowFn = void (*)(const float*, int64_t, int8_t*, float*, int32_t*, float*, int32_t*);
  static RowFn row_function(Isa isa);

  // rows [begin, end) of quantize() or, with weight, of quantize_rms_norm().
  void quantize_rows(const float* x, const float* weight, float eps, int64_t begin, int64_t end, RowFn row_fn,
                     float* normed);
  void quantize_split(const float* x, const float* weight, float eps, int64_t tokens, Isa isa,
                      ThreadPool* pool);

  int64_t tokens_ = 0;
  int64_t k_ = 0;
  size_t capacity_ = 0;
  // quantize_rms_norm's normalised row: the calling thread's, and each pool thread's.
  std::vector<float> row_;
  PerThread<std::vector<float>> normed_;
  std::unique_ptr<int8_t[], void (*)(void*)> q_{nullptr, nullptr};
  std::vector<float> scale_;
  std::vector<int32_t> sum_;
  std::vector<float> scaled_sum_;
  std::vector<int32_t> half_sum_;
};

// Scalar quantization of one token's row, the reference every path matches bit for bit.
void quantize_activations_reference(const float* x, int64_t k, int8_t* q, float* scale, int32_t* sum,
                                    float* scaled_sum, int32_t* half_sum);

// Where one packed part's rows go: y[t * ld + r] for its rows r, plus bias[r] when given.
struct QuantMatmulOutput {
  float* y = nullptr;
  int64_t ld = 0;
  const float* bias = nullptr;
};

class PackedWeight final {
 public:
  // Whether a packed kernel takes this dtype: the integer kernels (block-quantized types) or the
  // float kernel (F32, F16, BF16).
  static bool supports(DType dtype);
  static bool is_float_dtype(DType dtype);

  // Packs one or more matrices of one supported dtype and row length, one after another, each
  // padded to whole tiles (Q, K and V as one matmul). Errors name an unsupported or mixed dtype.
  // With a pool, its threads pack the tiles (the result does not depend on it).
  static Expected<PackedWeight> pack(std::span<const TensorView* const> parts, ThreadPool* pool = nullptr);
  // Packs gate and up ([intermediate, hidden] each) tile by tile interleaved, for the SwiGLU
  // matmul: y = silu(x gate^T) * (x up^T).
  static Expected<PackedWeight> pack_swiglu(const TensorView& gate, const TensorView& up,
                                            ThreadPool* pool = nullptr);

  DType dtype() const { return dtype_; }
  bool is_float() const { return is_float_dtype(dtype_); }
  int64_t part_first_tile(size_t part) const { return parts_[part].first_tile; }
  int64_t part_tiles(size_t part) const { return parts_[part].num_tiles; }
  int64_t cols() const { return cols_; }
  int64_t tiles() const { return tiles_; }
  bool swiglu() const { return swiglu_; }
  size_t num_parts() const { return parts_.size(); }
  int64_t part_rows(size_t part) const { return parts_[part].rows; }
  size_t tile_bytes() const { return tile_bytes_; }
  size_t block_bytes() const { return block_bytes_; }
  const std::byte* tile(int64_t index) const {
    return data_.get() + static_cast<size_t>(index) * tile_bytes_;
  }
  size_t num_bytes() const { return static_cast<size_t>(tiles_) * tile_bytes_; }

 private:
  struct Part {
    int64_t first_tile = 0;
    int64_t num_tiles = 0;
    int64_t rows = 0;
  };
  static Expected<PackedWeight> pack_tiles(std::span<const TensorView* const> parts, bool interleave,
                                           ThreadPool* pool);

  DType dtype_ = DType::kQ8_0;
  int64_t cols_ = 0;
  int64_t tiles_ = 0;
  bool swiglu_ = false;
  size_t block_bytes_ = 0;
  size_t tile_bytes_ = 0;
  std::vector<Part> parts_;
  std::unique_ptr<std::byte[], void (*)(void*)> data_{nullptr, nullptr};
};

// The AMX-INT8 kernel groups of 16 tokens run on (both give the VNNI path's bits):
// - kPipelined: two C tiles; an iteration issues its two blocks' dot products, scales the previous
//   iteration's sums, then stores its own (measured on the Xeon: BENCHMARKS.md, "AMX-INT8").
// - kPingPong: four C tiles used in turn by consecutive iterations, so a store of one iteration's
//   sums and the next iteration's dot products touch different tiles; the half-block formats take
//   one 32-input A tile and two B tiles that each hold one half (the other half zero). Not yet
//   measured on an AMX CPU.
// INFERD_AMX_INT8=pipelined|pingpong picks it (read once, at first use; default pipelined);
// set_amx_int8_kernel overrides it (tests, benchmarks), from one thread with no matmul running.
enum class AmxInt8Kernel { kPipelined, kPingPong };
AmxInt8Kernel amx_int8_kernel();
void set_amx_int8_kernel(AmxInt8Kernel kernel);

// How the AVX-512 fma kernels of F32 and F16 weights block their registers for 4 tokens and more
// (both give the same bits: every output's two chains are the same instructions in the same order):
// - kPairs: two tiles of 16 rows per call, up to 6 tokens; one activation broadcast per two fmas.
//   Where 512-bit fmas issue two per cycle (Zen 5, the Xeons) the broadcasts of one tile per call
//   held the fmas back (BENCHMARKS.md, "Two tiles per kernel call").
// - kWide: one tile per call, up to 12 tokens; one weight conversion (F16 to f32) per 24 fmas
//   instead of two per 24. Where a 512-bit fma takes a whole cycle (Zen 4,
//   cpu_splits_512bit_ops) the conversions, not the broadcasts, held the pairs back
//   (BENCHMARKS.md, "Float prefill on Zen 4").
// The default is kWide where cpu_splits_512bit_ops(), kPairs elsewhere; INFERD_FLOAT_BLOCKING=
// pairs|wide picks one (read once, at first use); set_float_blocking overrides it (tests,
// benchmarks), from one thread with no matmul running. BF16 keeps its pairs of tiles and F8_E4M3
// its one tile of up to 8 tokens either way.
enum class FloatBlocking { kPairs, kWide };
FloatBlocking float_blocking();
void set_float_blocking(FloatBlocking blocking);

// y = x w^T (+ bias) for every part of a block-quantized w: outputs[p] receives part p. With a
// SwiGLU-packed w, one output receives silu(gate) * up ([tokens, intermediate]), or two outputs
// receive gate and up as they are (bit-identical to what the fused epilogue starts from). Runs the active
// ISA's path unless `isa` says otherwise (tests); the split over threads is by tiles of rows.
void quant_matmul(const QuantizedActivations& x, const PackedWeight& w,
                  std::span<const QuantMatmulOutput> outputs, ThreadPool& pool, Isa isa = active_isa());

// The same for float-packed weights (F32, F16, BF16), x: [tokens, cols] f32. Per output: two
// chains of fmas over even and odd k, added at the end, on every path (AVX-512 or scalar): exact
// f32 arithmetic on the stored weights, batch-invariant, bit-identical across paths. BF16: two
// chains of BF16 dot products on bf16-rounded activations, bit-identical across paths, except on
// CPUs with AMX-BF16, whose tiles (every token count there) round their own way within the same
// bound; batch-invariant on every path.
void float_matmul(const float* x, int64_t tokens, const PackedWeight& w,
                  std::span<const QuantMatmulOutput> outputs, ThreadPool& pool, Isa isa = active_isa());

// One matmul of a batch of them: w (one part, or SwiGLU-packed) over its own `tokens` rows,
// already quantized in x for block-quantized w, or f32 rows x_f32 [tokens, cols] for float w.
struct PackedMatmulGroup {
  const PackedWeight* w = nullptr;
  const QuantizedActivations* x = nullptr;
  const float* x_f32 = nullptr;
  int64_t tokens = 0;
  QuantMatmulOutput out;
};

// quant_matmul / float_matmul of every group, in one parallel_for over all the groups' tiles
// (one hand-off to the threads instead of one per group: the experts a MoE step selected).
// Every output is computed exactly as the group's own call computes it: bit-identical.
void packed_matmul_groups(std::span<const PackedMatmulGroup> groups, ThreadPool& pool,
                          Isa isa = active_isa());

// Either of the two by w's dtype, quantizing x into `scratch` for block-quantized weights.
void packed_matmul(const float* x, int64_t tokens, const PackedWeight& w, QuantizedActivations& scratch,
                   std::span<const QuantMatmulOutput> outputs, ThreadPool& pool);

}  // namespace inferd
