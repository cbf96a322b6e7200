#include "kernels/onednn_matmul.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "common/half.h"
#include "kernels/cpu_isa.h"
#include "kernels/ops.h"
#include "tensor/dequantize.h"

#if defined(INFERD_HAVE_ONEDNN)
#include <omp.h>

#include <dnnl.hpp>
#endif

namespace inferd {

#if defined(INFERD_HAVE_ONEDNN)

namespace {

using dnnl::memory;

dnnl::engine& cpu_engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

// oneDNN on our pool's threads runs single-threaded (OpenMP's team size is per thread).
void one_openmp_thread() {
  thread_local bool done = false;
  if (!done) {
    omp_set_num_threads(1);
    done = true;
  }
}

}  // namespace

struct OneDnnWeight::Impl {
  struct Slice {
    int64_t first = 0;  // first output row (SwiGLU: first gate / up row)
    int64_t rows = 0;   // output rows (SwiGLU: of gate, and as many of up)
    int64_t width = 0;  // the slice's GEMM columns: rows, or 2 * rows for SwiGLU
    dnnl::matmul primitive;
    memory weights;
    memory scratchpad;
    std::unique_ptr<dnnl::stream> stream;
    mutable std::vector<float> out;  // [tokens, width]
  };
  int64_t cols = 0;
  bool bf16 = false;
  bool swiglu = false;
  std::vector<int64_t> part_rows;
  std::vector<Slice> slices;
  mutable std::vector<uint16_t> x_bf16;
};

bool OneDnnWeight::available() {
  return true;
}

Expected<OneDnnWeight> OneDnnWeight::create(std::span<const TensorView* const> parts, bool swiglu,
                                            int num_slices) {
  INFERD_CHECK(!parts.empty() && num_slices >= 1);
  const TensorView& first = *parts[0];
  for (const TensorView* p : parts) {
    if (!supports(p->dtype) || p->dtype != first.dtype || p->num_dims != 2 ||
        p->row_length() != first.row_length()) {
      return invalid_argument(p->name +
                              ": oneDNN takes matrices of one float dtype (F32, F16, BF16) and row length");
    }
  }
  if (swiglu && (parts.size() != 2 || parts[0]->num_rows() != parts[1]->num_rows()))
    return invalid_argument(first.name + ": SwiGLU needs gate and up of one shape");
  OneDnnWeight w;
  w.impl_ = std::make_unique<Impl>();
  Impl& m = *w.impl_;
  m.cols = first.row_length();
  m.bf16 = first.dtype == DType::kBF16 && bf16_native();
  m.swiglu = swiglu;
  int64_t total = 0;
  for (const TensorView* p : parts) {
    m.part_rows.push_back(p->num_rows());
    total += p->num_rows();
  }
  const int64_t span = swiglu ? parts[0]->num_rows() : total;  // rows split across slices
  const memory::data_type dt = m.bf16 ? memory::data_type::bf16 : memory::data_type::f32;
  dnnl::engine& eng = cpu_engine();
  dnnl::stream load_stream(eng);
  const int64_t k = m.cols;
  for (int s = 0; s < num_slices; ++s) {
    // Slices of whole 16-row groups, as even as that allows.
    const int64_t groups = (span + 15) / 16;
    const int64_t g0 = groups * s / num_slices, g1 = groups * (s + 1) / num_slices;
    Impl::Slice slice;
    slice.first = std::min(span, g0 * 16);
    slice.rows = std::min(span, g1 * 16) - slice.first;
    if (slice.rows <= 0) continue;
    slice.width = swiglu ? 2 * slice.rows : slice.rows;
    // The slice's weight rows ([width, k]) in the compute type, row-major.
    std::vector<float> rows_f32;
    std::vector<uint16_t> rows_bf16;
    if (m.bf16) {
      rows_bf16.resize(static_cast<size_t>(slice.width * k));
    } else {
      rows_f32.resize(static_cast<size_t>(slice.width * k));
    }
    auto source_row = [&](int64_t r) -> std::pair<const TensorView*, int64_t> {
      if (swiglu) {
        return r < slice.rows ? std::make_pair(parts[0], slice.first + r)
                              : std::make_pair(parts[1], slice.first + r - slice.rows);
      }
      int64_t g = slice.first + r;
      for (const TensorView* p : parts) {
        if (g < p->num_rows()) return {p, g};
        g -= p->num_rows();
      }
      return {nullptr, 0};
    };
    for (int64_t r = 0; r < slice.width; ++r) {
      auto [t, row] = source_row(r);
      if (m.bf16) {
        std::memcpy(&rows_bf16[static_cast<size_t>(r * k)], t->row(row), static_cast<size_t>(k) * 2);
      } else {
        dequantize_tensor_row(*t, row, &rows_f32[static_cast<size_t>(r * k)]);
      }
    }
    try {
      const memory::desc src_md({DNNL_RUNTIME_DIM_VAL, k}, dt, memory::format_tag::ab);
      const memory::desc weights_any({k, slice.width}, dt, memory::format_tag::any);
      const memory::desc dst_md({DNNL_RUNTIME_DIM_VAL, slice.width}, memory::data_type::f32,
                                memory::format_tag::ab);
      // Our scratchpad, allocated once (the library's default allocates per execution).
      dnnl::primitive_attr attr;
      attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
      const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(src_md, weights_any, dst_md), attr, eng);
      slice.scratchpad = memory(pd.scratchpad_desc(), eng);
      // Our rows are [width][k] row-major: as oneDNN's [k, width] matrix that is layout "ba".
      memory user(memory::desc({k, slice.width}, dt, memory::format_tag::ba), eng,
                  m.bf16 ? static_cast<void*>(rows_bf16.data()) : static_cast<void*>(rows_f32.data()));
      slice.weights = memory(pd.weights_desc(), eng);
      dnnl::reorder(user, slice.weights).execute(load_stream, user, slice.weights);
      load_stream.wait();
      slice.primitive = dnnl::matmul(pd);
      slice.stream = std::make_unique<dnnl::stream>(eng);
    } catch (const dnnl::error& e) {
      return unsupported(first.name + ": oneDNN: " + e.what());
    }
    m.slices.push_back(std::move(slice));
  }
  return w;
}

