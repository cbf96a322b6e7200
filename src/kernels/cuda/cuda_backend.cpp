// The CUDA backend behind the Backend seam (built with -DINFERD_CUDA=ON; kernels/cuda_backend_stub.cpp
// otherwise). This first version keeps the seam as it is: the ops take and return host memory,
// so each op copies its inputs to the GPU, runs there and copies its result back.
//   - Linear weights live on the GPU from prepare_linear on: F32 (cuBLAS SGEMM), F16 / BF16 as
//     stored (cuBLAS GemmEx, activations rounded to the weights' 16-bit type, f32 sums), Q8_0 as
//     stored (our W8A8 kernel: activations quantized per block of 32, int8 dot products); every
//     other format expanded to f32 once at load.
//   - Attention reads the blocks the batch's block tables name, gathered from the host KV pool
//     into one upload per call (every KV dtype); windowed (StreamingLLM) sequences and LoRA
//     updates run on the CPU kernels.
// Not yet here (docs/architecture.md "CUDA backend"): a KV pool and activations resident on the
// GPU, CUDA Graphs, the sampler on the GPU. Every kernel is checked against the CPU by
// tests/cuda, which scripts/gpu-check runs on a GPU machine.
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "common/check.h"
#include "kernels/backend.h"
#include "kernels/cuda/cuda_ops.h"
#include "tensor/dequantize.h"

namespace inferd {
namespace {

// A CUDA or cuBLAS call that fails after the device was found is a fault of the device or of
// our sizes: reported with what failed, then the process stops (as INFERD_CHECK does).
void check_cuda(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  std::fprintf(stderr, "inferd: CUDA %s failed: %s\n", what, cudaGetErrorString(e));
  std::abort();
}

void check_cublas(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return;
  std::fprintf(stderr, "inferd: cuBLAS %s failed: status %d\n", what, static_cast<int>(s));
  std::abort();
}

// Device memory, freed with the object.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes) : size_(bytes) {
    if (bytes != 0) check_cuda(cudaMalloc(&ptr_, bytes), "cudaMalloc");
  }
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), size_(o.size_) {
    o.ptr_ = nullptr;
    o.size_ = 0;
  }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      release();
      ptr_ = o.ptr_;
      size_ = o.size_;
      o.ptr_ = nullptr;
      o.size_ = 0;
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { release(); }

  // At least `bytes` (the contents are lost when it grows); never shrinks, so a warmed-up step
  // allocates nothing.
  void reserve(size_t bytes) {
    if (bytes > size_) *this = DeviceBuffer(bytes);
  }
  template <class T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  void* get() const { return ptr_; }

 private:
  void release() {
    if (ptr_ != nullptr) cudaFree(ptr_);
    ptr_ = nullptr;
  }
  void* ptr_ = nullptr;
  size_t size_ = 0;
};

enum class GpuFormat { kF32, kF16, kBF16, kQ8_0 };

struct DeviceMatrix {
  GpuFormat format = GpuFormat::kF32;
  int64_t rows = 0, cols = 0;
  DeviceBuffer data;
};

struct CudaLinear final : LinearWeights {
  std::vector<DeviceMatrix> parts;
  bool swiglu = false;
};

size_t kv_element_bytes(KvDType d) {
  switch (d) {
    case KvDType::kF32: return 4;
    case KvDType::kF16:
    case KvDType::kBF16: return 2;
    case KvDType::kInt8:
    case KvDType::kFp8: return 1;
  }
  return 4;
}

class CudaBackend final : public CpuKernelOps {
 public:
  CudaBackend(ThreadPool& pool, cudaStream_t stream, cublasHandle_t cublas)
      : CpuKernelOps(active_isa(), pool), stream_(stream), cublas_(cublas) {}
  ~CudaBackend() override {
    cublasDestroy(cublas_);
    cudaStreamDestroy(stream_);
  }
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  BackendKind kind() const override { return BackendKind::kCuda; }

  std::unique_ptr<LinearWeights> prepare_linear(std::span<const TensorView* const> parts,
                                                bool swiglu) override {
    auto w = std::make_unique<CudaLinear>();
    w->swiglu = swiglu;
    for (const TensorView* p : parts) w->parts.push_back(upload(*p));
    return w;
  }

