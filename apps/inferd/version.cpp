#include "version.h"

#include "inferd_build_version.h"

namespace inferd {

std::string build_version() {
  return std::string(INFERD_VERSION) + " (commit " + INFERD_COMMIT + ")";
}

}  // namespace inferd
