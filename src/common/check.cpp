#include "common/check.h"

#include <cstdio>
#include <cstdlib>

namespace inferd::detail {

void check_failed(const char* expr, const char* file, int line, const char* message) {
  std::fprintf(stderr, "inferd: internal error: check failed: %s at %s:%d %s\n", expr, file, line, message);
  std::fflush(stderr);
  std::abort();
}

}  // namespace inferd::detail
