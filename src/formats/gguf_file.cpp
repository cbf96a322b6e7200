#include "formats/gguf_file.h"

#include <cstring>
#include <limits>

#include "formats/row_scales.h"

namespace inferd {

namespace {

constexpr uint32_t kGgufMagic = 0x46554747;  // "GGUF" little-endian
constexpr int kMaxDims = 4;
constexpr int kMaxArrayDepth = 4;

// Bounds-checked little-endian reader over the file bytes.
class Reader {
 public:
  Reader(const std::byte* data, size_t size) : data_(data), size_(size) {}
  size_t pos() const { return pos_; }
  size_t remaining() const { return size_ - pos_; }

  template <typename T>
  bool read(T* out) {
    if (remaining() < sizeof(T)) return false;
    std::memcpy(out, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  bool read_string(std::string* out) {
    uint64_t len = 0;
    if (!read(&len) || len > remaining()) return false;
    out->assign(reinterpret_cast<const char*>(data_ + pos_), static_cast<size_t>(len));
    pos_ += static_cast<size_t>(len);
    return true;
  }

 private:
  const std::byte* data_;
  size_t size_;
  size_t pos_ = 0;
};

// Smallest encoded size of one element of `type`, to bound array counts before allocating.
size_t min_encoded_size(GgufType type) {
  switch (type) {
    case GgufType::kU8:
    case GgufType::kI8:
    case GgufType::kBool: return 1;
    case GgufType::kU16:
    case GgufType::kI16: return 2;
    case GgufType::kU32:
    case GgufType::kI32:
    case GgufType::kF32: return 4;
    case GgufType::kString:
    case GgufType::kU64:
    case GgufType::kI64:
    case GgufType::kF64: return 8;
    case GgufType::kArray: return 12;
  }
  return 1;
}

bool valid_type(uint32_t t) {
  return t <= static_cast<uint32_t>(GgufType::kF64);
}

}  // namespace

bool GgufValue::is_integer() const {
  switch (type) {
    case GgufType::kU8:
    case GgufType::kI8:
    case GgufType::kU16:
    case GgufType::kI16:
    case GgufType::kU32:
    case GgufType::kI32:
    case GgufType::kU64:
    case GgufType::kI64: return true;
    default: return false;
  }
}

const char* gguf_type_name(GgufType type) {
  static const char* const kNames[] = {"u8",   "i8",     "u16",   "i16", "u32", "i32", "f32",
                                       "bool", "string", "array", "u64", "i64", "f64"};
  const auto i = static_cast<uint32_t>(type);
  return i < 13 ? kNames[i] : "unknown";
}

// Turns bytes into a GgufFile; every failure names the byte offset where it was found.
class GgufParser {
 public:
  GgufParser(const std::string& name, const std::byte* data, size_t size)
      : name_(name), reader_(data, size), data_(data), size_(size) {}