void OneDnnWeight::run(const float* x, int64_t tokens, std::span<const QuantMatmulOutput> outputs,
                       ThreadPool& pool) const {
  const Impl& m = *impl_;
  // A SwiGLU weight with two outputs gives gate and up as they are (no silu).
  const bool raw = m.swiglu && outputs.size() == 2;
  INFERD_CHECK(raw || outputs.size() == (m.swiglu ? 1 : m.part_rows.size()));
  if (tokens == 0) return;
  const memory::data_type dt = m.bf16 ? memory::data_type::bf16 : memory::data_type::f32;
  const void* src = x;
  if (m.bf16) {
    m.x_bf16.resize(static_cast<size_t>(tokens * m.cols));
    for (size_t i = 0; i < m.x_bf16.size(); ++i) m.x_bf16[i] = f32_to_bf16(x[i]);
    src = m.x_bf16.data();
  }
  dnnl::engine& eng = cpu_engine();
  pool.parallel_for(static_cast<int64_t>(m.slices.size()), [&](int64_t begin, int64_t end) {
    one_openmp_thread();
    for (int64_t si = begin; si < end; ++si) {
      const Impl::Slice& s = m.slices[static_cast<size_t>(si)];
      s.out.resize(static_cast<size_t>(tokens * s.width));
      memory src_mem(memory::desc({tokens, m.cols}, dt, memory::format_tag::ab), eng, const_cast<void*>(src));
      memory dst_mem(memory::desc({tokens, s.width}, memory::data_type::f32, memory::format_tag::ab), eng,
                     s.out.data());
      s.primitive.execute(*s.stream, {{DNNL_ARG_SRC, src_mem},
                                      {DNNL_ARG_WEIGHTS, s.weights},
                                      {DNNL_ARG_DST, dst_mem},
                                      {DNNL_ARG_SCRATCHPAD, s.scratchpad}});
      s.stream->wait();
      // Epilogue: the slice's columns into the outputs (+ bias), or silu(gate) * up.
      for (int64_t t = 0; t < tokens; ++t) {
        const float* row = s.out.data() + t * s.width;
        if (raw) {
          std::copy_n(row, s.rows, outputs[0].y + t * outputs[0].ld + s.first);
          std::copy_n(row + s.rows, s.rows, outputs[1].y + t * outputs[1].ld + s.first);
          continue;
        }
        if (m.swiglu) {
          silu_mul(row, row + s.rows, outputs[0].y + t * outputs[0].ld + s.first, s.rows);
          continue;
        }
        int64_t part_first = 0;
        for (size_t p = 0; p < m.part_rows.size(); ++p) {
          const int64_t lo = std::max(part_first, s.first),
                        hi = std::min(part_first + m.part_rows[p], s.first + s.rows);
          const QuantMatmulOutput& o = outputs[p];
          for (int64_t g = lo; g < hi; ++g) {
            const int64_t r = g - part_first;
            o.y[t * o.ld + r] = row[g - s.first] + (o.bias != nullptr ? o.bias[r] : 0.0f);
          }
          part_first += m.part_rows[p];
        }
      }
    }
  });
}

bool OneDnnWeight::bf16_native() {
  return detected_isa() >= Isa::kAvx512;
}

#else  // !INFERD_HAVE_ONEDNN

bool OneDnnWeight::bf16_native() {
  return false;
}

struct OneDnnWeight::Impl {};

bool OneDnnWeight::available() {
  return false;
}

Expected<OneDnnWeight> OneDnnWeight::create(std::span<const TensorView* const>, bool, int) {
  return unsupported(
      "this build of inferd has no oneDNN (scripts/setup installs libdnnl-dev and the OpenCL "
      "headers and loader its CMake config needs; then rebuild)");
}

void OneDnnWeight::run(const float*, int64_t, std::span<const QuantMatmulOutput>, ThreadPool&) const {}

#endif

OneDnnWeight::OneDnnWeight() = default;
OneDnnWeight::~OneDnnWeight() = default;
OneDnnWeight::OneDnnWeight(OneDnnWeight&&) noexcept = default;
OneDnnWeight& OneDnnWeight::operator=(OneDnnWeight&&) noexcept = default;

}  // namespace inferd