  void linear(const float* x, int64_t tokens, int64_t k, const float* norm_weight, float eps,
              const LinearWeights& weights, std::span<const LinearOutput> outputs) override {
    const auto* w = dynamic_cast<const CudaLinear*>(&weights);
    INFERD_CHECK_MSG(w != nullptr, "CUDA backend: weights prepared by another backend");
    if (tokens == 0) return;
    const float* in = to_device(x_, x, tokens * k);
    if (norm_weight != nullptr) {
      const float* nw = to_device(norm_, norm_weight, k);
      normed_.reserve(static_cast<size_t>(tokens * k) * sizeof(float));
      cuda::rms_norm(in, nw, normed_.as<float>(), tokens, k, eps, stream_);
      in = normed_.as<float>();
    }
    if (w->swiglu) {
      const DeviceMatrix& gate = w->parts[0];
      const DeviceMatrix& up = w->parts[1];
      const int64_t rows = gate.rows;
      reserve_outputs(2, tokens * rows);
      gemm(gate, in, tokens, y_[0].as<float>(), rows);
      gemm(up, in, tokens, y_[1].as<float>(), rows);
      if (outputs.size() == 1) {
        cuda::silu_mul(y_[0].as<float>(), y_[1].as<float>(), y_[0].as<float>(), tokens * rows, stream_);
        download(y_[0].as<float>(), rows, tokens, outputs[0]);
      } else {
        INFERD_CHECK(outputs.size() == 2);
        download(y_[0].as<float>(), rows, tokens, outputs[0]);
        download(y_[1].as<float>(), rows, tokens, outputs[1]);
      }
    } else {
      INFERD_CHECK(outputs.size() == w->parts.size());
      int64_t most = 0;
      for (const DeviceMatrix& p : w->parts) most = std::max(most, p.rows);
      reserve_outputs(w->parts.size(), tokens * most);
      for (size_t i = 0; i < w->parts.size(); ++i) {
        const DeviceMatrix& p = w->parts[i];
        float* y = y_[i].as<float>();
        gemm(p, in, tokens, y, p.rows);
        if (outputs[i].bias != nullptr)
          cuda::add_bias(y, p.rows, p.rows, tokens, to_device(bias_, outputs[i].bias, p.rows), stream_);
        download(y, p.rows, tokens, outputs[i]);
      }
    }
    check_cuda(cudaStreamSynchronize(stream_), "linear");
  }

  void grouped_linear(std::span<const LinearGroup> groups) override {
    for (const LinearGroup& g : groups) linear(g.x, g.tokens, g.k, nullptr, 0.0f, *g.w, {&g.out, 1});
  }

