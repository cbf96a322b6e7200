#include "model/tensor_parallel.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "common/log.h"
#include "tensor/dequantize.h"

namespace inferd {

namespace {

// Rank r of size: [ceil(r * units / size), ceil((r + 1) * units / size)) units of `unit` values, so
// the first ranks get the extra units.
std::pair<int64_t, int64_t> even_range(int64_t n, int rank, int size, int64_t unit = 1) {
  const int64_t units = n / unit;
  auto at = [&](int r) { return (units * r + size - 1) / size * unit; };  // rounded up
  return {at(rank), at(rank + 1)};
}

// Rows [begin, end) of a row-major matrix: a view into the same bytes.
TensorView row_slice(const TensorView& t, int64_t begin, int64_t end) {
  TensorView v = t;
  v.shape[0] = end - begin;
  v.data = t.data + static_cast<size_t>(begin) * t.row_bytes();
  v.num_bytes = static_cast<size_t>(end - begin) * t.row_bytes();
  if (t.row_scale != nullptr) v.row_scale = t.row_scale + begin;
  return v;
}

// Columns [begin, end) of every row, copied into memory `owned` keeps: the stored bytes where
// both ends fall on block boundaries, else the rows dequantized to F32.
TensorView column_slice(const TensorView& t, int64_t begin, int64_t end,
                        std::vector<std::vector<std::byte>>& owned) {
  const int64_t rows = t.num_rows(), cols = end - begin;
  const int64_t block = dtype_info(t.dtype).block_values;
  TensorView v = t;
  v.shape[1] = cols;
  std::vector<std::byte>& bytes = owned.emplace_back();
  if (begin % block == 0 && end % block == 0) {
    const auto offset = static_cast<size_t>(dtype_bytes(t.dtype, begin));
    const auto width = static_cast<size_t>(dtype_bytes(t.dtype, cols));
    bytes.resize(width * static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r)
      std::memcpy(bytes.data() + static_cast<size_t>(r) * width, t.row(r) + offset, width);
  } else {
    log_info("tensor parallel: a column boundary falls inside a quantization block; this slice runs in F32",
             {{"tensor", t.name}, {"dtype", std::string(dtype_info(t.dtype).name)}});
    std::vector<float> row(static_cast<size_t>(t.row_length()));
    bytes.resize(static_cast<size_t>(rows * cols) * sizeof(float));
    for (int64_t r = 0; r < rows; ++r) {
      dequantize_tensor_row(t, r, row.data());
      std::memcpy(bytes.data() + static_cast<size_t>(r * cols) * sizeof(float), row.data() + begin,
                  static_cast<size_t>(cols) * sizeof(float));
    }
    v.dtype = DType::kF32;
    v.row_scale = nullptr;  // applied by the dequantization
  }
  v.data = bytes.data();
  v.num_bytes = bytes.size();
  return v;
}

std::vector<float> vector_slice(const std::vector<float>& v, int64_t begin, int64_t end) {
  if (v.empty()) return v;
  return std::vector<float>(v.begin() + begin, v.begin() + end);
}

}  // namespace

std::pair<int64_t, int64_t> tensor_shard_vocab_range(int64_t vocab_size, int rank, int size) {
  return even_range(vocab_size, rank, size);
}

Expected<TensorShard> plan_tensor_shard(const ModelWeights& weights, int rank, int size) {
  const ModelConfig& c = weights.config;
  if (size < 1 || rank < 0 || rank >= size)
    return invalid_argument("tensor parallel: rank outside the group");
  if (c.num_kv_heads < size) {
    return invalid_argument("--tensor-parallel-size " + std::to_string(size) + " exceeds the model's " +
                            std::to_string(c.num_kv_heads) +
                            " KV heads (replicating KV heads is not supported)");
  }
  // Each MLP's channels split on whole quantization blocks of its down projection (the first
  // layer that has one says the dtype).
  auto block_of = [&](auto pick) -> int64_t {
    for (const LayerWeights& l : weights.layers) {
      const TensorView* t = pick(l);
      if (t != nullptr && t->data != nullptr) return dtype_info(t->dtype).block_values;
    }
    return 0;  // no such MLP in this model
  };
  const int64_t block = block_of([](const LayerWeights& l) { return &l.w_down; });
  const int64_t moe_block = block_of(
      [](const LayerWeights& l) { return l.moe.expert_down.empty() ? nullptr : &l.moe.expert_down[0]; });
  const int64_t shared_block = block_of([](const LayerWeights& l) { return &l.moe.shared_down; });
  auto check_split = [&](int64_t channels, int64_t unit, const char* what) -> Status {
    if (unit == 0 || channels / unit >= size) return Status::ok();
    return invalid_argument("tensor parallel: " + std::to_string(channels) + " " + what +
                            " channels do not split into " + std::to_string(size) +
                            " slices of whole blocks of " + std::to_string(unit));
  };
  INFERD_RETURN_IF_ERROR(check_split(c.intermediate_size, block, "intermediate"));
  INFERD_RETURN_IF_ERROR(check_split(c.moe_intermediate_size, moe_block, "expert intermediate"));
  INFERD_RETURN_IF_ERROR(
      check_split(c.shared_expert_intermediate_size, shared_block, "shared-expert intermediate"));
  TensorShard s;
  s.rank = rank;
  s.size = size;
  std::tie(s.kv_head_begin, s.kv_head_end) = even_range(c.num_kv_heads, rank, size);
  const int64_t group = c.num_heads / c.num_kv_heads;
  s.head_begin = s.kv_head_begin * group;
  s.head_end = s.kv_head_end * group;
  auto channels = [&](int64_t n, int64_t unit, int64_t* begin, int64_t* end) {
    if (unit == 0) {  // no such MLP: nothing to split (the size stays the model's)
      *begin = 0, *end = n;
      return;
    }
    std::tie(*begin, *end) = even_range(n, rank, size, unit);
    if (rank == size - 1) *end = n;  // a tail short of a block
  };
  channels(c.intermediate_size, block, &s.inter_begin, &s.inter_end);
  channels(c.moe_intermediate_size, moe_block, &s.moe_inter_begin, &s.moe_inter_end);
  channels(c.shared_expert_intermediate_size, shared_block, &s.shared_inter_begin, &s.shared_inter_end);
  std::tie(s.vocab_begin, s.vocab_end) = tensor_shard_vocab_range(c.vocab_size, rank, size);
  return s;
}

Status shard_weights(ModelWeights& w, const TensorShard& s) {
  if (s.size == 1) return Status::ok();
  if (w.shard.size != 1) return invalid_argument("tensor parallel: the weights are split already");
  ModelConfig& c = w.config;
  const int64_t hd = c.head_dim;
  // What this rank reads: a pipeline stage (pipeline_weights first) embeds only if it is the first
  // and projects onto the vocabulary only if it is the last.
  size_t bytes = w.stage.first() ? w.token_embedding.num_bytes : 0;
  for (LayerWeights& l : w.layers) {
    l.wq = row_slice(l.wq, s.head_begin * hd, s.head_end * hd);
    l.wk = row_slice(l.wk, s.kv_head_begin * hd, s.kv_head_end * hd);
    l.wv = row_slice(l.wv, s.kv_head_begin * hd, s.kv_head_end * hd);
    l.bq = vector_slice(l.bq, s.head_begin * hd, s.head_end * hd);
    l.bk = vector_slice(l.bk, s.kv_head_begin * hd, s.kv_head_end * hd);
    l.bv = vector_slice(l.bv, s.kv_head_begin * hd, s.kv_head_end * hd);
    l.wo = column_slice(l.wo, s.head_begin * hd, s.head_end * hd, w.owned);
    // An MLP's gate and up by its channels (rows), its down by the same channels (columns); a
    // MoE layer's router and shared-expert gate whole (every rank routes the same).
    auto split_mlp = [&](TensorView& gate, TensorView& up, TensorView& down, int64_t begin, int64_t end) {
      if (gate.data == nullptr) return;
      gate = row_slice(gate, begin, end);
      up = row_slice(up, begin, end);
      down = column_slice(down, begin, end, w.owned);
      bytes += gate.num_bytes + up.num_bytes + down.num_bytes;
    };
    split_mlp(l.w_gate, l.w_up, l.w_down, s.inter_begin, s.inter_end);
    MoeWeights& m = l.moe;
    for (size_t e = 0; e < m.expert_gate.size(); ++e)
      split_mlp(m.expert_gate[e], m.expert_up[e], m.expert_down[e], s.moe_inter_begin, s.moe_inter_end);
    split_mlp(m.shared_gate, m.shared_up, m.shared_down, s.shared_inter_begin, s.shared_inter_end);
    for (const TensorView* t : {&l.wq, &l.wk, &l.wv, &l.wo, &m.router, &m.shared_expert_gate})
      bytes += t->num_bytes;
  }
  w.lm_head = row_slice(w.lm_head, s.vocab_begin, s.vocab_end);
  if (w.stage.last() && !(w.stage.first() && c.tie_word_embeddings)) bytes += w.lm_head.num_bytes;
  c.num_heads = s.head_end - s.head_begin;
  c.num_kv_heads = s.kv_head_end - s.kv_head_begin;
  c.intermediate_size = s.inter_end - s.inter_begin;
  c.moe_intermediate_size = s.moe_inter_end - s.moe_inter_begin;
  c.shared_expert_intermediate_size = s.shared_inter_end - s.shared_inter_begin;
  w.weight_bytes = bytes;
  w.shard = s;
  return Status::ok();
}

}  // namespace inferd
