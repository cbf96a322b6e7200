#include "tools/hf_directory.h"

#include <algorithm>
#include <fstream>

#include "common/files.h"

namespace inferd {

namespace fs = std::filesystem;

Expected<HfDirectory> read_hf_directory(const fs::path& input, const fs::path& output) {
  std::error_code ec;
  if (fs::exists(output, ec) && !fs::is_directory(output, ec))
    return invalid_argument(output.string() + ": a Hugging Face directory is written as a directory");
  if (fs::exists(output, ec) && fs::equivalent(input, output, ec))
    return invalid_argument(output.string() + ": the output directory must differ from the input");
  INFERD_ASSIGN_OR_RETURN(std::string config_text, read_text_file((input / "config.json").string()));
  HfDirectory d;
  d.config = nlohmann::json::parse(config_text, nullptr, false);
  if (d.config.is_discarded() || !d.config.is_object())
    return corrupt_file((input / "config.json").string() + ": not a JSON object");
  for (const auto& entry : fs::directory_iterator(input)) {
    if (entry.path().extension() != ".safetensors") continue;
    INFERD_ASSIGN_OR_RETURN(SafetensorsFile f, SafetensorsFile::open(entry.path().string()));
    d.shards.push_back(std::move(f));
  }
  if (d.shards.empty()) return not_found(input.string() + ": no .safetensors files");
  for (const auto& s : d.shards)
    for (const TensorView& t : s.tensors()) d.tensors.push_back(&t);
  std::sort(d.tensors.begin(), d.tensors.end(), [](auto* a, auto* b) { return a->name < b->name; });
  return d;
}

Status write_hf_directory(const fs::path& input, const fs::path& output, const nlohmann::json& config,
                          const SafetensorsWriter& tensors) {
  std::error_code ec;
  fs::create_directories(output, ec);
  if (ec) return io_error("cannot create " + output.string() + ": " + ec.message());
  for (const auto& entry : fs::directory_iterator(input)) {
    const std::string name = entry.path().filename().string();
    if (!entry.is_regular_file() || entry.path().extension() == ".safetensors" ||
        name == "model.safetensors.index.json" || name == "config.json")
      continue;
    fs::copy_file(entry.path(), output / name, fs::copy_options::overwrite_existing, ec);
    if (ec) return io_error("cannot copy " + entry.path().string() + ": " + ec.message());
  }
  {
    std::ofstream f(output / "config.json", std::ios::trunc);
    f << config.dump(2) << "\n";
    if (!f) return io_error("cannot write " + (output / "config.json").string());
  }
  fs::remove(output / "model.safetensors.index.json", ec);
  return tensors.write((output / "model.safetensors").string());
}

}  // namespace inferd
