// The CUDA backend's kernels (cuda_ops.h). Written for correctness against the CPU kernels first:
// each has a test against the CPU result (tests/cuda), run by scripts/gpu-check on a GPU machine.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "kernels/cuda/cuda_ops.h"

namespace inferd::cuda {
namespace {

// A launch that the runtime refuses is a programming error (bad sizes), not bad input.
void check_launch(const char* what) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) {
    std::fprintf(stderr, "inferd: CUDA kernel %s failed to launch: %s\n", what, cudaGetErrorString(e));
    std::abort();
  }
}

int blocks_for(int64_t n, int threads) {
  return static_cast<int>((n + threads - 1) / threads);
}

__device__ float warp_sum(float v) {
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ float warp_max(float v) {
  for (int o = 16; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

constexpr int kNormThreads = 256;

__global__ void rms_norm_kernel(const float* x, const float* w, float* y, int64_t n, float eps) {
  __shared__ double partial[kNormThreads];
  const float* row = x + blockIdx.x * n;
  double ss = 0;
  for (int64_t i = threadIdx.x; i < n; i += kNormThreads) ss += static_cast<double>(row[i]) * row[i];
  partial[threadIdx.x] = ss;
  __syncthreads();
  for (int stride = kNormThreads / 2; stride > 0; stride /= 2) {  // fixed order: deterministic
    if (threadIdx.x < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
    __syncthreads();
  }
  const float scale = static_cast<float>(1.0 / sqrt(partial[0] / static_cast<double>(n) + eps));
  float* out = y + blockIdx.x * n;
  for (int64_t i = threadIdx.x; i < n; i += kNormThreads) out[i] = row[i] * scale * w[i];
}

__global__ void rope_kernel(float* q, int64_t nq, float* k, int64_t nkv, int64_t head_dim, const int64_t* pos,
                            const float* inv_freq, int pairing, float scale) {
  const int64_t t = blockIdx.x;
  const int64_t half = head_dim / 2;
  for (int64_t j = threadIdx.x; j < (nq + nkv) * half; j += blockDim.x) {
    const int64_t h = j / half, i = j % half;
    const float angle = static_cast<float>(pos[t]) * inv_freq[i];
    const float c = static_cast<float>(cos(static_cast<double>(angle))) * scale;
    const float s = static_cast<float>(sin(static_cast<double>(angle))) * scale;
    float* v = h < nq ? q + (t * nq + h) * head_dim : k + (t * nkv + (h - nq)) * head_dim;
    const int64_t i0 = pairing == 0 ? i : 2 * i;
    const int64_t i1 = pairing == 0 ? i + half : 2 * i + 1;
    const float a = v[i0], b = v[i1];
    v[i0] = a * c - b * s;
    v[i1] = b * c + a * s;
  }
}

__global__ void silu_mul_kernel(const float* gate, const float* up, float* out, int64_t n) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = gate[i] / (1.0f + expf(-gate[i])) * up[i];
}

__global__ void add_bias_kernel(float* y, int64_t ld, int64_t rows, int64_t tokens, const float* bias) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < rows * tokens) y[(i / rows) * ld + i % rows] += bias[i % rows];
}

__global__ void to_f16_kernel(const float* x, __half* out, int64_t n) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = __float2half_rn(x[i]);
}

__global__ void to_bf16_kernel(const float* x, __nv_bfloat16* out, int64_t n) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = __float2bfloat16_rn(x[i]);
}

// One warp per block of 32 activations: d = max |x| / 127, q = round(x / d).
__global__ void quantize_q8_kernel(const float* x, int64_t blocks, int8_t* xq, float* xd) {
  const int64_t b = blockIdx.x * static_cast<int64_t>(blockDim.x / 32) + threadIdx.x / 32;
  if (b >= blocks) return;
  const int lane = threadIdx.x % 32;
  const float v = x[b * 32 + lane];
  const float amax = warp_max(fabsf(v));
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  xq[b * 32 + lane] = static_cast<int8_t>(roundf(v * id));
  if (lane == 0) xd[b] = d;
}

constexpr int kQ8BlockBytes = 34;  // an f16 scale, then 32 int8
constexpr int kQ8Warps = 8;

