#include "common/check.h"

#include <cstdio>
#include <cstdlib>

namespace inferd::detail {

// Straight to stderr, not through the logger: this is the path to abort(), which must not depend
// on anything else still working.
void check_failed(const char* expr, const char* file, int line, const char* message) {
  std::fprintf(stderr, "inferd: internal error: check failed: %s at %s:%d %s\n", expr, file, line, message);
  std::fflush(stderr);
  std::abort();
}

}  // namespace inferd::detail
