// The CUDA backend's stand-in while CUDA is not compiled in: kernels/cuda/cuda_backend.cpp
// replaces this file when the build enables it (-DINFERD_CUDA=ON). Core code asks for it like any
// backend and gets this error, so it carries no #ifdef.
#include "kernels/backend.h"

namespace inferd {

Status cuda_backend_available() {
  return unsupported("not compiled with CUDA (build with -DINFERD_CUDA=ON, which needs nvcc and cuBLAS)");
}

Expected<std::unique_ptr<Backend>> make_cuda_backend(ThreadPool&) {
  return cuda_backend_available();
}

}  // namespace inferd
