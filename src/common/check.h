// INFERD_CHECK: aborts with file and line when an internal invariant is broken.
// For bugs only; anything a user or a file can cause returns a Status instead.
#pragma once

namespace inferd::detail {
[[noreturn]] void check_failed(const char* expr, const char* file, int line, const char* message);
}  // namespace inferd::detail

#define INFERD_CHECK(cond)                                                      \
  do {                                                                          \
    if (!(cond)) ::inferd::detail::check_failed(#cond, __FILE__, __LINE__, ""); \
  } while (0)

#define INFERD_CHECK_MSG(cond, msg)                                                \
  do {                                                                             \
    if (!(cond)) ::inferd::detail::check_failed(#cond, __FILE__, __LINE__, (msg)); \
  } while (0)