  Expected<GgufFile> parse() {
    GgufFile file;
    file.name_ = name_;
    uint32_t magic = 0;
    if (!reader_.read(&magic)) return fail("file too short for a GGUF header");
    if (magic != kGgufMagic) return fail("not a GGUF file (bad magic)");
    if (!reader_.read(&file.version_)) return fail("truncated header");
    if (file.version_ != 2 && file.version_ != 3) {
      return Status(StatusCode::kUnsupported, name_ + ": unsupported GGUF version " +
                                                  std::to_string(file.version_) + " (expected 2 or 3)");
    }
    uint64_t num_tensors = 0, num_kv = 0;
    if (!reader_.read(&num_tensors) || !reader_.read(&num_kv)) return fail("truncated header");
    // Each key/value takes >= 12 bytes and each tensor info >= 24: bound counts by the file.
    if (num_kv > reader_.remaining() / 12)
      return fail("metadata count " + std::to_string(num_kv) + " exceeds file size");
    if (num_tensors > reader_.remaining() / 24)
      return fail("tensor count " + std::to_string(num_tensors) + " exceeds file size");

    for (uint64_t i = 0; i < num_kv; ++i) {
      std::string key;
      if (!reader_.read_string(&key)) return fail("truncated metadata key #" + std::to_string(i));
      uint32_t type = 0;
      if (!reader_.read(&type)) return fail("truncated metadata '" + key + "'");
      GgufValue value;
      Status s = read_value(type, &value, 0);
      if (!s.is_ok()) return s.with_context("metadata '" + key + "'");
      if (!file.metadata_.emplace(key, std::move(value)).second) {
        return fail("duplicate metadata key '" + key + "'");
      }
    }
    if (const GgufValue* a = file.find("general.alignment")) {
      if (!a->is_integer() || a->int_value <= 0 || (a->int_value & (a->int_value - 1)) != 0 ||
          a->int_value > (1 << 20)) {
        return fail("general.alignment must be a power of two");
      }
      file.alignment_ = static_cast<size_t>(a->int_value);
    }

    struct Info {
      TensorView view;
      uint64_t offset;
    };
    std::vector<Info> infos;
    infos.reserve(static_cast<size_t>(num_tensors));
    for (uint64_t i = 0; i < num_tensors; ++i) {
      Info info{};
      Status s = read_tensor_info(&info.view, &info.offset);
      if (!s.is_ok()) return s.with_context(name_ + ": tensor #" + std::to_string(i));
      infos.push_back(std::move(info));
    }
    const size_t data_start = align_up(reader_.pos(), file.alignment_);
    if (data_start > size_ && num_tensors > 0) return fail("tensor data section starts past end of file");
    const size_t data_size = data_start <= size_ ? size_ - data_start : 0;

    for (auto& info : infos) {
      TensorView& v = info.view;
      if (info.offset % file.alignment_ != 0) {
        return fail("tensor '" + v.name + "' offset " + std::to_string(info.offset) + " is not aligned to " +
                    std::to_string(file.alignment_));
      }
      if (info.offset > data_size || v.num_bytes > data_size - info.offset) {
        return fail("tensor '" + v.name + "' data (offset " + std::to_string(info.offset) + ", " +
                    std::to_string(v.num_bytes) + " bytes) runs past end of file");
      }
      v.data = data_ + data_start + info.offset;
      if (!file.tensor_index_.emplace(v.name, file.tensors_.size()).second) {
        return fail("duplicate tensor name '" + v.name + "'");
      }
      file.tensors_.push_back(std::move(v));
    }
    const GgufFile* f = &file;
    INFERD_RETURN_IF_ERROR(attach_row_scales(
        name_, file.tensors_, [f](const std::string& n) { return f->find_tensor(n); }, &file.row_scales_));
    return file;
  }

 private:
  Status fail(const std::string& what) const {
    return corrupt_file(name_ + ": " + what + " (at byte " + std::to_string(reader_.pos()) + ")");
  }
  static size_t align_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

  Status read_value(uint32_t type, GgufValue* out, int depth) {
    if (!valid_type(type)) return fail("unknown value type " + std::to_string(type));
    out->type = static_cast<GgufType>(type);
    if (out->type == GgufType::kArray) {
      if (depth >= kMaxArrayDepth) return fail("arrays nested too deeply");
      uint32_t elem = 0;
      uint64_t count = 0;
      if (!reader_.read(&elem) || !reader_.read(&count)) return fail("truncated array header");
      if (!valid_type(elem)) return fail("unknown array element type " + std::to_string(elem));
      out->array_type = static_cast<GgufType>(elem);
      if (count > reader_.remaining() / min_encoded_size(out->array_type)) {
        return fail("array of " + std::to_string(count) + " elements exceeds file size");
      }
      const auto n = static_cast<size_t>(count);
      for (size_t i = 0; i < n; ++i) {
        GgufValue v;
        Status s = read_value(elem, &v, depth + 1);
        if (!s.is_ok()) return s;
        switch (out->array_type) {
          case GgufType::kString: out->array_strings.push_back(std::move(v.string_value)); break;
          case GgufType::kF32:
          case GgufType::kF64: out->array_floats.push_back(v.float_value); break;
          case GgufType::kArray: out->array_nested.push_back(std::move(v)); break;
          default: out->array_ints.push_back(v.int_value); break;
        }
      }
      return Status::ok();
    }
    bool ok = true;
    switch (out->type) {
      case GgufType::kU8: ok = read_int<uint8_t>(out); break;
      case GgufType::kI8: ok = read_int<int8_t>(out); break;
      case GgufType::kU16: ok = read_int<uint16_t>(out); break;
      case GgufType::kI16: ok = read_int<int16_t>(out); break;
      case GgufType::kU32: ok = read_int<uint32_t>(out); break;
      case GgufType::kI32: ok = read_int<int32_t>(out); break;
      case GgufType::kU64: ok = read_int<uint64_t>(out); break;
      case GgufType::kI64: ok = read_int<int64_t>(out); break;
      case GgufType::kBool: {
        uint8_t b = 0;
        ok = reader_.read(&b);
        if (ok && b > 1) return fail("bool value " + std::to_string(b) + " is not 0 or 1");
        out->int_value = b;
        break;
      }
      case GgufType::kF32: {
        float f = 0;
        ok = reader_.read(&f);
        out->float_value = f;
        break;
      }
      case GgufType::kF64: ok = reader_.read(&out->float_value); break;
      case GgufType::kString: ok = reader_.read_string(&out->string_value); break;
      case GgufType::kArray: break;
    }
    return ok ? Status::ok() : fail("truncated value");
  }