// One warp per (row, token); lanes take blocks lane, lane + 32, ...; the lanes' sums are added in
// a fixed order.
__global__ void q8_0_matmul_kernel(const unsigned char* w, int64_t rows, int64_t blocks, const int8_t* xq,
                                   const float* xd, float* y, int64_t ld) {
  const int64_t r = blockIdx.x * static_cast<int64_t>(kQ8Warps) + threadIdx.x / 32;
  const int64_t t = blockIdx.y;
  if (r >= rows) return;
  const int lane = threadIdx.x % 32;
  float acc = 0.0f;
  for (int64_t b = lane; b < blocks; b += 32) {
    const unsigned char* blk = w + (r * blocks + b) * kQ8BlockBytes;
    // The block's quants start 2 bytes in: 2-byte aligned, read as pairs and joined into words.
    const auto* h = reinterpret_cast<const unsigned short*>(blk);
    const float dw = __half2float(__ushort_as_half(h[0]));
    const int* xw = reinterpret_cast<const int*>(xq + (t * blocks + b) * 32);
    int sum = 0;
    for (int i = 0; i < 8; ++i) {
      const int word =
          static_cast<int>(static_cast<unsigned>(h[1 + 2 * i]) | (static_cast<unsigned>(h[2 + 2 * i]) << 16));
      sum = __dp4a(word, xw[i], sum);
    }
    acc += dw * xd[t * blocks + b] * static_cast<float>(sum);
  }
  acc = warp_sum(acc);
  if (lane == 0) y[t * ld + r] = acc;
}

// KV elements as f32 (the 8-bit ones before their scale).
template <int KV>
__device__ float kv_value(const void* base, int64_t i) {
  if constexpr (KV == 0) {
    return static_cast<const float*>(base)[i];
  } else if constexpr (KV == 1) {
    return __half2float(static_cast<const __half*>(base)[i]);
  } else if constexpr (KV == 2) {
    return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[i]);
  } else if constexpr (KV == 3) {
    return static_cast<float>(static_cast<const int8_t*>(base)[i]);
  } else {
    const __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<const __nv_fp8_storage_t*>(base)[i], __NV_E4M3);
    return __half2float(__half(h));
  }
}

constexpr int kAttnWarps = 4;
constexpr int kMaxHeadDim = 256;
constexpr int kDimsPerLane = kMaxHeadDim / 32;

template <int KV>
__global__ void attention_kernel(AttentionArgs a) {
  const int64_t t = blockIdx.x, h = blockIdx.y;
  const int64_t hd = a.head_dim;
  const int64_t kvh = h / (a.num_heads / a.num_kv_heads);
  const int64_t kv_dim = a.num_kv_heads * hd;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __shared__ float q[kMaxHeadDim];
  __shared__ float warp_m[kAttnWarps], warp_l[kAttnWarps];
  __shared__ float warp_acc[kAttnWarps][kMaxHeadDim];
  for (int64_t d = threadIdx.x; d < hd; d += blockDim.x) q[d] = a.q[(t * a.num_heads + h) * hd + d];
  __syncthreads();
  const int64_t last = a.pos[t];
  const int64_t start = a.table_start[a.seq[t]];
  float m = -INFINITY, l = 0.0f, acc[kDimsPerLane];
  for (float& v : acc) v = 0.0f;
  for (int64_t p = warp; p <= last; p += kAttnWarps) {
    const int64_t slot =
        static_cast<int64_t>(a.table[start + p / a.block_size]) * a.block_size + p % a.block_size;
    const int64_t base = slot * kv_dim + kvh * hd;
    float dot = 0.0f;
    for (int j = 0; j < kDimsPerLane; ++j) {
      const int64_t d = lane + 32 * j;
      if (d < hd) dot += q[d] * kv_value<KV>(a.key, base + d);
    }
    dot = warp_sum(dot);
    float key_scale = 1.0f, value_scale = 1.0f;
    if constexpr (KV >= 3) {
      key_scale = a.key_scale[slot * a.num_kv_heads + kvh];
      value_scale = a.value_scale[slot * a.num_kv_heads + kvh];
    }
    const float s = dot * key_scale * a.scale;
    const float m_new = fmaxf(m, s);
    const float correction = expf(m - m_new);  // 0 on the first position (m = -inf)
    const float weight = expf(s - m_new);
    l = l * correction + weight;
    for (int j = 0; j < kDimsPerLane; ++j) {
      const int64_t d = lane + 32 * j;
      if (d < hd) acc[j] = acc[j] * correction + weight * kv_value<KV>(a.value, base + d) * value_scale;
    }
    m = m_new;
  }
  if (lane == 0) {
    warp_m[warp] = m;
    warp_l[warp] = l;
  }
  for (int j = 0; j < kDimsPerLane; ++j) {
    const int64_t d = lane + 32 * j;
    if (d < hd) warp_acc[warp][d] = acc[j];
  }
  __syncthreads();
  float mm = -INFINITY;
  for (int w = 0; w < kAttnWarps; ++w) mm = fmaxf(mm, warp_m[w]);
  float total = 0.0f;
  for (int w = 0; w < kAttnWarps; ++w)
    if (warp_l[w] > 0.0f) total += warp_l[w] * expf(warp_m[w] - mm);
  for (int64_t d = threadIdx.x; d < hd; d += blockDim.x) {
    float sum = 0.0f;
    for (int w = 0; w < kAttnWarps; ++w)
      if (warp_l[w] > 0.0f) sum += warp_acc[w][d] * expf(warp_m[w] - mm);
    a.out[(t * a.num_heads + h) * hd + d] = sum / total;
  }
}

}  // namespace