  void attention(const float* q, std::span<const AttentionSequence> sequences,
                 std::span<const int32_t> token_sequence, const KvLayerView& kv, const AttentionShape& shape,
                 float* out) override {
    // The device kernel reads K in rows (the engine makes this backend's caches so); a grouped K
    // from elsewhere takes the CPU kernel.
    if (kv.key_groups) return paged_attention(q, sequences, token_sequence, kv, shape, out, pool_, isa_);
    for (const AttentionSequence& s : sequences) {
      if (s.window > 0 || s.evicted > 0 || s.sink_q != nullptr)  // StreamingLLM windows: the CPU kernel
        return paged_attention(q, sequences, token_sequence, kv, shape, out, pool_, isa_);
    }
    const int64_t tokens = static_cast<int64_t>(token_sequence.size());
    if (tokens == 0) return;
    const int64_t kv_dim = shape.num_kv_heads * shape.head_dim;
    const bool scaled = kv_dtype_is_8bit(kv.dtype);
    const size_t block_bytes = static_cast<size_t>(kv.block_size * kv_dim) * kv_element_bytes(kv.dtype);
    const size_t scale_bytes = static_cast<size_t>(kv.block_size * shape.num_kv_heads) * sizeof(float);
    // The blocks the tables name, each once, in the order first named: compact ids (compact_ is
    // indexed by block id, -1 where unnamed; it grows to the largest id and stays).
    table_.clear();
    table_start_.clear();
    gathered_.clear();
    for (const AttentionSequence& s : sequences) {
      table_start_.push_back(static_cast<int64_t>(table_.size()));
      const int64_t used = (s.context_len + kv.block_size - 1) / kv.block_size;
      for (int64_t j = 0; j < used; ++j) {
        const int32_t b = s.block_table[static_cast<size_t>(j)];
        if (static_cast<size_t>(b) >= compact_.size()) compact_.resize(static_cast<size_t>(b) + 1, -1);
        int32_t& id = compact_[static_cast<size_t>(b)];
        if (id < 0) {
          id = static_cast<int32_t>(gathered_.size());
          gathered_.push_back(b);
        }
        table_.push_back(id);
      }
    }
    const size_t nblocks = gathered_.size();
    key_stage_.resize(nblocks * block_bytes);
    value_stage_.resize(nblocks * block_bytes);
    if (scaled) {
      key_scale_stage_.resize(nblocks * scale_bytes / sizeof(float));
      value_scale_stage_.resize(nblocks * scale_bytes / sizeof(float));
    }
    for (size_t i = 0; i < nblocks; ++i) {
      const auto b = static_cast<size_t>(gathered_[i]);
      std::memcpy(key_stage_.data() + i * block_bytes,
                  static_cast<const std::byte*>(kv.key) + b * block_bytes, block_bytes);
      std::memcpy(value_stage_.data() + i * block_bytes,
                  static_cast<const std::byte*>(kv.value) + b * block_bytes, block_bytes);
      if (scaled) {
        std::memcpy(reinterpret_cast<std::byte*>(key_scale_stage_.data()) + i * scale_bytes,
                    reinterpret_cast<const std::byte*>(kv.key_scale) + b * scale_bytes, scale_bytes);
        std::memcpy(reinterpret_cast<std::byte*>(value_scale_stage_.data()) + i * scale_bytes,
                    reinterpret_cast<const std::byte*>(kv.value_scale) + b * scale_bytes, scale_bytes);
      }
    }
    for (int32_t b : gathered_) compact_[static_cast<size_t>(b)] = -1;
    seq_.resize(static_cast<size_t>(tokens));
    pos_.resize(static_cast<size_t>(tokens));
    for (int64_t t = 0; t < tokens; ++t) {
      const int32_t si = token_sequence[static_cast<size_t>(t)];
      const AttentionSequence& s = sequences[static_cast<size_t>(si)];
      seq_[static_cast<size_t>(t)] = si;
      pos_[static_cast<size_t>(t)] = s.context_len - s.num_queries + (t - s.query_start);
    }
    cuda::AttentionArgs a;
    const int64_t q_elems = tokens * shape.num_heads * shape.head_dim;
    a.q = to_device(x_, q, q_elems);
    attn_out_.reserve(static_cast<size_t>(q_elems) * sizeof(float));
    a.out = attn_out_.as<float>();
    a.seq = to_device(seq_dev_, seq_.data(), tokens);
    a.pos = to_device(pos_dev_, pos_.data(), tokens);
    a.table = to_device(table_dev_, table_.data(), static_cast<int64_t>(table_.size()));
    a.table_start =
        to_device(table_start_dev_, table_start_.data(), static_cast<int64_t>(table_start_.size()));
    a.key = to_device(key_dev_, key_stage_.data(), static_cast<int64_t>(key_stage_.size()));
    a.value = to_device(value_dev_, value_stage_.data(), static_cast<int64_t>(value_stage_.size()));
    if (scaled) {
      a.key_scale =
          to_device(key_scale_dev_, key_scale_stage_.data(), static_cast<int64_t>(key_scale_stage_.size()));
      a.value_scale = to_device(value_scale_dev_, value_scale_stage_.data(),
                                static_cast<int64_t>(value_scale_stage_.size()));
    }
    a.kv_dtype = static_cast<int>(kv.dtype);
    a.tokens = tokens;
    a.block_size = kv.block_size;
    a.num_heads = shape.num_heads;
    a.num_kv_heads = shape.num_kv_heads;
    a.head_dim = shape.head_dim;
    a.scale = shape.scale;
    INFERD_CHECK_MSG(shape.head_dim <= 256, "CUDA attention: head_dim above 256");
    cuda::paged_attention(a, stream_);
    check_cuda(cudaMemcpyAsync(out, a.out, static_cast<size_t>(q_elems) * sizeof(float),
                               cudaMemcpyDeviceToHost, stream_),
               "attention download");
    check_cuda(cudaStreamSynchronize(stream_), "attention");
  }

  void rms_norm(const float* x, const float* weight, float* y, int64_t rows, int64_t n, float eps) override {
    if (rows == 0) return;
    const float* dx = to_device(x_, x, rows * n);
    const float* dw = to_device(norm_, weight, n);
    normed_.reserve(static_cast<size_t>(rows * n) * sizeof(float));
    cuda::rms_norm(dx, dw, normed_.as<float>(), rows, n, eps, stream_);
    from_device(y, normed_.as<float>(), rows * n);
  }