  template <typename T>
  bool read_int(GgufValue* out) {
    T v{};
    if (!reader_.read(&v)) return false;
    out->int_value = static_cast<int64_t>(v);
    return true;
  }

  Status read_tensor_info(TensorView* v, uint64_t* offset) {
    if (!reader_.read_string(&v->name)) return fail("truncated tensor name");
    uint32_t n_dims = 0;
    if (!reader_.read(&n_dims)) return fail("truncated tensor info of '" + v->name + "'");
    if (n_dims == 0 || n_dims > kMaxDims) {
      return fail("tensor '" + v->name + "' has " + std::to_string(n_dims) + " dimensions (1 to 4 allowed)");
    }
    v->num_dims = static_cast<int>(n_dims);
    uint64_t ne[kMaxDims] = {1, 1, 1, 1};
    uint64_t count = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      if (!reader_.read(&ne[d])) return fail("truncated dims of '" + v->name + "'");
      if (ne[d] == 0 || ne[d] > (uint64_t{1} << 40) || count > (uint64_t{1} << 50) / ne[d]) {
        return fail("tensor '" + v->name + "' has an invalid dimension " + std::to_string(ne[d]));
      }
      count *= ne[d];
    }
    // GGUF lists the innermost dimension first; TensorView lists the outermost first.
    for (uint32_t d = 0; d < n_dims; ++d) v->shape[d] = static_cast<int64_t>(ne[n_dims - 1 - d]);
    uint32_t type = 0;
    if (!reader_.read(&type) || !reader_.read(offset))
      return fail("truncated tensor info of '" + v->name + "'");
    auto dtype = dtype_from_ggml(type);
    if (!dtype) {
      return Status(StatusCode::kUnsupported,
                    name_ + ": tensor '" + v->name + "' has unsupported ggml type " + std::to_string(type));
    }
    v->dtype = *dtype;
    const DTypeInfo& info = dtype_info(*dtype);
    if (static_cast<int64_t>(ne[0]) % info.block_values != 0) {
      return fail("tensor '" + v->name + "' row length " + std::to_string(ne[0]) +
                  " is not a multiple of the " + std::string(info.name) + " block size " +
                  std::to_string(info.block_values));
    }
    v->num_bytes = static_cast<size_t>(dtype_bytes(*dtype, static_cast<int64_t>(count)));
    return Status::ok();
  }

  const std::string& name_;
  Reader reader_;
  const std::byte* data_;
  size_t size_;
};

Expected<GgufFile> GgufFile::parse(const std::string& name, const std::byte* data, size_t size) {
  return GgufParser(name, data, size).parse();
}

Expected<GgufFile> GgufFile::open(const std::string& path) {
  INFERD_ASSIGN_OR_RETURN(MappedFile mapped, MappedFile::open(path));
  INFERD_ASSIGN_OR_RETURN(GgufFile file, parse(path, mapped.data(), mapped.size()));
  file.file_ = std::move(mapped);  // the mapping's address does not change on move
  return file;
}

const GgufValue* GgufFile::find(const std::string& key) const {
  auto it = metadata_.find(key);
  return it == metadata_.end() ? nullptr : &it->second;
}

const TensorView* GgufFile::find_tensor(const std::string& name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

Expected<std::optional<int64_t>> GgufFile::get_int(const std::string& key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return std::optional<int64_t>();
  if (!v->is_integer()) {
    return corrupt_file(name_ + ": metadata '" + key + "' is " + gguf_type_name(v->type) +
                        ", expected an integer");
  }
  return std::optional<int64_t>(v->int_value);
}

Expected<std::optional<double>> GgufFile::get_float(const std::string& key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return std::optional<double>();
  if (v->is_float()) return std::optional<double>(v->float_value);
  if (v->is_integer()) return std::optional<double>(static_cast<double>(v->int_value));
  return corrupt_file(name_ + ": metadata '" + key + "' is " + gguf_type_name(v->type) +
                      ", expected a number");
}

Expected<std::optional<std::string>> GgufFile::get_string(const std::string& key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return std::optional<std::string>();
  if (v->type != GgufType::kString) {
    return corrupt_file(name_ + ": metadata '" + key + "' is " + gguf_type_name(v->type) +
                        ", expected a string");
  }
  return std::optional<std::string>(v->string_value);
}

}  // namespace inferd
