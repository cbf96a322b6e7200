#include "formats/safetensors_writer.h"

#include "common/files.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

namespace inferd {

void SafetensorsWriter::set_metadata(const std::string& key, const std::string& value) {
  metadata_[key] = value;
}

void SafetensorsWriter::add_tensor(const std::string& name, DType dtype, std::vector<int64_t> shape,
                                   std::vector<std::byte> data) {
  tensors_[name] = {dtype, std::move(shape), std::move(data)};
}

Status SafetensorsWriter::write(const std::string& path) const {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  nlohmann::ordered_json meta = nlohmann::ordered_json::object();
  meta["format"] = "pt";
  for (const auto& [k, v] : metadata_) meta[k] = v;
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors_) {
    const DTypeInfo& info = dtype_info(t.dtype);
    std::vector<int64_t> shape = t.shape;
    std::string dtype(info.name);
    if (info.block_values > 1) {
      // Whole blocks per row: [rows, row bytes] of U8.
      shape.back() = shape.back() / info.block_values * info.block_bytes;
      dtype = "U8";
      meta["inferd.block_type." + name] = std::string(info.name);
    }
    nlohmann::ordered_json e;
    e["dtype"] = dtype;
    e["shape"] = shape;
    e["data_offsets"] = {offset, offset + t.data.size()};
    header[name] = e;
    offset += t.data.size();
  }
  nlohmann::ordered_json full = nlohmann::ordered_json::object();
  full["__metadata__"] = meta;
  for (auto& [k, v] : header.items()) full[k] = v;
  std::string text = full.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data starts 8-byte aligned
  return write_file_atomically(path, [&](std::ostream& f) {
    const uint64_t n = text.size();
    f.write(reinterpret_cast<const char*>(&n), 8);
    f.write(text.data(), static_cast<std::streamsize>(text.size()));
    for (const auto& [name, t] : tensors_)
      f.write(reinterpret_cast<const char*>(t.data.data()), static_cast<std::streamsize>(t.data.size()));
  });
}

}  // namespace inferd
