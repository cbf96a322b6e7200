#include "common/files.h"

#include <filesystem>
#include <fstream>
#include <sstream>

namespace inferd {

Expected<std::string> read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return io_error(path + ": cannot open");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

Status write_file_atomically(const std::string& path, const std::function<void(std::ostream&)>& write) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) return io_error("cannot write " + tmp);
    write(f);
    f.flush();
    if (!f) return io_error("write failed: " + tmp);
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) return io_error("cannot rename " + tmp + " to " + path + ": " + ec.message());
  return Status::ok();
}

}  // namespace inferd