  // The device computes its own angles from pos (cos_sin, the host's copy of them, is not needed).
  void rope_qk(float* q, int64_t num_q_heads, float* k, int64_t num_kv_heads, int64_t head_dim, int64_t pos,
               const float* inv_freq, RopePairing pairing, float scale, const float* /*cos_sin*/) override {
    float* dq = to_device(x_, q, num_q_heads * head_dim);
    float* dk = to_device(k_, k, num_kv_heads * head_dim);
    const int64_t* dpos = to_device(pos_dev_, &pos, 1);
    const float* dfreq = to_device(norm_, inv_freq, head_dim / 2);
    cuda::rope_qk(dq, num_q_heads, dk, num_kv_heads, head_dim, 1, dpos, dfreq,
                  pairing == RopePairing::kNeox ? 0 : 1, scale, stream_);
    check_cuda(cudaMemcpyAsync(q, dq, static_cast<size_t>(num_q_heads * head_dim) * sizeof(float),
                               cudaMemcpyDeviceToHost, stream_),
               "rope download");
    from_device(k, dk, num_kv_heads * head_dim);
  }

  void silu_mul(const float* gate, const float* up, float* out, int64_t n) override {
    if (n == 0) return;
    const float* dg = to_device(x_, gate, n);
    const float* du = to_device(k_, up, n);
    normed_.reserve(static_cast<size_t>(n) * sizeof(float));
    cuda::silu_mul(dg, du, normed_.as<float>(), n, stream_);
    from_device(out, normed_.as<float>(), n);
  }

  // LoRA updates and the embedding lookup: CpuKernelOps' CPU kernels in this version.

 private:
  static DeviceMatrix upload(const TensorView& t) {
    DeviceMatrix m;
    m.rows = t.num_rows();
    m.cols = t.row_length();
    const bool as_stored =
        t.row_scale == nullptr && (t.dtype == DType::kF32 || t.dtype == DType::kF16 ||
                                   t.dtype == DType::kBF16 || (t.dtype == DType::kQ8_0 && m.cols % 32 == 0));
    if (as_stored) {
      m.format = t.dtype == DType::kF32    ? GpuFormat::kF32
                 : t.dtype == DType::kF16  ? GpuFormat::kF16
                 : t.dtype == DType::kBF16 ? GpuFormat::kBF16
                                           : GpuFormat::kQ8_0;
      const size_t bytes = static_cast<size_t>(m.rows) * t.row_bytes();
      m.data = DeviceBuffer(bytes);
      check_cuda(cudaMemcpy(m.data.get(), t.data, bytes, cudaMemcpyHostToDevice), "weight upload");
      return m;
    }
    // Every other format: its exact values in f32, expanded once.
    std::vector<float> rows(static_cast<size_t>(m.rows * m.cols));
    for (int64_t r = 0; r < m.rows; ++r) dequantize_tensor_row(t, r, rows.data() + r * m.cols);
    m.format = GpuFormat::kF32;
    m.data = DeviceBuffer(rows.size() * sizeof(float));
    check_cuda(cudaMemcpy(m.data.get(), rows.data(), rows.size() * sizeof(float), cudaMemcpyHostToDevice),
               "weight upload");
    return m;
  }

