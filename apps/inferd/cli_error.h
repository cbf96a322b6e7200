// How every inferd subcommand reports an error: one line on stderr, exit code 1.
#pragma once

#include <cstdio>
#include <string>

namespace inferd {

inline int fail(const std::string& message) {
  std::fprintf(stderr, "inferd: error: %s\n", message.c_str());
  return 1;
}

}  // namespace inferd