void rms_norm(const float* x, const float* weight, float* y, int64_t rows, int64_t n, float eps,
              cudaStream_t s) {
  if (rows == 0) return;
  rms_norm_kernel<<<static_cast<unsigned>(rows), kNormThreads, 0, s>>>(x, weight, y, n, eps);
  check_launch("rms_norm");
}

void rope_qk(float* q, int64_t num_q_heads, float* k, int64_t num_kv_heads, int64_t head_dim, int64_t tokens,
             const int64_t* pos, const float* inv_freq, int pairing, float scale, cudaStream_t s) {
  if (tokens == 0) return;
  rope_kernel<<<static_cast<unsigned>(tokens), 256, 0, s>>>(q, num_q_heads, k, num_kv_heads, head_dim, pos,
                                                            inv_freq, pairing, scale);
  check_launch("rope_qk");
}

void silu_mul(const float* gate, const float* up, float* out, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  silu_mul_kernel<<<blocks_for(n, 256), 256, 0, s>>>(gate, up, out, n);
  check_launch("silu_mul");
}

void add_bias(float* y, int64_t ld, int64_t rows, int64_t tokens, const float* bias, cudaStream_t s) {
  if (rows * tokens == 0) return;
  add_bias_kernel<<<blocks_for(rows * tokens, 256), 256, 0, s>>>(y, ld, rows, tokens, bias);
  check_launch("add_bias");
}

void to_f16(const float* x, void* out, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  to_f16_kernel<<<blocks_for(n, 256), 256, 0, s>>>(x, static_cast<__half*>(out), n);
  check_launch("to_f16");
}

void to_bf16(const float* x, void* out, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  to_bf16_kernel<<<blocks_for(n, 256), 256, 0, s>>>(x, static_cast<__nv_bfloat16*>(out), n);
  check_launch("to_bf16");
}

void q8_0_matmul(const void* w, int64_t rows, int64_t k, const float* x, int64_t tokens, int8_t* xq,
                 float* xd, float* y, int64_t ld, cudaStream_t s) {
  if (rows * tokens == 0) return;
  const int64_t blocks = k / 32;
  quantize_q8_kernel<<<blocks_for(tokens * blocks, 8), 256, 0, s>>>(x, tokens * blocks, xq, xd);
  check_launch("quantize_q8");
  const dim3 grid(static_cast<unsigned>((rows + kQ8Warps - 1) / kQ8Warps), static_cast<unsigned>(tokens));
  q8_0_matmul_kernel<<<grid, 32 * kQ8Warps, 0, s>>>(static_cast<const unsigned char*>(w), rows, blocks, xq,
                                                    xd, y, ld);
  check_launch("q8_0_matmul");
}

void paged_attention(const AttentionArgs& a, cudaStream_t s) {
  if (a.tokens == 0) return;
  const dim3 grid(static_cast<unsigned>(a.tokens), static_cast<unsigned>(a.num_heads));
  const int threads = 32 * kAttnWarps;
  switch (a.kv_dtype) {
    case 0: attention_kernel<0><<<grid, threads, 0, s>>>(a); break;
    case 1: attention_kernel<1><<<grid, threads, 0, s>>>(a); break;
    case 2: attention_kernel<2><<<grid, threads, 0, s>>>(a); break;
    case 3: attention_kernel<3><<<grid, threads, 0, s>>>(a); break;
    default: attention_kernel<4><<<grid, threads, 0, s>>>(a); break;
  }
  check_launch("paged_attention");
}

}  // namespace inferd::cuda
