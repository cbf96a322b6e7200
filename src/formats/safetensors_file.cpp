#include "formats/safetensors_file.h"

#include <cstring>
#include <nlohmann/json.hpp>

#include "formats/row_scales.h"

namespace inferd {

namespace {

constexpr uint64_t kMaxHeaderBytes = 100 << 20;  // the format's own limit
constexpr const char* kBlockTypePrefix = "inferd.block_type.";

std::optional<DType> dtype_from_name(const std::string& s) {
  if (s == "F32") return DType::kF32;
  if (s == "F16") return DType::kF16;
  if (s == "BF16") return DType::kBF16;
  if (s == "I8") return DType::kI8;
  if (s == "F8_E4M3") return DType::kF8_E4M3;
  return std::nullopt;
}

// A block-quantized dtype (GGUF's or inferd's) by its name, e.g. "Q8_0", "Q4_G128".
std::optional<DType> block_dtype_from_name(const std::string& s) {
  for (int i = 0;; ++i) {
    const auto d = static_cast<DType>(i);
    const DTypeInfo& info = dtype_info(d);
    if (info.name == s) return info.block_values > 1 ? std::optional<DType>(d) : std::nullopt;
    if (d == DType::kLast) return std::nullopt;
  }
}

}  // namespace

Expected<SafetensorsFile> SafetensorsFile::parse(const std::string& name, const std::byte* data,
                                                 size_t size) {
  auto fail = [&](const std::string& what) { return corrupt_file(name + ": " + what); };
  if (size < 8) return fail("file too short for a safetensors header");
  uint64_t header_len = 0;
  std::memcpy(&header_len, data, 8);
  if (header_len > kMaxHeaderBytes || header_len > size - 8) {
    return fail("header length " + std::to_string(header_len) + " exceeds file size");
  }
  const char* header = reinterpret_cast<const char*>(data + 8);
  auto json = nlohmann::json::parse(header, header + header_len, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded() || !json.is_object()) return fail("header is not a JSON object");

  // inferd's block formats travel as U8 [rows, row bytes], named in the header's metadata.
  std::map<std::string, DType> block_types;
  if (auto meta = json.find("__metadata__"); meta != json.end() && meta->is_object()) {
    for (auto& [key, value] : meta->items()) {
      if (key.rfind(kBlockTypePrefix, 0) != 0 || !value.is_string()) continue;
      const std::optional<DType> bt = block_dtype_from_name(value.get<std::string>());
      if (!bt)
        return fail("metadata '" + key + "' names unknown block type '" + value.get<std::string>() + "'");
      block_types.emplace(key.substr(std::string_view(kBlockTypePrefix).size()), *bt);
    }
  }

  SafetensorsFile file;
  file.name_ = name;
  const size_t data_start = 8 + static_cast<size_t>(header_len);
  const size_t data_size = size - data_start;
  for (auto& [key, entry] : json.items()) {
    if (key == "__metadata__") continue;
    if (!entry.is_object()) return fail("tensor '" + key + "' entry is not an object");
    auto dt = entry.find("dtype");
    auto shape = entry.find("shape");
    auto offsets = entry.find("data_offsets");
    if (dt == entry.end() || !dt->is_string() || shape == entry.end() || !shape->is_array() ||
        offsets == entry.end() || !offsets->is_array() || offsets->size() != 2) {
      return fail("tensor '" + key + "' needs dtype, shape and data_offsets [begin, end]");
    }
    auto dtype = dtype_from_name(dt->get<std::string>());
    const auto block_type = block_types.find(key);
    const bool blocks = block_type != block_types.end();
    if (blocks) {
      if (dt->get<std::string>() != "U8")
        return fail("block-typed tensor '" + key + "' must be stored as U8");
      dtype = block_type->second;
    }
    if (!dtype) {
      return Status(StatusCode::kUnsupported, name + ": tensor '" + key + "' has unsupported dtype " +
                                                  dt->get<std::string>() +
                                                  " (F32, F16, BF16, I8, F8_E4M3 supported)");
    }
    TensorView v;
    v.name = key;
    v.dtype = *dtype;
    if (shape->size() > 4) return fail("tensor '" + key + "' has more than 4 dimensions");
    v.num_dims = static_cast<int>(shape->size());
    uint64_t count = 1;
    for (size_t i = 0; i < shape->size(); ++i) {
      const auto& d = (*shape)[i];
      if (!d.is_number_unsigned() || d.get<uint64_t>() > (uint64_t{1} << 40)) {
        return fail("tensor '" + key + "' has an invalid dimension");
      }
      const uint64_t n = d.get<uint64_t>();
      if (n != 0 && count > (uint64_t{1} << 50) / n) return fail("tensor '" + key + "' is too large");
      count *= n;
      v.shape[i] = static_cast<int64_t>(n);
    }
    if (!(*offsets)[0].is_number_unsigned() || !(*offsets)[1].is_number_unsigned()) {
      return fail("tensor '" + key + "' data_offsets must be unsigned integers");
    }
    const uint64_t begin = (*offsets)[0].get<uint64_t>();
    const uint64_t end = (*offsets)[1].get<uint64_t>();
    uint64_t expected = count * static_cast<uint64_t>(dtype_info(*dtype).block_bytes);
    if (blocks) {
      // [rows, row bytes] of whole blocks: the view's rows hold block_values per block_bytes.
      const DTypeInfo& info = dtype_info(*dtype);
      const int64_t row_bytes = v.num_dims == 0 ? 0 : v.shape[static_cast<size_t>(v.num_dims - 1)];
      if (v.num_dims == 0 || row_bytes % info.block_bytes != 0) {
        return fail("tensor '" + key + "' rows are not whole " + std::string(info.name) + " blocks");
      }
      v.shape[static_cast<size_t>(v.num_dims - 1)] = row_bytes / info.block_bytes * info.block_values;
      expected = count;
    }
    if (end < begin || end > data_size) {
      return fail("tensor '" + key + "' data [" + std::to_string(begin) + ", " + std::to_string(end) +
                  ") runs past end of file");
    }
    if (end - begin != expected) {
      return fail("tensor '" + key + "' has " + std::to_string(end - begin) + " bytes, shape " +
                  v.shape_string() + " needs " + std::to_string(expected));
    }
    v.data = data + data_start + begin;
    v.num_bytes = static_cast<size_t>(expected);
    file.index_.emplace(key, file.tensors_.size());
    file.tensors_.push_back(std::move(v));
  }
  const SafetensorsFile* f = &file;
  INFERD_RETURN_IF_ERROR(attach_row_scales(
      name, file.tensors_, [f](const std::string& n) { return f->find_tensor(n); }, &file.row_scales_));
  return file;
}

Expected<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  INFERD_ASSIGN_OR_RETURN(MappedFile mapped, MappedFile::open(path));
  INFERD_ASSIGN_OR_RETURN(SafetensorsFile file, parse(path, mapped.data(), mapped.size()));
  file.file_ = std::move(mapped);
  return file;
}

const TensorView* SafetensorsFile::find_tensor(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

}  // namespace inferd