  // y [tokens][ldy] (column-major: rows x tokens) = x [tokens][cols] w^T.
  void gemm(const DeviceMatrix& w, const float* x, int64_t tokens, float* y, int64_t ldy) {
    const int m = static_cast<int>(w.rows), n = static_cast<int>(tokens), k = static_cast<int>(w.cols);
    const float one = 1.0f, zero = 0.0f;
    switch (w.format) {
      case GpuFormat::kF32:
        check_cublas(cublasSgemm(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &one, w.data.as<float>(), k, x,
                                 k, &zero, y, static_cast<int>(ldy)),
                     "SGEMM");
        return;
      case GpuFormat::kF16:
      case GpuFormat::kBF16: {
        const bool f16 = w.format == GpuFormat::kF16;
        half_x_.reserve(static_cast<size_t>(tokens * w.cols) * 2);
        if (f16) {
          cuda::to_f16(x, half_x_.get(), tokens * w.cols, stream_);
        } else {
          cuda::to_bf16(x, half_x_.get(), tokens * w.cols, stream_);
        }
        const cudaDataType t = f16 ? CUDA_R_16F : CUDA_R_16BF;
        check_cublas(cublasGemmEx(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &one, w.data.get(), t, k,
                                  half_x_.get(), t, k, &zero, y, CUDA_R_32F, static_cast<int>(ldy),
                                  CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                     "GemmEx");
        return;
      }
      case GpuFormat::kQ8_0:
        xq_.reserve(static_cast<size_t>(tokens * w.cols));
        xd_.reserve(static_cast<size_t>(tokens * w.cols / 32) * sizeof(float));
        cuda::q8_0_matmul(w.data.get(), w.rows, w.cols, x, tokens, xq_.as<int8_t>(), xd_.as<float>(), y, ldy,
                          stream_);
        return;
    }
  }

  void reserve_outputs(size_t count, int64_t elems) {
    if (y_.size() < count) y_.resize(count);
    for (size_t i = 0; i < count; ++i) y_[i].reserve(static_cast<size_t>(elems) * sizeof(float));
  }

  // Copies n values of host memory into `buf` (grown as needed) on the stream.
  template <class T>
  T* to_device(DeviceBuffer& buf, const T* host, int64_t n) {
    buf.reserve(static_cast<size_t>(n) * sizeof(T));
    check_cuda(
        cudaMemcpyAsync(buf.get(), host, static_cast<size_t>(n) * sizeof(T), cudaMemcpyHostToDevice, stream_),
        "upload");
    return buf.as<T>();
  }

  // Copies n floats back and waits for the stream.
  void from_device(float* host, const float* dev, int64_t n) {
    check_cuda(
        cudaMemcpyAsync(host, dev, static_cast<size_t>(n) * sizeof(float), cudaMemcpyDeviceToHost, stream_),
        "download");
    check_cuda(cudaStreamSynchronize(stream_), "synchronize");
  }

  // rows x tokens (device, rows apart) into out.y (out.ld apart).
  void download(const float* dev, int64_t rows, int64_t tokens, const LinearOutput& out) {
    check_cuda(cudaMemcpy2DAsync(out.y, static_cast<size_t>(out.ld) * sizeof(float), dev,
                                 static_cast<size_t>(rows) * sizeof(float),
                                 static_cast<size_t>(rows) * sizeof(float), static_cast<size_t>(tokens),
                                 cudaMemcpyDeviceToHost, stream_),
               "output download");
  }

  cudaStream_t stream_;
  cublasHandle_t cublas_;
  // Device scratch, grown to the largest step and kept.
  DeviceBuffer x_, k_, norm_, bias_, normed_, half_x_, xq_, xd_, attn_out_;
  std::vector<DeviceBuffer> y_;
  DeviceBuffer seq_dev_, pos_dev_, table_dev_, table_start_dev_, key_dev_, value_dev_, key_scale_dev_,
      value_scale_dev_;
  // Host staging for attention.
  std::vector<int32_t> compact_, gathered_, table_, seq_;
  std::vector<int64_t> table_start_, pos_;
  std::vector<std::byte> key_stage_, value_stage_;
  std::vector<float> key_scale_stage_, value_scale_stage_;
};

}  // namespace

Status cuda_backend_available() {
  int devices = 0;
  const cudaError_t e = cudaGetDeviceCount(&devices);
  if (e != cudaSuccess) return unsupported(std::string("no CUDA device: ") + cudaGetErrorString(e));
  if (devices == 0) return unsupported("no CUDA device: cudaGetDeviceCount found none");
  return Status::ok();
}

Expected<std::unique_ptr<Backend>> make_cuda_backend(ThreadPool& pool) {
  if (Status s = cuda_backend_available(); !s.is_ok()) return s;
  check_cuda(cudaSetDevice(0), "cudaSetDevice");
  cudaStream_t stream = nullptr;
  check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  cublasHandle_t cublas = nullptr;
  if (cublasCreate(&cublas) != CUBLAS_STATUS_SUCCESS) {
    cudaStreamDestroy(stream);
    return unsupported("no CUDA device: cublasCreate failed");
  }
  check_cublas(cublasSetStream(cublas, stream), "cublasSetStream");
  return std::unique_ptr<Backend>(std::make_unique<CudaBackend>(pool, stream, cublas));
}

}  // namespace inferd
