#include "tools/model_quantizer.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

#include "common/files.h"
#include "common/thread_pool.h"
#include "formats/gguf_file.h"
#include "formats/gguf_writer.h"
#include "formats/row_scales.h"
#include "formats/safetensors_file.h"
#include "formats/safetensors_writer.h"
#include "model/lora_adapter.h"
#include "model/model_loader.h"
#include "model/tensor_names.h"
#include "tensor/dequantize.h"
#include "tensor/quantize.h"
#include "tokenizer/tokenizer_loader.h"
#include "tokenizer/vocab.h"
#include "tools/gguf_from_hf.h"
#include "tools/gptq.h"
#include "tools/hf_directory.h"

namespace inferd {

namespace {

namespace fs = std::filesystem;

// llama.cpp's llama_ftype values for general.file_type; inferd's own types have none.
std::optional<uint32_t> file_type(DType target) {
  switch (target) {
    case DType::kF32: return 0;
    case DType::kF16: return 1;
    case DType::kQ4_0: return 2;
    case DType::kQ4_1: return 3;
    case DType::kQ8_0: return 7;
    case DType::kBF16: return 32;
    default: return std::nullopt;
  }
}

bool is_four_bit(DType t) {
  return t == DType::kQ4_0 || t == DType::kQ4_1 || t == DType::kQ4_G128;
}

// One converted tensor: its stored bytes and, for row-scaled types, the scales.
struct Converted {
  DType dtype;
  std::vector<std::byte> data;
  std::vector<float> row_scales;
};

// GPTQ rounding of t to a Q4_G type when calibration statistics cover it; nullopt otherwise.
std::optional<Expected<Converted>> convert_gptq(const TensorView& t, DType target,
                                                const CalibrationStats* stats, ThreadPool& pool) {
  int64_t layer = 0;
  LinearInput input{};
  if (stats == nullptr || q4_group_size(target) == 0 || !linear_input_of(t.name, &layer, &input))
    return std::nullopt;
  const std::vector<float>* h = stats->hessian(layer, input);
  const int64_t cols = t.row_length(), rows = t.num_rows();
  if (h == nullptr || static_cast<int64_t>(h->size()) != cols * cols) return std::nullopt;
  std::vector<float> w(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) dequantize_tensor_row(t, r, w.data() + r * cols);
  Converted c{target, std::vector<std::byte>(static_cast<size_t>(dtype_bytes(target, cols) * rows)), {}};
  Status s = gptq_quantize(target, w.data(), rows, cols, *h, c.data.data(), pool);
  if (!s.is_ok()) return Expected<Converted>(s.with_context(t.name));
  return Expected<Converted>(std::move(c));
}

Converted convert(const TensorView& t, DType target, ThreadPool& pool) {
  const int64_t cols = t.row_length(), rows = t.num_rows();
  const auto out_row = static_cast<size_t>(dtype_bytes(target, cols));
  Converted c{target, std::vector<std::byte>(out_row * static_cast<size_t>(rows)), {}};
  if (dtype_has_row_scale(target)) c.row_scales.resize(static_cast<size_t>(rows));
  pool.parallel_for(rows, [&](int64_t begin, int64_t end) {
    std::vector<float> row(static_cast<size_t>(cols));
    for (int64_t r = begin; r < end; ++r) {
      dequantize_tensor_row(t, r, row.data());
      quantize_row(target, row.data(), c.data.data() + static_cast<size_t>(r) * out_row, cols,
                   c.row_scales.empty() ? nullptr : &c.row_scales[static_cast<size_t>(r)]);
    }
  });
  return c;
}

// t with `lora`'s update of it merged in (W + scale * B A, in f32, in `storage`), or nullopt
// when the adapter leaves t alone.
std::optional<TensorView> merged_view(const TensorView& t, const LoraAdapter* lora,
                                      std::vector<float>* storage) {
  int64_t layer = 0;
  LayerTensor role{};
  if (lora == nullptr || !parse_layer_tensor(t.name, &layer, &role)) return std::nullopt;
  std::optional<LoraTarget> target;
  switch (role) {
    case LayerTensor::kWq: target = LoraTarget::kQ; break;
    case LayerTensor::kWk: target = LoraTarget::kK; break;
    case LayerTensor::kWv: target = LoraTarget::kV; break;
    case LayerTensor::kWo: target = LoraTarget::kO; break;
    case LayerTensor::kGate: target = LoraTarget::kGate; break;
    case LayerTensor::kUp: target = LoraTarget::kUp; break;
    case LayerTensor::kDown: target = LoraTarget::kDown; break;
    default: return std::nullopt;
  }
  if (layer < 0 || layer >= static_cast<int64_t>(lora->layers.size())) return std::nullopt;
  const LoraMatrix& lm = lora->matrix(layer, *target);
  const int64_t rows = t.num_rows(), cols = t.row_length();
  if (lm.rank == 0 || t.num_dims != 2) return std::nullopt;
  struct {
    int64_t rank;
    float scale;
    std::vector<float> a, bt;
  } m{lm.rank, lm.scale, lm.a_values(), lm.bt_values()};
  if (static_cast<int64_t>(m.a.size()) != m.rank * cols || static_cast<int64_t>(m.bt.size()) != m.rank * rows)
    return std::nullopt;
  storage->resize(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) dequantize_tensor_row(t, r, storage->data() + r * cols);
  for (int64_t o = 0; o < rows; ++o) {
    float* w = storage->data() + o * cols;
    for (int64_t k = 0; k < m.rank; ++k) {
      const float c = m.scale * m.bt[static_cast<size_t>(k * rows + o)];
      const float* a = m.a.data() + k * cols;
      for (int64_t i = 0; i < cols; ++i) w[i] += c * a[i];
    }
  }
  TensorView v = t;
  v.dtype = DType::kF32;
  v.data = reinterpret_cast<const std::byte*>(storage->data());
  v.num_bytes = storage->size() * sizeof(float);
  v.row_scale = nullptr;
  return v;
}

// The stored type of a matrix with rows of `cols` values; counts the choice in `report`.
DType matrix_type(DType target, int64_t cols, bool embedding_or_output, bool pure, QuantizeReport* report) {
  if (is_four_bit(target) && !pure && embedding_or_output && cols % 32 == 0) {
    ++report->kept_q8;
    return DType::kQ8_0;
  }
  if (target == DType::kQ4_G128 && cols % 128 != 0 && cols % 64 == 0) {
    ++report->smaller_groups;
    return DType::kQ4_G64;
  }
  if (cols % dtype_info(target).block_values != 0) {
    ++report->fallback;
    return DType::kF16;
  }
  ++report->converted;
  return target;
}

// A mixture-of-experts router or shared-expert gate, named the GGUF or the Hugging Face way.
bool is_router(const std::string& name) {
  int64_t layer = 0;
  LayerTensor role{};
  return parse_layer_tensor(name, &layer, &role) &&
         (role == LayerTensor::kRouter || role == LayerTensor::kSharedExpertGate);
}

// Names of the "_scale" companions of the row-scaled tensors in `tensors` (read with their
// tensor, not copied on their own).
std::set<std::string> companion_names(const std::vector<const TensorView*>& tensors) {
  std::set<std::string> out;
  for (const TensorView* t : tensors)
    if (dtype_has_row_scale(t->dtype)) out.insert(row_scale_name(t->name));
  return out;
}

// Runs the conversion of every tensor: 1-D ones through keep_vector, matrices through convert,
// each result handed to `emit`.
template <typename KeepVector, typename Emit>
Status convert_all(const std::vector<const TensorView*>& tensors, DType target,
                   const QuantizeOptions& options, const CalibrationStats* stats,
                   const std::set<std::string>& embedding_or_output, const QuantizeProgress& progress,
                   QuantizeReport* report, const LoraAdapter* lora, KeepVector keep_vector, Emit emit) {
  const std::set<std::string> skip = companion_names(tensors);
  ThreadPool pool(static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  report->tensors = static_cast<int64_t>(tensors.size() - skip.size());
  int64_t done = 0;
  for (const TensorView* t : tensors) {
    if (skip.count(t->name) != 0) continue;
    report->input_bytes += t->num_bytes;
    if (t->num_dims < 2) {
      ++report->kept;
      report->output_bytes += keep_vector(*t);
    } else {
      // MoE routers and shared-expert gates stay F32, as llama-quantize keeps them: a router
      // rounded to a few bits moves tokens to other experts.
      DType dtype = DType::kF32;
      if (is_router(t->name)) {
        ++report->kept_f32_routers;
      } else {
        dtype = matrix_type(target, t->row_length(), embedding_or_output.count(t->name) != 0, options.pure,
                            report);
      }
      Converted c;
      std::vector<float> merged_storage;
      const std::optional<TensorView> merged = merged_view(*t, lora, &merged_storage);
      report->lora_merged += merged.has_value();
      const TensorView& w = merged ? *merged : *t;
      if (auto g = convert_gptq(w, dtype, stats, pool)) {
        if (!*g) return g->status();
        c = std::move(*g).value();
        ++report->gptq;
      } else {
        c = convert(w, dtype, pool);
      }
      report->output_bytes += c.data.size() + c.row_scales.size() * sizeof(float);
      emit(*t, std::move(c));
    }
    if (progress) progress(++done, report->tensors, t->name);
  }
  return Status::ok();
}

std::vector<std::byte> float_bytes(const std::vector<float>& v) {
  std::vector<std::byte> out(v.size() * sizeof(float));
  std::memcpy(out.data(), v.data(), out.size());
  return out;
}

std::vector<int64_t> shape_of(const TensorView& t) {
  return {t.shape.begin(), t.shape.begin() + t.num_dims};
}

// convert_all's writers for a GgufFileWriter or a SafetensorsWriter: a 1-D tensor as F32, a
// converted matrix with its row scales ("<name>_scale", F32) when it has them.
template <typename Writer>
auto f32_vector_writer(Writer& out) {
  return [&out](const TensorView& t) {
    std::vector<float> v(static_cast<size_t>(t.num_elements()));
    dequantize_tensor_row(t, 0, v.data());
    out.add_tensor(t.name, DType::kF32, shape_of(t), float_bytes(v));
    return v.size() * sizeof(float);
  };
}

template <typename Writer>
auto matrix_writer(Writer& out) {
  return [&out](const TensorView& t, Converted c) {
    if (!c.row_scales.empty())
      out.add_tensor(row_scale_name(t.name), DType::kF32, {t.num_rows()}, float_bytes(c.row_scales));
    out.add_tensor(t.name, c.dtype, shape_of(t), std::move(c.data));
  };
}

Expected<QuantizeReport> quantize_gguf(const std::string& input, const std::string& output, DType target,
                                       const QuantizeProgress& progress, const QuantizeOptions& options,
                                       const CalibrationStats* stats, const LoraAdapter* lora) {
  INFERD_ASSIGN_OR_RETURN(GgufFile in, GgufFile::open(input));
  GgufFileWriter out;
  for (const auto& [key, value] : in.metadata()) out.set(key, value);
  if (auto ft = file_type(target)) {
    out.set_u32("general.file_type", *ft);
  } else {
    out.erase("general.file_type");
  }
  out.set_u32("general.quantization_version", 2);
  std::vector<const TensorView*> tensors;
  for (const TensorView& t : in.tensors()) tensors.push_back(&t);
  QuantizeReport report;
  INFERD_RETURN_IF_ERROR(convert_all(tensors, target, options, stats, {"token_embd.weight", "output.weight"},
                                     progress, &report, lora, f32_vector_writer(out), matrix_writer(out)));
  INFERD_RETURN_IF_ERROR(out.write(output));
  return report;
}

// A Hugging Face directory in, a directory out: model.safetensors with the converted tensors,
// config.json with a quantization_config naming the type, every other file (tokenizer, generation
// config, chat template) copied.
Expected<QuantizeReport> quantize_hf_dir(const fs::path& input, const fs::path& output, DType target,
                                         const QuantizeProgress& progress, const QuantizeOptions& options,
                                         const CalibrationStats* stats, const LoraAdapter* lora) {
  INFERD_ASSIGN_OR_RETURN(HfDirectory in, read_hf_directory(input, output));
  const std::vector<const TensorView*>& tensors = in.tensors;
  nlohmann::json& config = in.config;
  SafetensorsWriter out;
  out.set_metadata("inferd.quantized_type", std::string(dtype_info(target).name));
  QuantizeReport report;
  INFERD_RETURN_IF_ERROR(convert_all(
      tensors, target, options, stats, {"model.embed_tokens.weight", "lm_head.weight"}, progress, &report,
      lora,
      [&, as_f32 = f32_vector_writer(out)](const TensorView& t) {
        if (t.dtype != DType::kF32 && t.dtype != DType::kF16 && t.dtype != DType::kBF16) return as_f32(t);
        out.add_tensor(t.name, t.dtype, shape_of(t), std::vector<std::byte>(t.data, t.data + t.num_bytes));
        return t.num_bytes;
      },
      matrix_writer(out)));

  config["quantization_config"] = {{"quant_method", "inferd"}, {"weight_type", dtype_info(target).name}};
  INFERD_RETURN_IF_ERROR(write_hf_directory(input, output, config, out));
  return report;
}

// A Hugging Face directory written as GGUF (output ending in ".gguf"): metadata and tokenizer
// converted as llama.cpp's convert_hf_to_gguf.py does (model/gguf_from_hf.h), tensors renamed,
// Llama's Q / K rows permuted, then quantized like a GGUF input.
Expected<QuantizeReport> quantize_hf_dir_to_gguf(const fs::path& input, const std::string& output,
                                                 DType target, const QuantizeProgress& progress,
                                                 const QuantizeOptions& options,
                                                 const CalibrationStats* stats, const LoraAdapter* lora) {
  INFERD_ASSIGN_OR_RETURN(std::unique_ptr<ModelWeights> model, load_model(input.string()));
  const ModelConfig& config = model->config;
  if (config.is_moe()) {
    return unsupported(input.string() +
                       ": writing a mixture-of-experts checkpoint as GGUF (stacking its experts) is not "
                       "supported yet; convert it with llama.cpp's convert_hf_to_gguf.py");
  }
  GgufFileWriter out;
  if (Status s = set_gguf_model_metadata(config, input.filename().string(), out); !s.is_ok())
    return s.with_context(input.string());
  // llama.cpp's converter writes this tensor first (generate_extra_tensors).
  if (const std::vector<float> freqs = gguf_rope_freqs(config); !freqs.empty())
    out.add_tensor("rope_freqs.weight", DType::kF32, {static_cast<int64_t>(freqs.size())},
                   float_bytes(freqs));
  if (fs::exists(input / "tokenizer.json")) {
    INFERD_ASSIGN_OR_RETURN(Vocab vocab, vocab_from_hf_dir(input.string()));
    Status s = set_gguf_tokenizer_metadata(vocab, config.vocab_size, out);
    if (!s.is_ok()) return s.with_context((input / "tokenizer.json").string());
  }
  if (auto ft = file_type(target)) out.set_u32("general.file_type", *ft);
  out.set_u32("general.quantization_version", 2);
  // The checkpoint's tensors under their GGUF names; Llama's Q and K rows permuted (a copy).
  std::vector<TensorView> views;
  std::vector<std::vector<float>> permuted;
  for (const SafetensorsFile& shard : model->safetensors) {
    for (const TensorView& t : shard.tensors()) {
      const std::optional<std::string> name = gguf_tensor_name(t.name);
      if (!name || (*name == "output.weight" && config.tie_word_embeddings)) continue;
      TensorView v = t;
      v.name = *name;
      if (const int64_t heads = rope_permute_heads(config, t.name); heads > 0) {
        std::vector<float> w(static_cast<size_t>(t.num_elements()));
        for (int64_t r = 0; r < t.num_rows(); ++r) dequantize_tensor_row(t, r, w.data() + r * t.row_length());
        permute_rope_rows(w.data(), t.num_rows(), t.row_length(), heads);
        permuted.push_back(std::move(w));
        v.dtype = DType::kF32;
        v.data = reinterpret_cast<const std::byte*>(permuted.back().data());
        v.num_bytes = permuted.back().size() * sizeof(float);
        v.row_scale = nullptr;
      }
      views.push_back(std::move(v));
    }
  }
  std::vector<const TensorView*> tensors;
  for (const TensorView& v : views) tensors.push_back(&v);
  QuantizeReport report;
  INFERD_RETURN_IF_ERROR(convert_all(tensors, target, options, stats, {"token_embd.weight", "output.weight"},
                                     progress, &report, lora, f32_vector_writer(out), matrix_writer(out)));
  INFERD_RETURN_IF_ERROR(out.write(output));
  return report;
}

// Statistics of every layer's linear inputs over the calibration text (options.calibration_file).
Expected<std::unique_ptr<CalibrationStats>> calibration(const std::string& input,
                                                        const QuantizeOptions& options,
                                                        QuantizeReport* report) {
  INFERD_ASSIGN_OR_RETURN(std::string text, read_text_file(options.calibration_file));
  INFERD_ASSIGN_OR_RETURN(std::unique_ptr<ModelWeights> weights, load_model(input));
  auto tokenizer = load_tokenizer(weights->gguf.get(), weights->source_path, weights->config.vocab_size);
  if (!tokenizer) return tokenizer.status().with_context("calibration needs the model's tokenizer");
  const std::vector<int32_t> tokens = (*tokenizer)->encode(text, /*allow_special=*/false);
  ThreadPool pool(static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  INFERD_ASSIGN_OR_RETURN(CalibrationStats stats, calibrate(*weights, tokens, options.calibration_context,
                                                            options.calibration_chunks, pool));
  report->calibration_tokens = stats.tokens();
  return std::make_unique<CalibrationStats>(std::move(stats));
}

}  // namespace

Expected<QuantizeReport> quantize_model(const std::string& input, const std::string& output, DType target,
                                        const QuantizeProgress& progress, const QuantizeOptions& options) {
  if (!can_quantize_to(target))
    return invalid_argument(std::string(dtype_info(target).name) + " is not a quantization target");
  std::error_code ec;
  const bool dir = fs::is_directory(input, ec);
  const bool to_gguf = fs::path(output).extension() == ".gguf";
  if (dir && !to_gguf && dtype_info(target).block_values > 1 && q4_group_size(target) == 0) {
    return unsupported(input + ": " + std::string(dtype_info(target).name) +
                       " is a GGUF block type: name the output OUT.gguf to write a GGUF file (a directory of "
                       "safetensors takes int8, int4, fp8, f16, bf16 or f32)");
  }
  if (!dir && !fs::exists(input, ec)) return not_found(input + ": no such file or directory");
  if (!options.lora.empty() && !options.calibration_file.empty())
    return invalid_argument(
        "--lora and --calibration together are not supported (GPTQ would calibrate on the "
        "model without the adapter)");
  QuantizeReport calibrated;
  std::unique_ptr<CalibrationStats> stats;
  if (!options.calibration_file.empty()) {
    if (q4_group_size(target) == 0)
      return invalid_argument("--calibration (GPTQ) applies to --type int4, not " +
                              std::string(dtype_info(target).name));
    INFERD_ASSIGN_OR_RETURN(stats, calibration(input, options, &calibrated));
  }
  std::shared_ptr<const LoraAdapter> lora;
  if (!options.lora.empty()) {
    // Checked against the base; its Q / K rows as the tensors below are laid out (a Hugging Face
    // directory written as GGUF is permuted first).
    INFERD_ASSIGN_OR_RETURN(std::unique_ptr<ModelWeights> base, load_model(input));
    if (dir && to_gguf) base->source_format = "gguf";
    INFERD_ASSIGN_OR_RETURN(lora, load_lora_adapter(options.lora, *base, int64_t{1} << 20));
  }
  auto r = !dir ? quantize_gguf(input, output, target, progress, options, stats.get(), lora.get())
           : to_gguf
               ? quantize_hf_dir_to_gguf(input, output, target, progress, options, stats.get(), lora.get())
               : quantize_hf_dir(input, output, target, progress, options, stats.get(), lora.get());
  if (r) r->calibration_tokens = calibrated.calibration_tokens;
  return r;
}

}  // namespace inferd
