// Whole-file helpers: reading a text file, and writing a file atomically (to a temporary name,
// then renamed) so a reader never sees half of it. Used by the loaders and the model writers.
#pragma once

#include <functional>
#include <ostream>
#include <string>

#include "common/status.h"

namespace inferd {

// The file's bytes; an error names the path.
Expected<std::string> read_text_file(const std::string& path);

// Calls write(stream) on `path`.tmp, then renames it to `path`; errors name the file.
Status write_file_atomically(const std::string& path, const std::function<void(std::ostream&)>& write);

}  // namespace inferd
