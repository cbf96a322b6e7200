#include "formats/gguf_writer.h"

#include "common/files.h"

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

namespace inferd {

namespace {

class Out {
 public:
  explicit Out(std::ostream* f) : f_(f) {}
  template <typename T>
  void pod(T v) {
    f_->write(reinterpret_cast<const char*>(&v), sizeof(T));
    pos_ += sizeof(T);
  }
  void bytes(const void* p, size_t n) {
    f_->write(static_cast<const char*>(p), static_cast<std::streamsize>(n));
    pos_ += n;
  }
  void string(const std::string& s) {
    pod<uint64_t>(s.size());
    bytes(s.data(), s.size());
  }
  void pad_to(size_t alignment) {
    static const char zeros[64] = {};
    while (pos_ % alignment != 0) {
      const size_t n = std::min<size_t>(alignment - pos_ % alignment, sizeof(zeros));
      bytes(zeros, n);
    }
  }
  size_t pos() const { return pos_; }

 private:
  std::ostream* f_;
  size_t pos_ = 0;
};

// One scalar of `type` from a parsed value's fields.
void write_scalar(Out& out, GgufType type, int64_t i, double f, const std::string& s) {
  switch (type) {
    case GgufType::kU8: out.pod(static_cast<uint8_t>(i)); break;
    case GgufType::kI8: out.pod(static_cast<int8_t>(i)); break;
    case GgufType::kU16: out.pod(static_cast<uint16_t>(i)); break;
    case GgufType::kI16: out.pod(static_cast<int16_t>(i)); break;
    case GgufType::kU32: out.pod(static_cast<uint32_t>(i)); break;
    case GgufType::kI32: out.pod(static_cast<int32_t>(i)); break;
    case GgufType::kF32: out.pod(static_cast<float>(f)); break;
    case GgufType::kBool: out.pod(static_cast<uint8_t>(i != 0)); break;
    case GgufType::kString: out.string(s); break;
    case GgufType::kU64: out.pod(static_cast<uint64_t>(i)); break;
    case GgufType::kI64: out.pod(static_cast<int64_t>(i)); break;
    case GgufType::kF64: out.pod(f); break;
    case GgufType::kArray: break;  // handled by write_value
  }
}

void write_value(Out& out, const GgufValue& v) {
  if (v.type != GgufType::kArray)
    return write_scalar(out, v.type, v.int_value, v.float_value, v.string_value);
  out.pod(static_cast<uint32_t>(v.array_type));
  switch (v.array_type) {
    case GgufType::kString:
      out.pod<uint64_t>(v.array_strings.size());
      for (const auto& s : v.array_strings) out.string(s);
      break;
    case GgufType::kF32:
    case GgufType::kF64:
      out.pod<uint64_t>(v.array_floats.size());
      for (double f : v.array_floats) write_scalar(out, v.array_type, 0, f, {});
      break;
    case GgufType::kArray:
      out.pod<uint64_t>(v.array_nested.size());
      for (const auto& e : v.array_nested) write_value(out, e);  // each: its own element type and count
      break;
    default:
      out.pod<uint64_t>(v.array_ints.size());
      for (int64_t i : v.array_ints) write_scalar(out, v.array_type, i, 0, {});
      break;
  }
}

}  // namespace

void GgufFileWriter::set(const std::string& key, GgufValue value) {
  metadata_[key] = std::move(value);
}

void GgufFileWriter::set_u32(const std::string& key, uint32_t v) {
  GgufValue value;
  value.type = GgufType::kU32;
  value.int_value = v;
  set(key, std::move(value));
}

void GgufFileWriter::add_tensor(const std::string& name, DType dtype, std::vector<int64_t> shape,
                                std::vector<std::byte> data) {
  tensors_.push_back({name, dtype, std::move(shape), std::move(data)});
}

Status GgufFileWriter::write(const std::string& path) const {
  size_t alignment = 32;
  if (auto it = metadata_.find("general.alignment"); it != metadata_.end() && it->second.int_value > 0)
    alignment = static_cast<size_t>(it->second.int_value);
  return write_file_atomically(path, [&](std::ostream& f) {
    Out out(&f);
    out.pod<uint32_t>(0x46554747);  // "GGUF"
    out.pod<uint32_t>(3);
    out.pod<uint64_t>(tensors_.size());
    out.pod<uint64_t>(metadata_.size());
    for (const auto& [key, value] : metadata_) {
      out.string(key);
      out.pod(static_cast<uint32_t>(value.type));
      write_value(out, value);
    }
    uint64_t offset = 0;
    for (const Tensor& t : tensors_) {
      out.string(t.name);
      out.pod(static_cast<uint32_t>(t.shape.size()));
      for (auto it = t.shape.rbegin(); it != t.shape.rend(); ++it) out.pod(static_cast<uint64_t>(*it));
      out.pod(dtype_info(t.dtype).ggml_type);
      out.pod(offset);
      offset += (t.data.size() + alignment - 1) / alignment * alignment;
    }
    out.pad_to(alignment);
    for (const Tensor& t : tensors_) {
      out.bytes(t.data.data(), t.data.size());
      out.pad_to(alignment);
    }
  });
}

}  // namespace inferd
