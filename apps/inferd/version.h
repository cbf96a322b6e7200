// The version and the commit this binary was built from (cmake/build_version.cmake), for
// `inferd --version` and the server's KServe v2 metadata.
#pragma once

#include <string>

namespace inferd {

// "0.1.0 (commit v0.1-12-gabcdef012345)": the project version and `git describe` of the build.
std::string build_version();

}  // namespace inferd
