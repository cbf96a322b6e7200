#include "model/model_quantizer.h"

#include <filesystem>
#include <vector>

#include "model/gguf_file.h"
#include "model/gguf_writer.h"
#include "tensor/dequantize.h"
#include "tensor/quantize.h"

namespace inferd {

namespace {

// llama.cpp's llama_ftype values for general.file_type.
uint32_t file_type(DType target) {
  switch (target) {
    case DType::kF32: return 0;
    case DType::kF16: return 1;
    case DType::kQ4_0: return 2;
    case DType::kQ4_1: return 3;
    case DType::kQ8_0: return 7;
    case DType::kBF16: return 32;
    default: return 0;
  }
}

std::vector<std::byte> convert(const TensorView& t, DType target) {
  const int64_t cols = t.row_length(), rows = t.num_rows();
  const auto out_row = static_cast<size_t>(dtype_bytes(target, cols));
  std::vector<std::byte> out(out_row * static_cast<size_t>(rows));
  std::vector<float> row(static_cast<size_t>(cols));
  for (int64_t r = 0; r < rows; ++r) {
    dequantize_row(t.dtype, t.row(r), row.data(), cols);
    quantize_row(target, row.data(), out.data() + static_cast<size_t>(r) * out_row, cols);
  }
  return out;
}

}  // namespace

Expected<QuantizeReport> quantize_model(const std::string& input, const std::string& output, DType target,
                                        const QuantizeProgress& progress, bool pure) {
  const bool four_bit = target == DType::kQ4_0 || target == DType::kQ4_1;
  if (!can_quantize_to(target))
    return invalid_argument(std::string(dtype_info(target).name) + " is not a quantization target");
  if (std::filesystem::is_directory(input))
    return unsupported(input + ": Hugging Face directories cannot be quantized yet; give a GGUF file");
  INFERD_ASSIGN_OR_RETURN(GgufFile in, GgufFile::open(input));
  GgufFileWriter out;
  for (const auto& [key, value] : in.metadata()) out.set(key, value);
  out.set_u32("general.file_type", file_type(target));
  out.set_u32("general.quantization_version", 2);
  QuantizeReport report;
  report.tensors = static_cast<int64_t>(in.tensors().size());
  int64_t done = 0;
  for (const TensorView& t : in.tensors()) {
    std::vector<int64_t> shape(t.shape.begin(), t.shape.begin() + t.num_dims);
    report.input_bytes += t.num_bytes;
    DType dtype = target;
    if (t.num_dims < 2) {
      dtype = DType::kF32;
      ++report.kept;
    } else if (t.row_length() % dtype_info(target).block_values != 0) {
      dtype = DType::kF16;
      ++report.fallback;
    } else if (four_bit && !pure && (t.name == "token_embd.weight" || t.name == "output.weight")) {
      dtype = DType::kQ8_0;
      ++report.kept_q8;
    } else {
      ++report.converted;
    }
    std::vector<std::byte> data;
    if (t.num_dims < 2) {
      data.resize(static_cast<size_t>(t.num_elements()) * 4);
      dequantize_row(t.dtype, t.data, reinterpret_cast<float*>(data.data()), t.num_elements());
    } else {
      data = convert(t, dtype);
    }
    report.output_bytes += data.size();
    out.add_tensor(t.name, dtype, std::move(shape), std::move(data));
    if (progress) progress(++done, report.tensors, t.name);
  }
  INFERD_RETURN_IF_ERROR(out.write(output));
  return report;
}

}  // namespace inferd
