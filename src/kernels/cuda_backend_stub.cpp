// The CUDA backend's stand-in while CUDA is not compiled in: the CUDA backend itself will live
// under kernels/cuda/ and replace this file when the build enables it. Core code asks for it
// like any backend and gets this error, so it carries no #ifdef.
#include "kernels/backend.h"

namespace inferd {

Expected<std::unique_ptr<Backend>> make_cuda_backend(ThreadPool&) {
  return unsupported("not compiled with CUDA (the CUDA backend is not part of this build)");
}

}  // namespace inferd
