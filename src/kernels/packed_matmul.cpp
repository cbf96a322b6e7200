#include "kernels/packed_matmul.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include <sys/mman.h>

#include "common/check.h"
#include "common/half.h"
#include "common/log.h"
#include "kernels/amx_emulator.h"
#include "kernels/exp_poly.h"
#include "kernels/ops.h"
#include "kernels/simd.h"
#include "tensor/ggml_blocks.h"

namespace inferd {

namespace {

constexpr int kMaxTokens = 8;    // tokens per pass over a tile's weights
constexpr int kWideTokens = 12;  // the same for F32 and F16 under FloatBlocking::kWide
constexpr int kAmxTokens = 16;   // the same on the AMX path (one tile of activations)
constexpr int64_t kPrefetchBlocks = 6;
constexpr size_t kAlign = 64;

std::byte* aligned_bytes(size_t n) {
  const size_t rounded = (n + kAlign - 1) / kAlign * kAlign;
  void* p = std::aligned_alloc(kAlign, rounded == 0 ? kAlign : rounded);
  INFERD_CHECK_MSG(p != nullptr, "out of memory packing weights");
  std::memset(p, 0, rounded == 0 ? kAlign : rounded);
  return static_cast<std::byte*>(p);
}

// A packed weight's bytes. Large ones start on a 2 MiB boundary and ask for transparent huge
// pages (Linux's default mode gives them only to memory that asks): a decode step streams every
// weight once, and with 4 KiB pages the TLB misses of that stream cost bandwidth. Large ones are
// not zeroed here: the packer zeroes each tile where it packs it (their pages first touched by
// the thread that fills them).
std::byte* weight_bytes(size_t n) {
  constexpr size_t kHugePage = size_t{2} << 20;
  if (n < 2 * kHugePage) return aligned_bytes(n);
  const size_t rounded = (n + kHugePage - 1) / kHugePage * kHugePage;
  void* p = std::aligned_alloc(kHugePage, rounded);
  INFERD_CHECK_MSG(p != nullptr, "out of memory packing weights");
  madvise(p, rounded, MADV_HUGEPAGE);  // advice only: without huge pages the weight still works
  return static_cast<std::byte*>(p);
}

// The 16 values a nibble code stands for (IQ4: kIq4Values; IQ3: the sign and the 3-bit level of
// a grid point's value, code = sign << 3 | level), or the 8 a 3-bit code of crumb and plane bit
// stands for (IQ2: code = sign << 2 | level; IQ1: see kIq1Lookup), signed and as u8 value + 128.
struct LookupTable {
  alignas(16) std::array<int8_t, 16> values;
  alignas(16) std::array<uint8_t, 16> biased;
};
constexpr LookupTable lookup_of(const int8_t (&values)[16]) {
  LookupTable t{};
  for (size_t i = 0; i < 16; ++i) {
    t.values[i] = values[i];
    t.biased[i] = static_cast<uint8_t>(values[i] + 128);
  }
  return t;
}
// Code = sign << kSignBit | level.
template <int kSignBit, size_t N>
constexpr LookupTable signed_levels(const int8_t (&levels)[N]) {
  static_assert(N <= (size_t{1} << kSignBit) && kSignBit <= 3);
  int8_t values[16] = {};  // codes of no level (IQ2: 3, 7 and 8..15) stand for 0
  for (size_t i = 0; i < N; ++i) {
    values[i] = levels[i];
    values[i + (size_t{1} << kSignBit)] = static_cast<int8_t>(-levels[i]);
  }
  return lookup_of(values);
}
constexpr LookupTable kIq4Lookup = lookup_of(kIq4Values);
constexpr LookupTable kIq3XxsLookup = signed_levels<3>(kIq3XxsLevels);
constexpr LookupTable kIq3sLookup = signed_levels<3>(kIq3sLevels);
constexpr LookupTable kIq2Lookup = signed_levels<2>(kIq2sLevels);  // all three IQ2 grids
// IQ1: code = minus << 2 | level stands for 8 * level -+ 1 (eighths of d * m).
constexpr LookupTable iq1_lookup() {
  int8_t values[16] = {};
  for (size_t i = 0; i < 3; ++i) {
    values[i] = static_cast<int8_t>(8 * kIq1sLevels[i] + 1);
    values[i + 4] = static_cast<int8_t>(8 * kIq1sLevels[i] - 1);
  }
  return lookup_of(values);
}
constexpr LookupTable kIq1Lookup = iq1_lookup();

// How a packed dtype stores a block of 32 values for 16 rows (see the header's layout):
//   scales  16 x f16
//   mins    16 x same, when the value is scale * q + min
//   subs    16 x i8 twice: Q6_K's and Q3_K's scales of the two halves of the block (integers),
//           or Q2_K's sc | mn << 4 (u8) of each half
//   quants  bytes: 8 groups x 16 rows x 4 u8;  nibbles: 4 groups, value 4g+j low, 16+4g+j high;
//           crumbs (2 bits): 2 groups, value 4(g + 2c)+j in bits 2c; then the bits above the
//           nibbles or crumbs (Q5_*, Q3_K: 1, Q6_K: 2) in a plane of the same layout
// value = scale * (q - offset) [+ min], or for Q6_K / Q3_K scale * sub_half * (q - offset), for
// Q2_K d * sc_half * q - dmin * mn_half. Row-scaled formats (I8) have no per-block scale: their
// 16 rows' f32 scales head the tile, and the value is row_scale * (q - offset). K-quants pack a
// whole superblock (8 blocks) as one group whose head holds the file's own scales: the 16 rows'
// f16 d (and dmin), and each block's integer sub-scales (and sub-mins; Q6_K's, Q3_K's and
// Q2_K's two half scales; IQ4_XS's ls - 32, IQ3's 2s + 1 as i8); a block's scale is then d * sc and its min
// -(dmin * mn), products exact in f32.
struct Format {
  bool nibbles;
  bool has_min;
  bool sub_scales;
  int32_t offset;
  bool row_scales = false;
  // Blocks of 32 sharing one set of scales / mins (inferd's Q4_G128: 4, Q4_G64: 2) or one
  // superblock head (K-quants: 8): a packed block then holds the group's head once and its
  // blocks' quants one after another.
  int64_t group_blocks = 1;
  int high_bits = 0;      // bits of a quant above its nibble, in a plane after the nibbles
  bool k_scales = false;  // K-quant superblock heads (see above)
  // IQ4_NL / IQ4_XS / IQ3_*: a nibble is a code into a table of 16 values; the kernels look the
  // value up (vpshufb) and take it as u8 value + 128 (offset 128, as Q8_0's bytes).
  const LookupTable* lookup = nullptr;
  bool crumbs = false;  // Q2_K, Q3_K, IQ2, IQ1, TQ: 2-bit quants (see above)
  // IQ3_XXS, IQ2, IQ1: a block's scale is d * m / 2^scale_shift (m its i8 sub-scale, shift 2
  // and 3; IQ1's table holds eighths), exact in f32.
  int scale_shift = 0;
};

constexpr Format format_of(DType dtype) {
  switch (dtype) {
    case DType::kQ8_0: return {false, false, false, 128};
    case DType::kQ5_0: return {true, false, false, 16, false, 1, 1};
    case DType::kQ5_1: return {true, true, false, 0, false, 1, 1};
    case DType::kQ4_0: return {true, false, false, 8};
    case DType::kQ4_1: return {true, true, false, 0};
    case DType::kQ4_K: return {true, true, false, 0, false, 8, 0, true};
    case DType::kQ5_K: return {true, true, false, 0, false, 8, 1, true};
    case DType::kQ6_K: return {true, false, true, 32, false, 8, 2, true};
    case DType::kI8: return {false, false, false, 128, true};
    case DType::kQ4_G128: return {true, true, false, 0, false, 4};
    case DType::kQ4_G64: return {true, true, false, 0, false, 2};
    case DType::kIQ4_NL: return {true, false, false, 128, false, 1, 0, false, &kIq4Lookup};
    case DType::kIQ4_XS: return {true, false, false, 128, false, 8, 0, true, &kIq4Lookup};
    case DType::kQ2_K: return {false, true, true, 0, false, 8, 0, true, nullptr, true};
    case DType::kQ3_K: return {false, false, true, 4, false, 8, 1, true, nullptr, true};
    case DType::kIQ3_XXS: return {true, false, false, 128, false, 8, 0, true, &kIq3XxsLookup, false, 2};
    case DType::kIQ2_S:
    case DType::kIQ2_XS: return {false, false, true, 128, false, 8, 1, true, &kIq2Lookup, true, 3};
    case DType::kIQ2_XXS: return {false, false, false, 128, false, 8, 1, true, &kIq2Lookup, true, 3};
    case DType::kIQ1_S: return {false, false, false, 128, false, 8, 1, true, &kIq1Lookup, true, 3};
    case DType::kIQ1_M: return {false, false, true, 128, false, 8, 1, true, &kIq1Lookup, true, 3};
    // TQ1_0 / TQ2_0: q as a crumb, offset 1, each block of 32 with its superblock's f16 d.
    case DType::kTQ1_0:
    case DType::kTQ2_0: return {false, false, false, 1, false, 1, 0, false, nullptr, true};
    case DType::kIQ3_S: return {true, false, false, 128, false, 8, 0, true, &kIq3sLookup};
    default: return {false, false, false, 0};
  }
}

// 2^-scale_shift: a power of two, so multiplying by it is exact.
constexpr float scale_factor(Format f) {
  return 1.0f / static_cast<float>(1 << f.scale_shift);
}
constexpr size_t scale_bytes(Format f) {
  return f.row_scales ? 0 : 32;  // 16 x f16
}
constexpr size_t min_offset(Format f) {
  return scale_bytes(f);
}
// Where the integer sub-scales start: Q6_K's and Q3_K's [block][2][16] i8, Q2_K's [block][2][16]
// sc | mn << 4, a K-quant's sc [block][16] u8 followed by its mn [block][16] u8, or IQ4_XS's
// ls - 32 [block][16] i8.
constexpr size_t sub_offset(Format f) {
  return min_offset(f) + (f.has_min ? scale_bytes(f) : 0);
}
constexpr size_t sub_bytes(Format f) {
  if (f.sub_scales) return 32 * static_cast<size_t>(f.group_blocks);
  return f.k_scales ? (f.has_min ? 32 : 16) * static_cast<size_t>(f.group_blocks) : 0;
}
constexpr size_t quant_offset(Format f) {
  return sub_offset(f) + sub_bytes(f);
}
// Q2_K: a sub-scale and a sub-min for each half block of 16 values (the min term then needs the
// activations' half sums).
constexpr bool half_mins(Format f) {
  return f.has_min && f.sub_scales;
}
// The bit of a quant where its high plane's bits go.
constexpr int base_bits(Format f) {
  return f.crumbs ? 2 : (f.nibbles ? 4 : 8);
}
constexpr size_t quant_bytes(Format f) {
  const size_t planes = 64 * static_cast<size_t>(f.high_bits);
  return f.crumbs ? 128 + planes : (f.nibbles ? 256 + planes : 512);
}
constexpr size_t packed_block_bytes(Format f) {
  return quant_offset(f) + static_cast<size_t>(f.group_blocks) * quant_bytes(f);
}

// Block b of a tile: the head of its group (scales, mins, sub-scales) and its quants.
struct BlockRef {
  const std::byte* head;
  const std::byte* quants;
  int64_t j;  // the block's index within its group
};

template <typename Byte>
inline BlockRef block_ref(Format f, const Byte* tile, size_t block_bytes, int64_t b) {
  const auto* head =
      reinterpret_cast<const std::byte*>(tile) + static_cast<size_t>(b / f.group_blocks) * block_bytes;
  const int64_t j = b % f.group_blocks;
  return {head, head + quant_offset(f) + static_cast<size_t>(j) * quant_bytes(f), j};
}

// Bytes before a tile's first block (or first k): the 16 rows' f32 scales of row-scaled dtypes.
constexpr size_t tile_header_bytes(DType dtype) {
  return dtype_has_row_scale(dtype) ? kQuantTileRows * sizeof(float) : 0;
}

// One source block of 32 values decoded for packing: quants as u8 (value + offset), and the
// scale / min as the packed block stores them (f16 bits: a K-quant's superblock d and dmin),
// a K-quant's integer sub-scale and sub-min, and Q6_K's half scales.
struct SourceBlock {
  uint8_t q[32];
  uint16_t d16 = 0, m16 = 0;
  uint8_t sc = 0, mn = 0;
  int8_t sub[2] = {0, 0};
};

// Decodes block b (32 values) of a row of `dtype`.
// Inlined into each dtype's packer (pack_quant_row), where dtype is a constant.
__attribute__((always_inline)) inline SourceBlock decode_block(DType dtype, const uint8_t* row, int64_t b) {
  SourceBlock out;
  const int64_t per_super = 8;  // 32-value blocks per 256-value K-quant superblock
  switch (dtype) {
    case DType::kQ8_0: {
      const uint8_t* s = row + b * 34;
      out.d16 = load_u16(s);
      for (int j = 0; j < 32; ++j) out.q[j] = static_cast<uint8_t>(s[2 + j] ^ 0x80);
      break;
    }
    case DType::kI8:
      for (int j = 0; j < 32; ++j) out.q[j] = static_cast<uint8_t>(row[b * 32 + j] ^ 0x80);
      break;
    case DType::kQ4_G128:
    case DType::kQ4_G64: {
      const int64_t group = q4_group_size(dtype), per_group = group / 32;
      const uint8_t* s = row + (b / per_group) * (4 + group / 2);
      out.d16 = load_u16(s);
      out.m16 = load_u16(s + 2);
      for (int j = 0; j < 32; ++j) {
        const int64_t v = (b % per_group) * 32 + j;  // value within the group
        out.q[j] = v < group / 2 ? (s[4 + v] & 0x0f) : (s[4 + v - group / 2] >> 4);
      }
      break;
    }
    case DType::kQ4_0:
    case DType::kQ4_1: {
      const bool min = dtype == DType::kQ4_1;
      const uint8_t* s = row + b * (min ? 20 : 18);
      out.d16 = load_u16(s);
      if (min) out.m16 = load_u16(s + 2);
      const uint8_t* qs = s + (min ? 4 : 2);
      for (int j = 0; j < 16; ++j) {
        out.q[j] = qs[j] & 0x0f;
        out.q[j + 16] = qs[j] >> 4;
      }
      break;
    }
    case DType::kQ5_0:
    case DType::kQ5_1: {
      const bool min = dtype == DType::kQ5_1;
      const uint8_t* s = row + b * (min ? 24 : 22);
      out.d16 = load_u16(s);
      if (min) out.m16 = load_u16(s + 2);
      const uint32_t qh = load_u32(s + (min ? 4 : 2));
      const uint8_t* qs = s + (min ? 8 : 6);
      for (int j = 0; j < 16; ++j) {
        out.q[j] = static_cast<uint8_t>((qs[j] & 0x0f) | (((qh >> j) & 1u) << 4));
        out.q[j + 16] = static_cast<uint8_t>((qs[j] >> 4) | (((qh >> (j + 16)) & 1u) << 4));
      }
      break;
    }
    case DType::kQ4_K:
    case DType::kQ5_K: {
      const bool five = dtype == DType::kQ5_K;
      const uint8_t* s = row + (b / per_super) * (five ? 176 : 144);
      const int j = static_cast<int>(b % per_super);  // sub-block
      out.d16 = load_u16(s);                          // value = d * sc * q - dmin * mn
      out.m16 = load_u16(s + 2);
      k_scale_min(j, s + 4, &out.sc, &out.mn);
      const uint8_t* ql = s + (five ? 48 : 16) + (j / 2) * 32;
      for (int l = 0; l < 32; ++l) {
        int v = j % 2 == 0 ? (ql[l] & 0x0f) : (ql[l] >> 4);
        if (five) v += ((s[16 + l] >> j) & 1) << 4;
        out.q[l] = static_cast<uint8_t>(v);
      }
      break;
    }
    case DType::kIQ4_NL:
    case DType::kIQ4_XS: {
      const uint8_t* qs;
      if (dtype == DType::kIQ4_NL) {
        out.d16 = load_u16(row + b * 18);
        qs = row + b * 18 + 2;
      } else {
        const uint8_t* s = row + (b / per_super) * 136;
        const int j = static_cast<int>(b % per_super);
        out.d16 = load_u16(s);
        const int ls = iq4_xs_scale(load_u16(s + 2), s + 4, j);
        out.sc = static_cast<uint8_t>(static_cast<int8_t>(ls - 32));
        qs = s + 8 + 16 * j;
      }
      for (int l = 0; l < 16; ++l) {
        out.q[l] = qs[l] & 0x0f;
        out.q[l + 16] = qs[l] >> 4;
      }
      break;
    }
    case DType::kIQ3_XXS:
    case DType::kIQ3_S: {
      const bool xxs = dtype == DType::kIQ3_XXS;
      const uint8_t* s = row + (b / per_super) * (xxs ? 98 : 110);
      const int j = static_cast<int>(b % per_super);
      out.d16 = load_u16(s);
      const int m = xxs ? iq3_xxs_block(s, j, out.q) : iq3_s_block(s, j, out.q);
      out.sc = static_cast<uint8_t>(static_cast<int8_t>(m));  // i8, as IQ4_XS's ls - 32
      break;
    }
    case DType::kIQ2_S:
    case DType::kIQ2_XS:
    case DType::kIQ2_XXS:
    case DType::kIQ1_S:
    case DType::kIQ1_M: {
      const uint8_t* s = row + (b / per_super) * static_cast<size_t>(dtype_info(dtype).block_bytes);
      const int j = static_cast<int>(b % per_super);
      int m[2];
      out.d16 = low_bit_grid_block(dtype, s, j, out.q, m);
      if (format_of(dtype).sub_scales) {  // one m per half, as Q6_K's head; else as IQ3_XXS's
        out.sub[0] = static_cast<int8_t>(m[0]);
        out.sub[1] = static_cast<int8_t>(m[1]);
      } else {
        out.sc = static_cast<uint8_t>(static_cast<int8_t>(m[0]));  // i8, as IQ4_XS's ls - 32
      }
      // Codes sign << 3 | level (IQ1: the delta's sign) to 3 bits, sign << 2 | level: a crumb and
      // a plane bit.
      for (int w = 0; w < 4; ++w) {  // bit 3 to bit 2, 8 codes at a time
        uint64_t c;
        std::memcpy(&c, out.q + 8 * w, 8);
        c = (c & 0x0303030303030303ull) | ((c >> 1) & 0x0404040404040404ull);
        std::memcpy(out.q + 8 * w, &c, 8);
      }
      break;
    }
    case DType::kTQ1_0:
    case DType::kTQ2_0: {
      const bool one = dtype == DType::kTQ1_0;
      const uint8_t* s = row + (b / per_super) * static_cast<size_t>(dtype_info(dtype).block_bytes);
      const int first = 32 * static_cast<int>(b % per_super);
      out.d16 = load_u16(s + (one ? 52 : 64));
      if (one && first < 160) {  // digit first / 32 of qs[l] (tq1_0_q)
        for (int l = 0; l < 32; ++l) out.q[l] = static_cast<uint8_t>(tq1_0_digit(s[l], first / 32));
      } else if (one) {
        for (int l = 0; l < 32; ++l) out.q[l] = static_cast<uint8_t>(tq1_0_q(s, first + l));
      } else {
        k_low2_block(s, first / 32, out.q);  // tq2_0_q
      }
      break;
    }
    case DType::kQ2_K:
    case DType::kQ3_K: {
      // Block j of 32 is values 32j.. of the superblock; its halves are sub-blocks 2j, 2j + 1.
      const bool two = dtype == DType::kQ2_K;
      const uint8_t* s = row + (b / per_super) * (two ? 84 : 110);
      const int j = static_cast<int>(b % per_super);
      k_low2_block(s + (two ? 16 : 32), j, out.q);
      if (!two) {
        for (int l = 0; l < 32; ++l)
          out.q[l] |= static_cast<uint8_t>(((s[l] >> j) & 1) << 2);  // hmask bit j of byte l
      }
      if (two) {
        out.d16 = load_u16(s + 80);
        out.m16 = load_u16(s + 82);
        out.sub[0] = static_cast<int8_t>(s[2 * j]);  // sc | mn << 4
        out.sub[1] = static_cast<int8_t>(s[2 * j + 1]);
      } else {
        out.d16 = load_u16(s + 108);
        for (int h = 0; h < 2; ++h) out.sub[h] = static_cast<int8_t>(q3_k_scale(s + 96, 2 * j + h));
      }
      break;
    }
    case DType::kQ6_K: {
      const uint8_t* s = row + (b / per_super) * 210;
      const int j = static_cast<int>(b % per_super);  // values 32j .. 32j+31 of the superblock
      out.d16 = load_u16(s + 208);
      const int half = j / 4;     // 128-value half of the superblock
      const int quarter = j % 4;  // which of y[l], y[l+32], y[l+64], y[l+96]
      const uint8_t* ql = s + half * 64;
      const uint8_t* qh = s + 128 + half * 32;
      const auto* sc = reinterpret_cast<const int8_t*>(s + 192 + half * 8);
      for (int l = 0; l < 32; ++l) {
        // quarter 0: low nibbles of ql[0..31], 1: low of ql[32..63], 2: high of ql[0..31], 3: high of
        // ql[32..63]
        const uint8_t byte = ql[l + (quarter % 2) * 32];
        const uint8_t lo = quarter < 2 ? (byte & 0x0f) : (byte >> 4);
        out.q[l] = static_cast<uint8_t>(lo | (((qh[l] >> (2 * quarter)) & 3) << 4));
      }
      out.sub[0] = sc[quarter * 2];
      out.sub[1] = sc[quarter * 2 + 1];
      break;
    }
    default: break;
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Scalar path (the reference).

struct TileArgs {
  const std::byte* tile;   // the first block
  const float* row_scale;  // the tile's 16 row scales (row-scaled formats), else null
  int64_t blocks;
  size_t block_bytes;
  const QuantizedActivations* x;
  int64_t first_token;
  int num_tokens;
  float* out;            // [num_tokens][16]
  const std::byte* end;  // end of the packed weight: prefetches stay inside it
  // The AMX kernel's operands (16 tokens): the tile's weights as signed bytes (B tiles), and the
  // tokens' block scales and scaled sums as [block][16 tokens].
  const int8_t* amx_weights = nullptr;
  const float* amx_scales = nullptr;
  const float* amx_scaled_sums = nullptr;
};

// The stored u8 quant of value k (0..31) of row r in a packed block: group g = k / 4 holds
// values 4g..4g+3 (nibble formats: groups 4..7 are the high nibbles of groups 0..3); the bits
// above a nibble sit at the same byte position of the high plane, bit g (one bit) or bits
// 2(g % 4) and up of plane g / 4 (two bits).
inline int stored_quant(const uint8_t* quants, Format f, int r, int k) {
  const int g = k / 4, pos = 4 * r + k % 4;
  if (f.crumbs) {
    int q = (quants[64 * (g % 2) + pos] >> (2 * (g / 2))) & 3;
    if (f.high_bits == 1) q |= ((quants[128 + pos] >> g) & 1) << 2;
    return f.lookup != nullptr ? f.lookup->biased[static_cast<size_t>(q)] : q;
  }
  if (!f.nibbles) return quants[64 * g + pos];
  const uint8_t byte = quants[64 * (g % 4) + pos];
  int q = g < 4 ? (byte & 0x0f) : (byte >> 4);
  if (f.high_bits == 1) q |= ((quants[256 + pos] >> g) & 1) << 4;
  if (f.high_bits == 2) q |= ((quants[256 + 64 * (g / 4) + pos] >> (2 * (g % 4))) & 3) << 4;
  return f.lookup != nullptr ? f.lookup->biased[static_cast<size_t>(q)] : q;
}

// Block j's scale and min of row r from its group's head (see Format).
inline float block_scale(Format f, const uint8_t* head, int64_t j, int r) {
  if (f.k_scales) {
    const float d = load_f16(head + 2 * r);
    if (f.has_min && !f.sub_scales) return d * static_cast<float>(head[sub_offset(f) + 16 * j + r]);
    const float dm =
        f.sub_scales ? d : d * static_cast<float>(static_cast<int8_t>(head[sub_offset(f) + 16 * j + r]));
    return f.scale_shift != 0 ? dm * scale_factor(f) : dm;
  }
  return load_f16(head + 2 * r);
}

inline float block_min(Format f, const uint8_t* head, int64_t j, int r) {
  if (f.k_scales)
    return -(load_f16(head + min_offset(f) + 2 * r) *
             static_cast<float>(head[sub_offset(f) + 16 * (f.group_blocks + j) + r]));
  return load_f16(head + min_offset(f) + 2 * r);
}

template <DType DT>
void tile_scalar(const TileArgs& a) {
  constexpr Format f = format_of(DT);
  for (int t = 0; t < a.num_tokens; ++t) {
    const int8_t* xq = a.x->q(a.first_token + t);
    const float* xd = a.x->scale(a.first_token + t);
    const float* xss = a.x->scaled_sum(a.first_token + t);
    const int32_t* xhs = a.x->half_sum(a.first_token + t);
    float acc[kQuantTileRows] = {};
    for (int64_t b = 0; b < a.blocks; ++b) {
      const BlockRef ref = block_ref(f, a.tile, a.block_bytes, b);
      const auto* blk = reinterpret_cast<const uint8_t*>(ref.head);
      const auto* quants = reinterpret_cast<const uint8_t*>(ref.quants);
      const int8_t* xb = xq + b * kQuantBlockValues;
      for (int r = 0; r < kQuantTileRows; ++r) {
        int32_t half[2] = {0, 0};
        for (int k = 0; k < 32; ++k) half[k / 16] += (stored_quant(quants, f, r, k) - f.offset) * xb[k];
        int32_t dot = half[0] + half[1];
        int32_t min_dot = 0;  // Q2_K: sum over the halves of mn * sum(x)
        if constexpr (half_mins(f)) {
          const uint8_t* sub = blk + sub_offset(f) + 32 * ref.j;
          dot = (sub[r] & 15) * half[0] + (sub[16 + r] & 15) * half[1];
          min_dot = (sub[r] >> 4) * xhs[2 * b] + (sub[16 + r] >> 4) * xhs[2 * b + 1];
        } else if constexpr (f.sub_scales) {
          const auto* sub = reinterpret_cast<const int8_t*>(blk + sub_offset(f) + 32 * ref.j);
          dot = sub[r] * half[0] + sub[16 + r] * half[1];
        }
        if constexpr (f.row_scales) {
          acc[r] = std::fma(xd[b], static_cast<float>(dot), acc[r]);
          continue;
        }
        const float dw = block_scale(f, blk, ref.j, r);
        acc[r] = std::fma(dw * xd[b], static_cast<float>(dot), acc[r]);
        if constexpr (half_mins(f)) {
          const float mw = -load_f16(blk + min_offset(f) + 2 * r);
          acc[r] = std::fma(mw * xd[b], static_cast<float>(min_dot), acc[r]);
        } else if constexpr (f.has_min) {
          acc[r] = std::fma(block_min(f, blk, ref.j, r), xss[b], acc[r]);
        }
      }
    }
    if constexpr (f.row_scales)
      for (int r = 0; r < kQuantTileRows; ++r) acc[r] *= a.row_scale[r];
    std::memcpy(a.out + t * kQuantTileRows, acc, sizeof(acc));
  }
}

// Rounds to nearest even and clamps to +-127; NaN gives -127, as the vector path's conversion does.
__attribute__((always_inline)) inline int8_t round_clamp(float v) {
  const float r = std::nearbyint(v);
  if (r >= 127.0f) return 127;
  if (r > -127.0f) return static_cast<int8_t>(r);
  return -127;
}

__attribute__((always_inline)) inline void quantize_row_generic(const float* x, int64_t k, int8_t* q,
                                                                float* scale, int32_t* sum, float* scaled_sum,
                                                                int32_t* half_sum) {
  for (int64_t b = 0; b < k / kQuantBlockValues; ++b) {
    const float* xb = x + b * kQuantBlockValues;
    float amax = 0.0f;
    for (int j = 0; j < kQuantBlockValues; ++j) amax = std::max(amax, std::fabs(xb[j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    int32_t s[2] = {0, 0};
    for (int j = 0; j < kQuantBlockValues; ++j) {
      const int8_t v = round_clamp(xb[j] * id);
      q[b * kQuantBlockValues + j] = v;
      s[j / 16] += v;
    }
    scale[b] = d;
    sum[b] = s[0] + s[1];
    half_sum[2 * b] = s[0];
    half_sum[2 * b + 1] = s[1];
    scaled_sum[b] = d * static_cast<float>(s[0] + s[1]);
  }
}

// Epilogues: a tile's [num_tokens][16] results into y (+ bias), or silu(gate) * up.
__attribute__((always_inline)) inline void store_generic(const float* out, int nt, int rows, float* y,
                                                         int64_t ld, const float* bias) {
  for (int t = 0; t < nt; ++t)
    for (int r = 0; r < rows; ++r)
      y[t * ld + r] = out[t * kQuantTileRows + r] + (bias != nullptr ? bias[r] : 0.0f);
}

__attribute__((always_inline)) inline void swiglu_generic(const float* gate, const float* up, int nt,
                                                          int rows, float* y, int64_t ld) {
  for (int t = 0; t < nt; ++t) {
    for (int r = 0; r < rows; ++r) {
      const float g = gate[t * kQuantTileRows + r];
      y[t * ld + r] = g / (1.0f + exp_poly(-g)) * up[t * kQuantTileRows + r];
    }
  }
}

void store_scalar(const float* out, int nt, int rows, float* y, int64_t ld, const float* bias) {
  store_generic(out, nt, rows, y, ld, bias);
}

void swiglu_scalar(const float* gate, const float* up, int nt, int rows, float* y, int64_t ld) {
  swiglu_generic(gate, up, nt, rows, y, ld);
}

#if defined(__x86_64__)

// The portable epilogues and activation quantization compiled for AVX2 + FMA (fma and rounding
// inline instead of libm calls; the same bits).
INFERD_AVX2 void store_avx2(const float* out, int nt, int rows, float* y, int64_t ld, const float* bias) {
  store_generic(out, nt, rows, y, ld, bias);
}

INFERD_AVX2 void swiglu_avx2(const float* gate, const float* up, int nt, int rows, float* y, int64_t ld) {
  swiglu_generic(gate, up, nt, rows, y, ld);
}

INFERD_AVX2 void quantize_row_avx2(const float* x, int64_t k, int8_t* q, float* scale, int32_t* sum,
                                   float* scaled_sum, int32_t* half_sum) {
  quantize_row_generic(x, k, q, scale, sum, scaled_sum, half_sum);
}

// ---------------------------------------------------------------------------------------------
// AVX2 path: the 16 rows as two halves of 8 lanes; vpmaddubsw + vpmaddwd per group of 4 bytes.
// Q8_0's stored quants reach 255, which vpmaddubsw could saturate, so its dot is taken signed
// (sign trick) and needs no offset; the other formats' quants are at most 63.

// 8 u8 (i8) at p as f32.
INFERD_AVX2 __attribute__((always_inline)) inline __m256 u8x8_ps(const std::byte* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}
INFERD_AVX2 __attribute__((always_inline)) inline __m256 i8x8_ps(const std::byte* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}

template <DType DT, int NT>
INFERD_AVX2 void tile_avx2(const TileArgs& a) {
  constexpr Format f = format_of(DT);
  constexpr bool kSigned = f.offset == 128;  // Q8_0, I8
  constexpr int32_t offset = kSigned ? 0 : f.offset;
  const __m256i ones16 = _mm256_set1_epi16(1);
  const __m256i low4 = _mm256_set1_epi8(0x0f);
  const __m256i sign_flip = _mm256_set1_epi8(static_cast<char>(0x80));
  for (int h = 0; h < 2; ++h) {
    __m256 acc[NT];
    for (int t = 0; t < NT; ++t) acc[t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < a.blocks; ++b) {
      const BlockRef ref = block_ref(f, a.tile, a.block_bytes, b);
      const std::byte* blk = ref.head;
      __m256 dw = _mm256_setzero_ps(), mw = _mm256_setzero_ps();
      if constexpr (f.row_scales) {
      } else if constexpr (f.k_scales) {
        dw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 16 * h)));
        if constexpr (half_mins(f)) {  // Q2_K: -dmin, the sub-mins are integers
          mw = _mm256_xor_ps(_mm256_cvtph_ps(_mm_loadu_si128(
                                 reinterpret_cast<const __m128i*>(blk + min_offset(f) + 16 * h))),
                             _mm256_set1_ps(-0.0f));
        } else if constexpr (f.sub_scales) {
        } else if constexpr (f.has_min) {
          dw = _mm256_mul_ps(dw, u8x8_ps(blk + sub_offset(f) + 16 * static_cast<size_t>(ref.j) + 8 * h));
          const __m256 dmin = _mm256_cvtph_ps(
              _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + min_offset(f) + 16 * h)));
          mw = _mm256_xor_ps(
              _mm256_mul_ps(dmin, u8x8_ps(blk + sub_offset(f) +
                                          16 * static_cast<size_t>(f.group_blocks + ref.j) + 8 * h)),
              _mm256_set1_ps(-0.0f));
        } else if constexpr (!f.sub_scales) {  // IQ4_XS: d * (ls - 32); IQ3: d * m
          dw = _mm256_mul_ps(dw, i8x8_ps(blk + sub_offset(f) + 16 * static_cast<size_t>(ref.j) + 8 * h));
        }
        if constexpr (f.scale_shift != 0) dw = _mm256_mul_ps(dw, _mm256_set1_ps(scale_factor(f)));
      } else {
        dw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 16 * h)));
        if constexpr (f.has_min)
          mw = _mm256_cvtph_ps(
              _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + min_offset(f) + 16 * h)));
      }
      __m256i sub0 = _mm256_setzero_si256(), sub1 = _mm256_setzero_si256();
      __m256i mn0 = _mm256_setzero_si256(), mn1 = _mm256_setzero_si256();
      if constexpr (half_mins(f)) {
        const std::byte* sub = blk + sub_offset(f) + 32 * static_cast<size_t>(ref.j);
        const __m256i raw0 =
            _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sub + 8 * h)));
        const __m256i raw1 =
            _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sub + 16 + 8 * h)));
        const __m256i low = _mm256_set1_epi32(15);
        sub0 = _mm256_and_si256(raw0, low);
        sub1 = _mm256_and_si256(raw1, low);
        mn0 = _mm256_srli_epi32(raw0, 4);
        mn1 = _mm256_srli_epi32(raw1, 4);
      } else if constexpr (f.sub_scales) {
        const std::byte* sub = blk + sub_offset(f) + 32 * static_cast<size_t>(ref.j);
        sub0 = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sub + 8 * h)));
        sub1 = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sub + 16 + 8 * h)));
      }
      const std::byte* qs = ref.quants;
      __m256i w[8];
      if constexpr (f.crumbs) {
        const __m256i low2 = _mm256_set1_epi8(0x03);
        for (int p = 0; p < 2; ++p) {
          const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 64 * p + 32 * h));
          for (int c = 0; c < 4; ++c) w[p + 2 * c] = _mm256_and_si256(_mm256_srli_epi16(raw, 2 * c), low2);
        }
        if constexpr (f.high_bits == 1) {  // bit g of the plane to bit 2
          const __m256i hb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 128 + 32 * h));
          const __m256i mask = _mm256_set1_epi8(0x04);
          for (int g = 0; g < 8; ++g) {
            const __m256i moved = g <= 2 ? _mm256_slli_epi16(hb, 2 - g) : _mm256_srli_epi16(hb, g - 2);
            w[g] = _mm256_or_si256(w[g], _mm256_and_si256(moved, mask));
          }
        }
      } else if constexpr (f.nibbles) {
        for (int g = 0; g < 4; ++g) {
          const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 64 * g + 32 * h));
          w[g] = _mm256_and_si256(raw, low4);
          w[g + 4] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4);
        }
        if constexpr (f.high_bits > 0) {
          // Group g's bits above the nibble to bits 4 (and 5): bit g of the one-bit plane, bits
          // 2(g % 4) of two-bit plane g / 4.
          constexpr int kBits = f.high_bits;
          const __m256i mask = _mm256_set1_epi8(static_cast<char>(kBits == 1 ? 0x10 : 0x30));
          for (int g = 0; g < 8; ++g) {
            const int plane = kBits == 1 ? 0 : g / 4, bit = kBits == 1 ? g : 2 * (g % 4);
            const __m256i hb =
                _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 256 + 64 * plane + 32 * h));
            const __m256i moved = bit <= 4 ? _mm256_slli_epi16(hb, 4 - bit) : _mm256_srli_epi16(hb, bit - 4);
            w[g] = _mm256_or_si256(w[g], _mm256_and_si256(moved, mask));
          }
        }
      } else {
        for (int g = 0; g < 8; ++g) {
          w[g] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 64 * g + 32 * h));
          if constexpr (kSigned) w[g] = _mm256_xor_si256(w[g], sign_flip);
        }
      }
      // The table's signed values: kSigned's dot takes them as they are.
      if constexpr (f.lookup != nullptr) {
        const __m256i table = _mm256_broadcastsi128_si256(
            _mm_load_si128(reinterpret_cast<const __m128i*>(f.lookup->values.data())));
        for (int g = 0; g < 8; ++g) w[g] = _mm256_shuffle_epi8(table, w[g]);
      }
      for (int t = 0; t < NT; ++t) {
        const int8_t* xb = a.x->q(a.first_token + t) + b * kQuantBlockValues;
        __m256i part[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
        for (int g = 0; g < 8; ++g) {
          const __m256i xv = _mm256_set1_epi32(static_cast<int>(load_u32(xb + 4 * g)));
          __m256i p;
          if constexpr (kSigned) {
            p = _mm256_maddubs_epi16(_mm256_sign_epi8(w[g], w[g]), _mm256_sign_epi8(xv, w[g]));
          } else {
            p = _mm256_maddubs_epi16(w[g], xv);
          }
          part[g / 4] = _mm256_add_epi32(part[g / 4], _mm256_madd_epi16(p, ones16));
        }
        const int32_t* hs = a.x->half_sum(a.first_token + t) + 2 * b;
        __m256i dot, min_dot = _mm256_setzero_si256();
        if constexpr (half_mins(f))
          min_dot = _mm256_add_epi32(_mm256_mullo_epi32(mn0, _mm256_set1_epi32(hs[0])),
                                     _mm256_mullo_epi32(mn1, _mm256_set1_epi32(hs[1])));
        if constexpr (f.sub_scales) {
          part[0] = _mm256_sub_epi32(part[0], _mm256_set1_epi32(offset * hs[0]));
          part[1] = _mm256_sub_epi32(part[1], _mm256_set1_epi32(offset * hs[1]));
          dot = _mm256_add_epi32(_mm256_mullo_epi32(part[0], sub0), _mm256_mullo_epi32(part[1], sub1));
        } else {
          dot = _mm256_add_epi32(part[0], part[1]);
          if constexpr (offset != 0)
            dot = _mm256_sub_epi32(dot, _mm256_set1_epi32(offset * a.x->sum(a.first_token + t)[b]));
        }
        const __m256 dx = _mm256_set1_ps(a.x->scale(a.first_token + t)[b]);
        const __m256 dwdx = f.row_scales ? dx : _mm256_mul_ps(dw, dx);
        acc[t] = _mm256_fmadd_ps(dwdx, _mm256_cvtepi32_ps(dot), acc[t]);
        if constexpr (half_mins(f))
          acc[t] = _mm256_fmadd_ps(_mm256_mul_ps(mw, dx), _mm256_cvtepi32_ps(min_dot), acc[t]);
        else if constexpr (f.has_min)
          acc[t] = _mm256_fmadd_ps(mw, _mm256_set1_ps(a.x->scaled_sum(a.first_token + t)[b]), acc[t]);
      }
    }
    if constexpr (f.row_scales) {
      const __m256 rs = _mm256_loadu_ps(a.row_scale + 8 * h);
      for (int t = 0; t < NT; ++t) acc[t] = _mm256_mul_ps(acc[t], rs);
    }
    for (int t = 0; t < NT; ++t) _mm256_storeu_ps(a.out + t * kQuantTileRows + 8 * h, acc[t]);
  }
}

// ---------------------------------------------------------------------------------------------
// The 512-bit paths' reading of a packed block (VNNI, AVX-512 and AMX kernels): its 16 rows'
// scales, mins and Q6_K's half scales, and its quants as u8 (q + offset), group g in w[g].

INFERD_AVX512 __attribute__((always_inline)) inline __m512 f16x16_ps(const std::byte* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

INFERD_AVX512 __attribute__((always_inline)) inline __m512 u8x16_ps(const std::byte* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}

INFERD_AVX512 __attribute__((always_inline)) inline __m512 i8x16_ps(const std::byte* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}

// Q2_K's sub-mins go to mn0, mn1 (and mw = -dmin).
template <DType DT>
INFERD_AVX512 __attribute__((always_inline)) inline void load_scales512(const BlockRef& ref, __m512& dw,
                                                                        __m512& mw, __m512i& sub0,
                                                                        __m512i& sub1, __m512i& mn0,
                                                                        __m512i& mn1) {
  constexpr Format f = format_of(DT);
  const std::byte* blk = ref.head;
  if constexpr (f.row_scales) {
  } else if constexpr (f.k_scales) {
    dw = f16x16_ps(blk);
    if constexpr (half_mins(f)) {
      mw = _mm512_xor_ps(f16x16_ps(blk + min_offset(f)), _mm512_set1_ps(-0.0f));
    } else if constexpr (f.sub_scales) {
    } else if constexpr (f.has_min) {
      dw = _mm512_mul_ps(dw, u8x16_ps(blk + sub_offset(f) + 16 * static_cast<size_t>(ref.j)));
      mw = _mm512_xor_ps(
          _mm512_mul_ps(f16x16_ps(blk + min_offset(f)),
                        u8x16_ps(blk + sub_offset(f) + 16 * static_cast<size_t>(f.group_blocks + ref.j))),
          _mm512_set1_ps(-0.0f));
    } else if constexpr (!f.sub_scales) {  // IQ4_XS: d * (ls - 32); IQ3: d * m
      dw = _mm512_mul_ps(dw, i8x16_ps(blk + sub_offset(f) + 16 * static_cast<size_t>(ref.j)));
    }
    if constexpr (f.scale_shift != 0) dw = _mm512_mul_ps(dw, _mm512_set1_ps(scale_factor(f)));
  } else {
    dw = f16x16_ps(blk);
    if constexpr (f.has_min) mw = f16x16_ps(blk + min_offset(f));
  }
  if constexpr (half_mins(f)) {
    const std::byte* sub = blk + sub_offset(f) + 32 * static_cast<size_t>(ref.j);
    const __m512i raw0 = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sub)));
    const __m512i raw1 = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sub + 16)));
    const __m512i low = _mm512_set1_epi32(15);
    sub0 = _mm512_and_si512(raw0, low);
    sub1 = _mm512_and_si512(raw1, low);
    mn0 = _mm512_srli_epi32(raw0, 4);
    mn1 = _mm512_srli_epi32(raw1, 4);
  } else if constexpr (f.sub_scales) {
    const std::byte* sub = blk + sub_offset(f) + 32 * static_cast<size_t>(ref.j);
    sub0 = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sub)));
    sub1 = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sub + 16)));
  }
  (void)mn0;
  (void)mn1;
}

template <DType DT>
INFERD_AVX512 __attribute__((always_inline)) inline void load_quants512(const std::byte* qs,
                                                                        __m512i (&w)[8]) {
  constexpr Format f = format_of(DT);
  if constexpr (f.crumbs) {
    const __m512i low2 = _mm512_set1_epi8(0x03);
    for (int p = 0; p < 2; ++p) {
      const __m512i raw = _mm512_loadu_si512(qs + 64 * p);
      for (int c = 0; c < 4; ++c)
        w[p + 2 * c] = _mm512_and_si512(_mm512_srli_epi16(raw, static_cast<unsigned>(2 * c)), low2);
    }
    if constexpr (f.high_bits == 1) {  // bit g of the plane to bit 2 (see stored_quant)
      const __m512i hb = _mm512_loadu_si512(qs + 128);
      const __m512i mask = _mm512_set1_epi8(0x04);
      for (int g = 0; g < 8; ++g) {
        const __m512i moved = g <= 2 ? _mm512_slli_epi16(hb, static_cast<unsigned>(2 - g))
                                     : _mm512_srli_epi16(hb, static_cast<unsigned>(g - 2));
        w[g] = _mm512_ternarylogic_epi32(w[g], moved, mask, 0xf8);  // w | (moved & mask)
      }
    }
  } else if constexpr (f.nibbles) {
    const __m512i low4 = _mm512_set1_epi8(0x0f);
    for (int g = 0; g < 4; ++g) {
      const __m512i raw = _mm512_loadu_si512(qs + 64 * g);
      w[g] = _mm512_and_si512(raw, low4);
      w[g + 4] = _mm512_and_si512(_mm512_srli_epi16(raw, 4), low4);
    }
    if constexpr (f.high_bits > 0) {  // see stored_quant
      constexpr int kBits = f.high_bits;
      const __m512i mask = _mm512_set1_epi8(static_cast<char>(kBits == 1 ? 0x10 : 0x30));
      for (int g = 0; g < 8; ++g) {
        const int plane = kBits == 1 ? 0 : g / 4, bit = kBits == 1 ? g : 2 * (g % 4);
        const __m512i hb = _mm512_loadu_si512(qs + 256 + 64 * plane);
        const __m512i moved = bit <= 4 ? _mm512_slli_epi16(hb, static_cast<unsigned>(4 - bit))
                                       : _mm512_srli_epi16(hb, static_cast<unsigned>(bit - 4));
        w[g] = _mm512_ternarylogic_epi32(w[g], moved, mask, 0xf8);  // w | (moved & mask)
      }
    }
  } else {
    for (int g = 0; g < 8; ++g) w[g] = _mm512_loadu_si512(qs + 64 * g);
  }
  if constexpr (f.lookup != nullptr) {
    const __m512i table =
        _mm512_broadcast_i32x4(_mm_load_si128(reinterpret_cast<const __m128i*>(f.lookup->biased.data())));
    for (int g = 0; g < 8; ++g) w[g] = _mm512_shuffle_epi8(table, w[g]);
  }
}

// ---------------------------------------------------------------------------------------------
// AVX512-VNNI path: one vpdpbusd per group of 4 bytes covers all 16 rows. AVX-512 without VNNI:
// the same kernel with the dot product from vpmaddubsw + vpmaddwd (bit-identical sums).

// acc + w . (the 4 bytes at x + kOffset, broadcast): the broadcast as vpdpbusd's {1to16} memory
// operand, one instruction where the intrinsics give two (GCC 12 emits a separate vpbroadcastd), as
// dp_broadcast does for BF16. The activations were quantized before the kernel was called.
template <int kOffset>
INFERD_VNNI inline __m512i dpbusd_broadcast(__m512i acc, __m512i w, const int8_t* x) {
#if defined(__GNUC__)
  asm("vpdpbusd %c3(%2)%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "r"(x), "i"(kOffset));
  return acc;
#else
  return _mm512_dpbusd_epi32(acc, w, _mm512_set1_epi32(static_cast<int>(load_u32(x + kOffset))));
#endif
}

#define INFERD_TILE512_NAME tile_vnni
#define INFERD_TILE512_TARGET INFERD_VNNI
#define INFERD_TILE512_DOT(acc, w, xp, offset) dpbusd_broadcast<offset>(acc, w, xp)
#include "kernels/packed_tile512.inc"
#undef INFERD_TILE512_NAME
#undef INFERD_TILE512_TARGET
#undef INFERD_TILE512_DOT

// acc + sum_j u8(w_j) * s8(x_j) per 32-bit lane, as vpdpbusd computes it. vpmaddubsw saturates
// pairs above 32767, which only Q8_0's and I8's stored quants (q + 128, up to 255) can reach: for those the
// signed sum q * x is taken with the sign moved onto x, and 128 * sum(x) added back.
template <DType DT>
INFERD_AVX512 inline __m512i dot4_avx512bw(__m512i acc, __m512i w, __m512i x) {
  const __m512i ones16 = _mm512_set1_epi16(1);
  if constexpr (format_of(DT).offset == 128) {  // Q8_0, I8
    const __m512i q = _mm512_xor_si512(w, _mm512_set1_epi8(static_cast<char>(0x80)));
    const __m512i x_signed = _mm512_mask_sub_epi8(x, _mm512_movepi8_mask(q), _mm512_setzero_si512(), x);
    const __m512i qx = _mm512_madd_epi16(_mm512_maddubs_epi16(_mm512_abs_epi8(q), x_signed), ones16);
    const __m512i sx = _mm512_madd_epi16(_mm512_maddubs_epi16(_mm512_set1_epi8(1), x), ones16);
    return _mm512_add_epi32(acc, _mm512_add_epi32(qx, _mm512_slli_epi32(sx, 7)));
  } else {
    return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(w, x), ones16));
  }
}

#define INFERD_TILE512_NAME tile_avx512bw
#define INFERD_TILE512_TARGET INFERD_AVX512
#define INFERD_TILE512_DOT(acc, w, xp, offset) \
  dot4_avx512bw<DT>(acc, w, _mm512_set1_epi32(static_cast<int>(load_u32((xp) + (offset)))))
#include "kernels/packed_tile512.inc"
#undef INFERD_TILE512_NAME
#undef INFERD_TILE512_TARGET
#undef INFERD_TILE512_DOT

// AMX-INT8 path: 16 tokens x 16 rows per block in one tile dot product (the VNNI kernel's sums).
#include "kernels/packed_tile_amx.inc"

INFERD_AVX512 void store_avx512(const float* out, int nt, int rows, float* y, int64_t ld, const float* bias) {
  const auto mask = static_cast<__mmask16>((1u << rows) - 1u);
  const __m512 b = bias != nullptr ? _mm512_maskz_loadu_ps(mask, bias) : _mm512_setzero_ps();
  for (int t = 0; t < nt; ++t)
    _mm512_mask_storeu_ps(y + t * ld, mask, _mm512_add_ps(_mm512_loadu_ps(out + t * kQuantTileRows), b));
}

INFERD_AVX512 void swiglu_avx512(const float* gate, const float* up, int nt, int rows, float* y, int64_t ld) {
  const auto mask = static_cast<__mmask16>((1u << rows) - 1u);
  const __m512 one = _mm512_set1_ps(1.0f);
  for (int t = 0; t < nt; ++t) {
    const __m512 g = _mm512_loadu_ps(gate + t * kQuantTileRows);
    const __m512 e = exp_avx512(_mm512_sub_ps(_mm512_setzero_ps(), g));
    const __m512 silu = _mm512_div_ps(g, _mm512_add_ps(one, e));
    _mm512_mask_storeu_ps(y + t * ld, mask, _mm512_mul_ps(silu, _mm512_loadu_ps(up + t * kQuantTileRows)));
  }
}

INFERD_AVX512 void quantize_row_avx512(const float* x, int64_t k, int8_t* q, float* scale, int32_t* sum,
                                       float* scaled_sum, int32_t* half_sum) {
  const __m512i lo = _mm512_set1_epi32(-127);
  const __m512i hi = _mm512_set1_epi32(127);
  for (int64_t b = 0; b < k / kQuantBlockValues; ++b) {
    const float* xb = x + b * kQuantBlockValues;
    const __m512 v0 = _mm512_loadu_ps(xb);
    const __m512 v1 = _mm512_loadu_ps(xb + 16);
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const __m512 idv = _mm512_set1_ps(id);
    const __m512i q0 = _mm512_min_epi32(_mm512_max_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(v0, idv)), lo), hi);
    const __m512i q1 = _mm512_min_epi32(_mm512_max_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(v1, idv)), lo), hi);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + b * kQuantBlockValues), _mm512_cvtepi32_epi8(q0));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + b * kQuantBlockValues + 16), _mm512_cvtepi32_epi8(q1));
    const int32_t s0 = _mm512_reduce_add_epi32(q0);
    const int32_t s1 = _mm512_reduce_add_epi32(q1);
    scale[b] = d;
    sum[b] = s0 + s1;
    half_sum[2 * b] = s0;
    half_sum[2 * b + 1] = s1;
    scaled_sum[b] = d * static_cast<float>(s0 + s1);
  }
}

#endif  // __x86_64__

// ---------------------------------------------------------------------------------------------
// Float weights (F32, F16, BF16, F8_E4M3): a tile is [K][16] of the source type, k-major. Per
// (token, row): two chains over k (even and odd k, each a sequence of fmas), added at the end;
// exact f32 arithmetic on the stored weights, no activation rounding. F8_E4M3 tiles start with
// their 16 rows' scales times 2^8: an E4M3 byte's bits shifted into an f16 are its value times
// 2^-8 exactly (subnormals included), so the chains run on value * 2^-8 and the sum is multiplied
// by scale * 2^8 at the end.
//
// BF16 weights are the exception: they run on the CPU's BF16 dot products (vdpbf16ps), as
// llama.cpp's BF16 path does, with the activations rounded to bf16 (nearest even) once per
// matmul. Per (token, row): two chains over pairs of k (pair p = inputs 2p, 2p+1 goes to chain
// p % 2; an odd K's last input pairs with a zero), each pair adding w[2p+1] * x[2p+1] and then
// w[2p] * x[2p] with one rounding each (vdpbf16ps's order; a product of two bf16 values is exact
// in f32, so an fma gives the same bits: that is how the paths without the instruction compute
// it). The only difference the instruction makes is its flushing of denormal inputs and results.

template <DType DT>
float weight_value(const std::byte* p) {
  if constexpr (DT == DType::kF32) {
    float v;
    std::memcpy(&v, p, 4);
    return v;
  } else if constexpr (DT == DType::kF16) {
    return load_f16(p);
  } else if constexpr (DT == DType::kF8_E4M3) {
    return f16_to_f32(fp8_e4m3_as_f16_bits(static_cast<uint8_t>(*p)));
  } else {
    return bf16_to_f32(load_u16(p));
  }
}

template <DType DT>
constexpr size_t float_elem_bytes() {
  return DT == DType::kF32 ? 4 : (DT == DType::kF8_E4M3 ? 1 : 2);
}

// BF16 tiles hold pairs of inputs side by side, what vdpbf16ps and TDPBF16PS take: pair p =
// inputs 2p, 2p + 1 of the 16 rows, (row, input) pairs of bf16 in 64 bytes; zeros past k up to
// a multiple of 16 inputs (the AMX kernel's step). Other float dtypes: [k][16 rows].
constexpr int64_t kBf16PackedStep = 16;
constexpr int64_t kBf16PrefetchPairs = 48;  // decode: 3 KiB ahead, as the integer kernel

constexpr int64_t float_packed_cols(DType dtype, int64_t k) {
  return dtype == DType::kBF16 ? (k + kBf16PackedStep - 1) / kBf16PackedStep * kBf16PackedStep : k;
}

// Byte offset of input k of row r in a BF16 tile.
constexpr size_t bf16_packed_offset(int64_t k, int r) {
  return static_cast<size_t>(((k / 2) * kQuantTileRows + r) * 2 + k % 2) * sizeof(uint16_t);
}

struct FloatTileArgs {
  const std::byte* tile;   // k = 0's 16 weights
  const float* row_scale;  // F8_E4M3: the 16 rows' scales * 2^8, else null
  int64_t k;
  const float* x;  // first token's row; rows k apart
  int num_tokens;
  float* out;            // [num_tokens][16]
  const std::byte* end;  // end of the packed weight: prefetches stay inside it
  // BF16 weights: the first token's activations rounded to bf16, rows kb = k rounded up to even
  // apart (a zero after an odd k).
  const uint16_t* xb = nullptr;
  int64_t kb = 0;
  // The pair kernels (float_pair_kernel): a second tile of the same k for the same tokens, and its
  // results.
  const std::byte* tile_b = nullptr;
  float* out_b = nullptr;
};

// The BF16 sums (see above), one fma at a time.
void bf16_tile_scalar(const FloatTileArgs& a) {
  for (int t = 0; t < a.num_tokens; ++t) {
    const uint16_t* x = a.xb + t * a.kb;
    for (int r = 0; r < kQuantTileRows; ++r) {
      float c[2] = {0.0f, 0.0f};
      auto w = [&](int64_t k) { return bf16_to_f32(load_u16(a.tile + bf16_packed_offset(k, r))); };
      for (int64_t p = 0; 2 * p < a.k; ++p) {
        float& acc = c[p % 2];
        acc = std::fma(w(2 * p + 1), bf16_to_f32(x[2 * p + 1]), acc);
        acc = std::fma(w(2 * p), bf16_to_f32(x[2 * p]), acc);
      }
      a.out[t * kQuantTileRows + r] = c[0] + c[1];
    }
  }
}

template <DType DT>
void float_tile_scalar(const FloatTileArgs& a) {
  if constexpr (DT == DType::kBF16) {
    bf16_tile_scalar(a);
    return;
  }
  constexpr size_t e = float_elem_bytes<DT>();
  for (int t = 0; t < a.num_tokens; ++t) {
    const float* x = a.x + t * a.k;
    for (int r = 0; r < kQuantTileRows; ++r) {
      float c[2] = {0.0f, 0.0f};
      for (int64_t k = 0; k < a.k; ++k)
        c[k % 2] = std::fma(weight_value<DT>(a.tile + (static_cast<size_t>(k) * kQuantTileRows + r) * e),
                            x[k], c[k % 2]);
      a.out[t * kQuantTileRows + r] = c[0] + c[1];
      if constexpr (DT == DType::kF8_E4M3) a.out[t * kQuantTileRows + r] *= a.row_scale[r];
    }
  }
}

#if defined(__x86_64__)
template <DType DT>
INFERD_VNNI inline __m512 load_weights16(const std::byte* p) {
  if constexpr (DT == DType::kF32) {
    return _mm512_loadu_ps(p);
  } else if constexpr (DT == DType::kF16) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  } else if constexpr (DT == DType::kF8_E4M3) {
    // fp8_e4m3_as_f16_bits: the byte sign-extended and shifted left by 7 has the sign in bit 15,
    // exponent and mantissa in bits 7..13, and a copy of the sign in bit 14, cleared.
    const __m256i w = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm512_cvtph_ps(
        _mm256_and_si256(_mm256_slli_epi16(w, 7), _mm256_set1_epi16(static_cast<short>(0xbfff))));
  } else {
    return _mm512_castsi512_ps(_mm512_slli_epi32(
        _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
  }
}

// The fmas of tiles [T] for tokens [NT]: T = 2 is a pair of tiles (a.tile, a.tile_b) in one pass,
// each activation broadcast feeding one fma per tile. With one tile, the broadcasts (one per
// fma) held the kernel at 85-89 % of the fma peak on Zen 5 (a micro-benchmark, one thread);
// two tiles by 6 tokens (24 accumulators) came within a few per cent of it. Every (token, row)
// runs the same two chains in the same order either way, so the bits do not depend on T or NT.
template <DType DT>
INFERD_VNNI inline void load_weight_pair(const std::byte* p, __m512& w0, __m512& w1) {
  constexpr size_t step = float_elem_bytes<DT>() * kQuantTileRows;
  if constexpr (DT == DType::kF8_E4M3) {
    // k and k + 1 are 32 consecutive bytes: expand them in one 512-bit register.
    const __m512i w = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    const __m512i h =
        _mm512_and_si512(_mm512_slli_epi16(w, 7), _mm512_set1_epi16(static_cast<short>(0xbfff)));
    w0 = _mm512_cvtph_ps(_mm512_castsi512_si256(h));
    w1 = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1));
  } else {
    w0 = load_weights16<DT>(p);
    w1 = load_weights16<DT>(p + step);
  }
}

template <DType DT, int T, int NT>
INFERD_VNNI void float_tile_avx512(const FloatTileArgs& a) {
  static_assert(T == 1 || (T == 2 && DT != DType::kF8_E4M3));
  constexpr size_t step = float_elem_bytes<DT>() * kQuantTileRows;
  const std::byte* const tile[2] = {a.tile, a.tile_b};
  float* const out[2] = {a.out, a.out_b};
  __m512 acc[T][NT][2];
  for (int j = 0; j < T; ++j)
    for (int t = 0; t < NT; ++t) acc[j][t][0] = acc[j][t][1] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 2 <= a.k; k += 2) {
    __m512 w0[T], w1[T];
    for (int j = 0; j < T; ++j) load_weight_pair<DT>(tile[j] + static_cast<size_t>(k) * step, w0[j], w1[j]);
    for (int t = 0; t < NT; ++t) {
      const __m512 x0 = _mm512_set1_ps(a.x[t * a.k + k]);
      const __m512 x1 = _mm512_set1_ps(a.x[t * a.k + k + 1]);
      for (int j = 0; j < T; ++j) {
        acc[j][t][0] = _mm512_fmadd_ps(w0[j], x0, acc[j][t][0]);
        acc[j][t][1] = _mm512_fmadd_ps(w1[j], x1, acc[j][t][1]);
      }
    }
  }
  if (k < a.k) {
    for (int j = 0; j < T; ++j) {
      const __m512 w0 = load_weights16<DT>(tile[j] + static_cast<size_t>(k) * step);
      for (int t = 0; t < NT; ++t)
        acc[j][t][0] = _mm512_fmadd_ps(w0, _mm512_set1_ps(a.x[t * a.k + k]), acc[j][t][0]);
    }
  }
  for (int j = 0; j < T; ++j) {
    for (int t = 0; t < NT; ++t) {
      __m512 sum = _mm512_add_ps(acc[j][t][0], acc[j][t][1]);
      if constexpr (DT == DType::kF8_E4M3) sum = _mm512_mul_ps(sum, _mm512_loadu_ps(a.row_scale));
      _mm512_storeu_ps(out[j] + t * kQuantTileRows, sum);
    }
  }
}
#endif

#if defined(__x86_64__)
// BF16 with fmas (AVX-512 without AVX512-BF16): the scalar sums 16 rows at a time.
// Pair p into chain C of each token: w[2p+1] * x[2p+1], then w[2p] * x[2p] (a missing input is
// a zero).
template <int NT, int C>
INFERD_AVX512 __attribute__((always_inline)) inline void bf16_fma_pair(const FloatTileArgs& a, int64_t p,
                                                                       __m512 (&acc)[NT][2]) {
  const __m512i pair = _mm512_loadu_si512(a.tile + static_cast<size_t>(p) * 64);
  const __m512 w0 = _mm512_castsi512_ps(_mm512_slli_epi32(pair, 16));
  const __m512 w1 =
      _mm512_castsi512_ps(_mm512_and_si512(pair, _mm512_set1_epi32(static_cast<int>(0xffff0000u))));
  for (int t = 0; t < NT; ++t) {
    const uint16_t* x = a.xb + t * a.kb + 2 * p;
    acc[t][C] = _mm512_fmadd_ps(w1, _mm512_set1_ps(bf16_to_f32(x[1])), acc[t][C]);
    acc[t][C] = _mm512_fmadd_ps(w0, _mm512_set1_ps(bf16_to_f32(x[0])), acc[t][C]);
  }
}

template <int NT>
INFERD_AVX512 void bf16_tile_fma_avx512(const FloatTileArgs& a) {
  __m512 acc[NT][2];
  for (int t = 0; t < NT; ++t) acc[t][0] = acc[t][1] = _mm512_setzero_ps();
  const int64_t pairs = (a.k + 1) / 2;
  int64_t p = 0;
  for (; p + 2 <= pairs; p += 2) {  // chain indices known at compile time: accumulators in registers
    bf16_fma_pair<NT, 0>(a, p, acc);
    bf16_fma_pair<NT, 1>(a, p + 1, acc);
  }
  if (p < pairs) bf16_fma_pair<NT, 0>(a, p, acc);
  for (int t = 0; t < NT; ++t)
    _mm512_storeu_ps(a.out + t * kQuantTileRows, _mm512_add_ps(acc[t][0], acc[t][1]));
}

// BF16 on vdpbf16ps: a pair's 64 bytes (16 rows x (k, k+1), the packed layout) are one operand for
// the NT tokens; the activations' pair broadcast as one dword.
#define INFERD_AVX512_BF16 \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx512bf16,avx2,fma,f16c")))

INFERD_AVX512_BF16 inline __m512bh load_pair(const std::byte* p) {
  return reinterpret_cast<__m512bh>(_mm512_loadu_si512(p));
}

INFERD_AVX512_BF16 inline __m512bh x_pair(const uint16_t* x) {
  uint32_t pair;
  std::memcpy(&pair, x, 4);
  return reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(pair)));
}

// acc += w . (pair `i` of row x, broadcast; a pair is 4 bytes): the broadcast as the instruction's
// memory operand ({1to16}), one instruction where the intrinsics give two (GCC 12 does not fold a
// broadcast into vdpbf16ps). With both hyper-threads of a core in this loop, the separate
// broadcasts made instruction dispatch, not the dot-product units, the limit. Row and index are
// registers, not an "m" operand: __m512 may alias anything, so a memory operand made GCC store
// every accumulator before each instruction. The rows were written before the kernel was called
// (activations_as_bf16), so the read needs no ordering of its own.
INFERD_AVX512_BF16 inline __m512 dp_broadcast(__m512 acc, __m512bh w, const uint16_t* x, int64_t i) {
#if defined(__GNUC__)
  asm("vdpbf16ps (%2,%3,4)%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "r"(x), "r"(i));
  return acc;
#else
  return _mm512_dpbf16_ps(acc, w, x_pair(x + 2 * i));
#endif
}

// T = 2: a pair of tiles (a.tile, a.tile_b) in one pass. A token's activation pair is then
// broadcast into a register once for the two tiles' instructions: the memory-operand broadcast
// of T = 1 is one load per instruction, and those loads held one tile by 8 tokens at 71-78 % of
// the instruction's peak on Zen 5 (a micro-benchmark, one thread), where two tiles by 6 tokens
// ran at 95 %. The chains are the same instructions in the same order, so the bits do not depend
// on T or NT.
template <int T, int NT>
INFERD_AVX512_BF16 void bf16_tile_dp_avx512(const FloatTileArgs& a) {
  static_assert(T == 1 || T == 2);
  const std::byte* const tile[2] = {a.tile, a.tile_b};
  float* const out[2] = {a.out, a.out_b};
  __m512 acc[T][NT][2];
  const uint16_t* row[NT];
  for (int t = 0; t < NT; ++t) {
    for (int j = 0; j < T; ++j) acc[j][t][0] = acc[j][t][1] = _mm512_setzero_ps();
    row[t] = a.xb + t * a.kb;
  }
  // Pairs of inputs, an odd K's last input paired with a zero (stored in the tile and in the
  // rounded activations' row).
  const int64_t pairs = (a.k + 1) / 2;
  int64_t p = 0;
  for (; p + 2 <= pairs; p += 2) {                                   // two pairs per iteration: one per chain
    if (T == 1 && NT <= 2 && p + kBf16PrefetchPairs + 2 <= pairs) {  // decode streams the tile once
      _mm_prefetch(reinterpret_cast<const char*>(a.tile + static_cast<size_t>(p + kBf16PrefetchPairs) * 64),
                   _MM_HINT_T0);
      _mm_prefetch(
          reinterpret_cast<const char*>(a.tile + static_cast<size_t>(p + kBf16PrefetchPairs + 1) * 64),
          _MM_HINT_T0);
    }
    __m512bh w0[T], w1[T];
    for (int j = 0; j < T; ++j) {
      w0[j] = load_pair(tile[j] + static_cast<size_t>(p) * 64);
      w1[j] = load_pair(tile[j] + static_cast<size_t>(p + 1) * 64);
    }
    for (int t = 0; t < NT; ++t) {
      if constexpr (T == 1) {
        acc[0][t][0] = dp_broadcast(acc[0][t][0], w0[0], row[t], p);
        acc[0][t][1] = dp_broadcast(acc[0][t][1], w1[0], row[t], p + 1);
      } else {
        const __m512bh x0 = x_pair(row[t] + 2 * p), x1 = x_pair(row[t] + 2 * p + 2);
        for (int j = 0; j < T; ++j) {
          acc[j][t][0] = _mm512_dpbf16_ps(acc[j][t][0], w0[j], x0);
          acc[j][t][1] = _mm512_dpbf16_ps(acc[j][t][1], w1[j], x1);
        }
      }
    }
  }
  if (p < pairs) {  // a last pair, p even
    for (int j = 0; j < T; ++j) {
      const __m512bh wp = load_pair(tile[j] + static_cast<size_t>(p) * 64);
      for (int t = 0; t < NT; ++t)  // p is even here: chain 0 (a constant index keeps acc in registers)
        acc[j][t][0] = _mm512_dpbf16_ps(acc[j][t][0], wp, x_pair(row[t] + 2 * p));
    }
  }
  for (int j = 0; j < T; ++j)
    for (int t = 0; t < NT; ++t)
      _mm512_storeu_ps(out[j] + t * kQuantTileRows, _mm512_add_ps(acc[j][t][0], acc[j][t][1]));
}

// x [tokens][k] rounded to bf16 (f32_to_bf16's bits: nearest even, NaN kept) into out [tokens][kb].
INFERD_AVX512 void round_to_bf16_avx512(const float* x, int64_t tokens, int64_t k, int64_t kb,
                                        uint16_t* out) {
  for (int64_t t = 0; t < tokens; ++t) {
    const float* src = x + t * k;
    uint16_t* dst = out + t * kb;
    int64_t i = 0;
    for (; i + 16 <= k; i += 16) {
      const __m512i b = _mm512_castps_si512(_mm512_loadu_ps(src + i));
      const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1));
      __m512i r =
          _mm512_srli_epi32(_mm512_add_epi32(b, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
      const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(b, _mm512_set1_epi32(0x7fffffff)),
                                                    _mm512_set1_epi32(0x7f800000));
      r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(0x40)));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), _mm512_cvtepi32_epi16(r));
    }
    for (; i < k; ++i) dst[i] = f32_to_bf16(src[i]);
    for (; i < kb; ++i) dst[i] = 0;
  }
}
#endif

#if defined(__x86_64__)
#include "kernels/packed_float_amx.inc"
#endif

void round_to_bf16(const float* x, int64_t tokens, int64_t k, int64_t kb, uint16_t* out, Isa isa) {
#if defined(__x86_64__)
  if (static_cast<int>(isa) >= static_cast<int>(Isa::kAvx512))
    return round_to_bf16_avx512(x, tokens, k, kb, out);
#else
  (void)isa;
#endif
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t i = 0; i < kb; ++i) out[t * kb + i] = i < k ? f32_to_bf16(x[t * k + i]) : 0;
  }
}

using FloatTileFn = void (*)(const FloatTileArgs&);

template <DType DT>
FloatTileFn float_tile_kernel(Isa isa, int num_tokens) {
#if defined(__x86_64__)
  if constexpr (DT == DType::kBF16) {
    if (static_cast<int>(isa) >= static_cast<int>(Isa::kVnni) && cpu_has_avx512_bf16()) {
      static constexpr FloatTileFn table[kMaxTokens] = {bf16_tile_dp_avx512<1, 1>, bf16_tile_dp_avx512<1, 2>,
                                                        bf16_tile_dp_avx512<1, 3>, bf16_tile_dp_avx512<1, 4>,
                                                        bf16_tile_dp_avx512<1, 5>, bf16_tile_dp_avx512<1, 6>,
                                                        bf16_tile_dp_avx512<1, 7>, bf16_tile_dp_avx512<1, 8>};
      return table[num_tokens - 1];
    }
    if (static_cast<int>(isa) >= static_cast<int>(Isa::kAvx512)) {
      static constexpr FloatTileFn table[kMaxTokens] = {
          bf16_tile_fma_avx512<1>, bf16_tile_fma_avx512<2>, bf16_tile_fma_avx512<3>, bf16_tile_fma_avx512<4>,
          bf16_tile_fma_avx512<5>, bf16_tile_fma_avx512<6>, bf16_tile_fma_avx512<7>, bf16_tile_fma_avx512<8>};
      return table[num_tokens - 1];
    }
    return float_tile_scalar<DT>;
  }
  if (static_cast<int>(isa) >= static_cast<int>(Isa::kAvx512)) {
    // Up to kWideTokens (FloatBlocking::kWide, F32 and F16); F8_E4M3 takes up to kMaxTokens.
    constexpr size_t kTableTokens = DT == DType::kF8_E4M3 ? kMaxTokens : kWideTokens;
    static constexpr auto table = []<size_t... I>(std::index_sequence<I...>) {
      return std::array<FloatTileFn, sizeof...(I)>{float_tile_avx512<DT, 1, static_cast<int>(I) + 1>...};
    }
    (std::make_index_sequence<kTableTokens>{});
    return table[static_cast<size_t>(num_tokens - 1)];
  }
#else
  (void)isa;
  (void)num_tokens;
#endif
  return float_tile_scalar<DT>;
}

FloatTileFn float_tile_kernel(Isa isa, DType dtype, int num_tokens) {
  switch (dtype) {
    case DType::kF32: return float_tile_kernel<DType::kF32>(isa, num_tokens);
    case DType::kF16: return float_tile_kernel<DType::kF16>(isa, num_tokens);
    case DType::kF8_E4M3: return float_tile_kernel<DType::kF8_E4M3>(isa, num_tokens);
    default: return float_tile_kernel<DType::kBF16>(isa, num_tokens);
  }
}

// Tokens per call of the pair kernels (two tiles x 6 tokens x 2 chains: 24 accumulators), and the
// fewest tokens of a matmul that runs them. Below that the weights stream from memory once per
// token group anyway, and one tile per call keeps the stream that decode's timing was measured on.
constexpr int kPairTokens = 6;
constexpr int64_t kPairMinTokens = 4;

// The pair kernel (two tiles per call) of `isa` for num_tokens (1..kPairTokens), or null where there
// is none: F32 and F16 weights on AVX-512, BF16 on AVX512-BF16's dot products (the AMX-BF16 path,
// amx_bf16_path, takes its own). F8_E4M3 has none: its expansion to f32 (a widening, a shift, a
// mask and two conversions per 32 weights) is its limit, not the broadcasts, and two tiles per
// call measured no faster.
FloatTileFn float_pair_kernel(Isa isa, DType dtype, int num_tokens) {
#if defined(__x86_64__)
  if (dtype == DType::kBF16) {
    if (static_cast<int>(isa) < static_cast<int>(Isa::kVnni) || !cpu_has_avx512_bf16()) return nullptr;
    static constexpr FloatTileFn table[kPairTokens] = {bf16_tile_dp_avx512<2, 1>, bf16_tile_dp_avx512<2, 2>,
                                                       bf16_tile_dp_avx512<2, 3>, bf16_tile_dp_avx512<2, 4>,
                                                       bf16_tile_dp_avx512<2, 5>, bf16_tile_dp_avx512<2, 6>};
    return table[num_tokens - 1];
  }
  if (static_cast<int>(isa) < static_cast<int>(Isa::kAvx512)) return nullptr;
  auto pick = [&]<DType DT>(std::integral_constant<DType, DT>) -> FloatTileFn {
    static constexpr FloatTileFn table[kPairTokens] = {
        float_tile_avx512<DT, 2, 1>, float_tile_avx512<DT, 2, 2>, float_tile_avx512<DT, 2, 3>,
        float_tile_avx512<DT, 2, 4>, float_tile_avx512<DT, 2, 5>, float_tile_avx512<DT, 2, 6>};
    return table[num_tokens - 1];
  };
  switch (dtype) {
    case DType::kF32: return pick(std::integral_constant<DType, DType::kF32>{});
    case DType::kF16: return pick(std::integral_constant<DType, DType::kF16>{});
    default: return nullptr;
  }
#else
  (void)isa;
  (void)dtype;
  (void)num_tokens;
  return nullptr;
#endif
}

using TileFn = void (*)(const TileArgs&);

template <template <DType, int> class Kernel, DType DT>
struct ByTokens {
  static constexpr TileFn table[kMaxTokens] = {Kernel<DT, 1>::fn, Kernel<DT, 2>::fn, Kernel<DT, 3>::fn,
                                               Kernel<DT, 4>::fn, Kernel<DT, 5>::fn, Kernel<DT, 6>::fn,
                                               Kernel<DT, 7>::fn, Kernel<DT, 8>::fn};
};

template <DType DT, int NT>
struct ScalarKernel {
  static void fn(const TileArgs& a) { tile_scalar<DT>(a); }
};
#if defined(__x86_64__)
template <DType DT, int NT>
struct Avx2Kernel {
  static void fn(const TileArgs& a) { tile_avx2<DT, NT>(a); }
};
template <DType DT, int NT>
struct VnniKernel {
  static void fn(const TileArgs& a) { tile_vnni<DT, NT>(a); }
};
template <DType DT, int NT>
struct Avx512bwKernel {
  static void fn(const TileArgs& a) { tile_avx512bw<DT, NT>(a); }
};
#endif

// fn(std::integral_constant<DType, DT>{}) for the block-quantized dtype `dtype` (one the integer
// kernels take; anything else is Q6_K's): the one place a runtime dtype becomes a template argument.
template <typename Fn>
decltype(auto) with_quant_dtype(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kQ8_0: return fn(std::integral_constant<DType, DType::kQ8_0>{});
    case DType::kQ5_0: return fn(std::integral_constant<DType, DType::kQ5_0>{});
    case DType::kQ5_1: return fn(std::integral_constant<DType, DType::kQ5_1>{});
    case DType::kQ4_0: return fn(std::integral_constant<DType, DType::kQ4_0>{});
    case DType::kQ4_1: return fn(std::integral_constant<DType, DType::kQ4_1>{});
    case DType::kQ4_G128: return fn(std::integral_constant<DType, DType::kQ4_G128>{});
    case DType::kQ4_G64: return fn(std::integral_constant<DType, DType::kQ4_G64>{});
    case DType::kQ4_K: return fn(std::integral_constant<DType, DType::kQ4_K>{});
    case DType::kQ5_K: return fn(std::integral_constant<DType, DType::kQ5_K>{});
    case DType::kI8: return fn(std::integral_constant<DType, DType::kI8>{});
    case DType::kIQ4_NL: return fn(std::integral_constant<DType, DType::kIQ4_NL>{});
    case DType::kIQ4_XS: return fn(std::integral_constant<DType, DType::kIQ4_XS>{});
    case DType::kIQ3_XXS: return fn(std::integral_constant<DType, DType::kIQ3_XXS>{});
    case DType::kIQ3_S: return fn(std::integral_constant<DType, DType::kIQ3_S>{});
    case DType::kIQ2_S: return fn(std::integral_constant<DType, DType::kIQ2_S>{});
    case DType::kIQ2_XXS: return fn(std::integral_constant<DType, DType::kIQ2_XXS>{});
    case DType::kIQ2_XS: return fn(std::integral_constant<DType, DType::kIQ2_XS>{});
    case DType::kIQ1_S: return fn(std::integral_constant<DType, DType::kIQ1_S>{});
    case DType::kIQ1_M: return fn(std::integral_constant<DType, DType::kIQ1_M>{});
    case DType::kTQ1_0: return fn(std::integral_constant<DType, DType::kTQ1_0>{});
    case DType::kTQ2_0: return fn(std::integral_constant<DType, DType::kTQ2_0>{});
    case DType::kQ2_K: return fn(std::integral_constant<DType, DType::kQ2_K>{});
    case DType::kQ3_K: return fn(std::integral_constant<DType, DType::kQ3_K>{});
    default: return fn(std::integral_constant<DType, DType::kQ6_K>{});
  }
}

template <template <DType, int> class Kernel>
const TileFn* tables_for(DType dtype) {
  return with_quant_dtype(dtype, [](auto dt) { return ByTokens<Kernel, decltype(dt)::value>::table; });
}

#if defined(__x86_64__)
using AmxPrepareFn = void (*)(const std::byte*, size_t, int64_t, int8_t*);

// The AMX path's functions for one integer dtype: its weight preparation and its kernel (on the
// CPU's tile unit, and on the emulator's for tests: cpu_isa.h).
struct AmxFunctions {
  AmxPrepareFn prepare[2];  // by AmxInt8Kernel
  TileFn kernel[2][2];      // [AmxInt8Kernel][emulated]
  size_t block_bytes[2];    // prepared bytes per block, by AmxInt8Kernel
};

template <DType DT>
constexpr AmxFunctions kAmxFunctions = {
    {amx_prepare_weights<DT, AmxInt8Kernel::kPipelined>, amx_prepare_weights<DT, AmxInt8Kernel::kPingPong>},
    {{tile_amx<DT, false>, tile_amx<DT, true>}, {tile_amx_pingpong<DT, false>, tile_amx_pingpong<DT, true>}},
    {amx_block_bytes<DT>(AmxInt8Kernel::kPipelined), amx_block_bytes<DT>(AmxInt8Kernel::kPingPong)}};

AmxFunctions amx_functions(DType dtype) {
  return with_quant_dtype(dtype, [](auto dt) { return kAmxFunctions<decltype(dt)::value>; });
}

// A thread's B operands of the last two tiles it ran (a SwiGLU unit's gate and up tiles
// alternate), valid within one matmul call: prepared once, used by every group of 16 tokens.
class AmxWeightCache final {
 public:
  // The prepared bytes of `tile` in `call`: prepare(out) fills `bytes` bytes on a miss.
  template <typename Prepare>
  const int8_t* get(const std::byte* tile, uint64_t call, size_t bytes, Prepare prepare) {
    for (Slot& s : slots_)
      if (s.tile == tile && s.call == call) return s.data.get();
    Slot& s = slots_[next_];
    next_ = 1 - next_;
    grow(s, bytes);
    prepare(s.data.get());
    INFERD_AMX_MEMORY_BARRIER();  // the tile loads read these bytes
    s.tile = tile;
    s.call = call;
    return s.data.get();
  }

  // Room for tiles of `bytes` bytes, so that get() allocates nothing.
  void reserve(size_t bytes) {
    for (Slot& s : slots_) grow(s, bytes);
  }

 private:
  struct Slot {
    const std::byte* tile = nullptr;
    uint64_t call = 0;
    size_t capacity = 0;
    std::unique_ptr<int8_t[], void (*)(void*)> data{nullptr, std::free};
  };
  static void grow(Slot& s, size_t bytes) {
    if (bytes <= s.capacity) return;
    s.data = {reinterpret_cast<int8_t*>(aligned_bytes(bytes)), std::free};
    s.capacity = bytes;
    s.tile = nullptr;
  }

  Slot slots_[2];
  int next_ = 0;
};

#endif

// -1 until first read: INFERD_AMX_INT8, or set_amx_int8_kernel.
std::atomic<int> g_amx_int8_kernel{-1};

// -1 until first read: INFERD_FLOAT_BLOCKING or the CPU's default, or set_float_blocking.
std::atomic<int> g_float_blocking{-1};

// The setting in `slot`, read from the environment at first use: the index in `names` of
// variable `var`'s value, or `fallback` where it is unset or names none of them (said once).
int env_setting(std::atomic<int>& slot, const char* var, std::initializer_list<std::string_view> names,
                int fallback) {
  int v = slot.load(std::memory_order_relaxed);
  if (v >= 0) return v;
  v = fallback;
  if (const char* env = std::getenv(var); env != nullptr) {
    const auto it = std::find(names.begin(), names.end(), std::string_view(env));
    if (it != names.end()) {
      v = static_cast<int>(it - names.begin());
    } else {
      std::string all;
      for (std::string_view n : names) {
        if (!all.empty()) all.push_back('|');
        all.append(n);
      }
      log_warning(std::string(var) + "=" + env + " is not one of " + all + "; using " +
                  std::string(names.begin()[fallback]));
    }
  }
  int expected = -1;
  return slot.compare_exchange_strong(expected, v, std::memory_order_relaxed) ? v : expected;
}

// Identifies one AMX matmul call (a cache entry of an earlier call never matches).
uint64_t next_amx_call() {
  static std::atomic<uint64_t> counter{0};
  return counter.fetch_add(1, std::memory_order_relaxed) + 1;
}

// Whether w's BF16 weights run on AMX-BF16 tiles (every token count: see packed_float_amx.inc).
bool amx_bf16_path(Isa isa, const PackedWeight& w) {
  return isa == Isa::kAmx && w.dtype() == DType::kBF16 && (cpu_has_amx_bf16() || amx_emulation());
}

// Tokens per kernel call: `full` while that many remain, then groups of up to `tail`. The AMX
// integer kernel takes 16 tokens and leaves a smaller rest to the VNNI kernel; the AMX-BF16
// kernel takes any count up to 16; the others up to 8.
struct TokenGroups {
  int full = kMaxTokens;
  int tail = kMaxTokens;
};

// Whether a float matmul of `tokens` by w runs one tile for up to kWideTokens tokens per kernel
// call (FloatBlocking::kWide).
bool wide_tiles(Isa isa, const PackedWeight& w, int64_t tokens) {
  return w.is_float() && (w.dtype() == DType::kF32 || w.dtype() == DType::kF16) && tokens >= kPairMinTokens &&
         static_cast<int>(isa) >= static_cast<int>(Isa::kAvx512) && float_blocking() == FloatBlocking::kWide;
}

// Whether a float matmul of `tokens` by w runs two tiles per kernel call (float_pair_kernel).
bool pairs_tiles(Isa isa, const PackedWeight& w, int64_t tokens) {
  return w.is_float() && tokens >= kPairMinTokens && !amx_bf16_path(isa, w) && !wide_tiles(isa, w, tokens) &&
         float_pair_kernel(isa, w.dtype(), 1) != nullptr;
}

TokenGroups token_groups(Isa isa, const PackedWeight& w, int64_t tokens) {
  if (pairs_tiles(isa, w, tokens)) return {kPairTokens, kPairTokens};
  if (wide_tiles(isa, w, tokens)) return {kWideTokens, kWideTokens};
  if (amx_bf16_path(isa, w)) return {kAmxTokens, kAmxTokens};
  if (isa == Isa::kAmx && !w.is_float()) return {kAmxTokens, kMaxTokens};
  return {};
}

// Whether a matmul of `tokens` by w runs AMX tiles.
bool uses_amx(Isa isa, const PackedWeight& w, int64_t tokens) {
  if (amx_bf16_path(isa, w)) return tokens > 0;
  return token_groups(isa, w, tokens).full == kAmxTokens && tokens >= kAmxTokens;
}

// Sets up what the calling thread's kernels for w need (AMX: the tile configuration).
void prepare_thread(Isa isa, const PackedWeight& w, int64_t tokens) {
#if defined(__x86_64__)
  if (uses_amx(isa, w, tokens)) amx_configure(amx_int8_kernel());
#else
  (void)isa;
  (void)w;
  (void)tokens;
#endif
}

// The tile kernel of `isa` for `dtype` and num_tokens (1..8; 16 on the AMX path).
TileFn tile_kernel(Isa isa, DType dtype, int num_tokens) {
#if defined(__x86_64__)
  if (num_tokens == kAmxTokens) {
    INFERD_CHECK(isa == Isa::kAmx);
    return amx_functions(dtype).kernel[static_cast<int>(amx_int8_kernel())][amx_emulation() ? 1 : 0];
  }
  if (static_cast<int>(isa) >= static_cast<int>(Isa::kVnni))
    return tables_for<VnniKernel>(dtype)[num_tokens - 1];
  if (static_cast<int>(isa) >= static_cast<int>(Isa::kAvx512))
    return tables_for<Avx512bwKernel>(dtype)[num_tokens - 1];
  if (static_cast<int>(isa) >= static_cast<int>(Isa::kAvx2))
    return tables_for<Avx2Kernel>(dtype)[num_tokens - 1];
#else
  (void)isa;
#endif
  return tables_for<ScalarKernel>(dtype)[num_tokens - 1];
}

}  // namespace

AmxInt8Kernel amx_int8_kernel() {
  return static_cast<AmxInt8Kernel>(env_setting(g_amx_int8_kernel, "INFERD_AMX_INT8",
                                                {"pipelined", "pingpong"},
                                                static_cast<int>(AmxInt8Kernel::kPipelined)));
}

void set_amx_int8_kernel(AmxInt8Kernel kernel) {
  g_amx_int8_kernel.store(static_cast<int>(kernel), std::memory_order_relaxed);
}

FloatBlocking float_blocking() {
  // Settled after the first read; only that read asks the CPU for its default.
  if (const int v = g_float_blocking.load(std::memory_order_relaxed); v >= 0)
    return static_cast<FloatBlocking>(v);
  const FloatBlocking cpu = cpu_splits_512bit_ops() ? FloatBlocking::kWide : FloatBlocking::kPairs;
  return static_cast<FloatBlocking>(
      env_setting(g_float_blocking, "INFERD_FLOAT_BLOCKING", {"pairs", "wide"}, static_cast<int>(cpu)));
}

void set_float_blocking(FloatBlocking blocking) {
  g_float_blocking.store(static_cast<int>(blocking), std::memory_order_relaxed);
}

void quantize_activations_reference(const float* x, int64_t k, int8_t* q, float* scale, int32_t* sum,
                                    float* scaled_sum, int32_t* half_sum) {
  quantize_row_generic(x, k, q, scale, sum, scaled_sum, half_sum);
}

void QuantizedActivations::reserve(int64_t tokens, int64_t k) {
  INFERD_CHECK_MSG(k % kQuantBlockValues == 0, "activation row length must be a multiple of 32");
  const auto need = static_cast<size_t>(tokens * k);
  if (need > capacity_) {
    q_ = {reinterpret_cast<int8_t*>(aligned_bytes(need)), std::free};
    capacity_ = need;
  }
  const auto blocks = static_cast<size_t>(tokens * (k / kQuantBlockValues));
  if (scale_.size() < blocks) {
    scale_.resize(blocks);
    sum_.resize(blocks);
    scaled_sum_.resize(blocks);
    half_sum_.resize(2 * blocks);
  }
  tokens_ = tokens;
  k_ = k;
}

QuantizedActivations::RowFn QuantizedActivations::row_function(Isa isa) {
#if defined(__x86_64__)
  if (static_cast<int>(isa) >= static_cast<int>(Isa::kAvx512)) return quantize_row_avx512;
  if (static_cast<int>(isa) >= static_cast<int>(Isa::kAvx2)) return quantize_row_avx2;
#else
  (void)isa;
#endif
  return quantize_activations_reference;
}

void QuantizedActivations::quantize_rows(const float* x, const float* weight, float eps, int64_t begin,
                                         int64_t end, RowFn row_fn, float* normed) {
  for (int64_t t = begin; t < end; ++t) {
    const float* row = x + t * k_;
    if (weight != nullptr) {
      rms_norm(row, weight, normed, k_, eps);
      row = normed;
    }
    const int64_t bt = t * blocks();
    row_fn(row, k_, q_.get() + t * k_, scale_.data() + bt, sum_.data() + bt, scaled_sum_.data() + bt,
           half_sum_.data() + 2 * bt);
  }
}

void QuantizedActivations::quantize_split(const float* x, const float* weight, float eps, int64_t tokens,
                                          Isa isa, ThreadPool* pool) {
  const RowFn row_fn = row_function(isa);
  const auto k = static_cast<size_t>(k_);
  const bool split = pool != nullptr && tokens >= kPoolRows;
  if (weight != nullptr) {  // the normalised rows: the caller's alone, or every pool thread's
    auto grow = [&](std::vector<float>& v) {
      if (v.size() < k) v.resize(k);
    };
    if (split) {
      normed_.prepare(*pool, grow);
    } else {
      grow(row_);
    }
  }
  for_rows(split ? pool : nullptr, tokens, [&](int64_t begin, int64_t end) {
    float* normed = weight == nullptr ? nullptr : split ? normed_.mine().data() : row_.data();
    quantize_rows(x, weight, eps, begin, end, row_fn, normed);
  });
}

void QuantizedActivations::quantize(const float* x, int64_t tokens, int64_t k, Isa isa, ThreadPool* pool) {
  reserve(tokens, k);
  quantize_split(x, nullptr, 0.0f, tokens, isa, pool);
}

void QuantizedActivations::quantize_rms_norm(const float* x, const float* weight, float eps, int64_t tokens,
                                             int64_t k, Isa isa, ThreadPool* pool) {
  reserve(tokens, k);
  quantize_split(x, weight, eps, tokens, isa, pool);
}

namespace {

// Writes row r's 32 stored quants (u8, q + offset) into a packed block's quant bytes, the 4 bytes
// of a group at a time: word g holds inputs 4g..4g+3 (byte j input 4g + j), and each output word
// is a few shifts and masks of them, every byte lane at once (the layout stored_quant reads).
__attribute__((always_inline)) inline void put_quants(Format f, const uint8_t (&q)[32], int r, uint8_t* qs) {
  uint32_t v[8];
  std::memcpy(v, q, sizeof v);
  uint8_t* at = qs + 4 * r;
  auto put = [&](size_t offset, uint32_t word) { std::memcpy(at + offset, &word, 4); };
  if (f.crumbs) {  // group g's byte j holds inputs 4(g + 2c) + j in bits 2c..2c+1
    for (int g = 0; g < 2; ++g) {
      uint32_t word = 0;
      for (int c = 0; c < 4; ++c) word |= (v[g + 2 * c] & 0x03030303u) << (2 * c);
      put(64 * static_cast<size_t>(g), word);
    }
    if (f.high_bits == 1) {  // the third bit of input 4g + j in bit g of the plane's byte j
      uint32_t word = 0;
      for (int g = 0; g < 8; ++g) word |= ((v[g] >> 2) & 0x01010101u) << g;
      put(128, word);
    }
    return;
  }
  if (!f.nibbles) {
    for (int g = 0; g < 8; ++g) put(64 * static_cast<size_t>(g), v[g]);
    return;
  }
  for (int g = 0; g < 4; ++g)  // low nibble input 4g + j, high nibble 16 + 4g + j
    put(64 * static_cast<size_t>(g), (v[g] & 0x0f0f0f0fu) | ((v[g + 4] & 0x0f0f0f0fu) << 4));
  if (f.high_bits == 1) {  // bit 4 of input 4g + j in bit g of the plane's byte j
    uint32_t word = 0;
    for (int g = 0; g < 8; ++g) word |= ((v[g] >> 4) & 0x01010101u) << g;
    put(256, word);
  } else if (f.high_bits == 2) {  // bits 4, 5 of input 4g + j in bits 2(g % 4) of plane g / 4
    for (int p = 0; p < 2; ++p) {
      uint32_t word = 0;
      for (int g = 4 * p; g < 4 * p + 4; ++g) word |= ((v[g] >> 4) & 0x03030303u) << (2 * (g % 4));
      put(256 + 64 * static_cast<size_t>(p), word);
    }
  }
}

// Row r (0..15) of a tile of DT from its source row of `blocks` blocks of 32 values.
template <DType DT>
void pack_quant_row(const uint8_t* row, int r, int64_t blocks, size_t block_bytes, uint8_t* tile) {
  constexpr Format f = format_of(DT);
  for (int64_t b = 0; b < blocks; ++b) {
    const SourceBlock sb = decode_block(DT, row, b);
    uint8_t* blk = tile + static_cast<size_t>(b / f.group_blocks) * block_bytes;
    const auto j = static_cast<size_t>(b % f.group_blocks);
    if constexpr (!f.row_scales) {  // row-scaled formats: the row's scale heads the tile
      std::memcpy(blk + 2 * r, &sb.d16, 2);
      if constexpr (f.has_min) std::memcpy(blk + min_offset(f) + 2 * r, &sb.m16, 2);
    }
    if constexpr (f.k_scales && !f.sub_scales) blk[sub_offset(f) + 16 * j + r] = sb.sc;  // u8, or IQ4_XS's i8
    if constexpr (f.k_scales && f.has_min && !f.sub_scales)
      blk[sub_offset(f) + 16 * (static_cast<size_t>(f.group_blocks) + j) + r] = sb.mn;
    if constexpr (f.sub_scales) {
      blk[sub_offset(f) + 32 * j + r] = static_cast<uint8_t>(sb.sub[0]);
      blk[sub_offset(f) + 32 * j + 16 + r] = static_cast<uint8_t>(sb.sub[1]);
    }
    put_quants(f, sb.q, r, blk + quant_offset(f) + j * quant_bytes(f));
  }
}

using PackRowFn = void (*)(const uint8_t*, int, int64_t, size_t, uint8_t*);

PackRowFn pack_row_function(DType dtype) {
  INFERD_CHECK(PackedWeight::supports(dtype) && !PackedWeight::is_float_dtype(dtype));
  return with_quant_dtype(dtype, [](auto dt) -> PackRowFn { return pack_quant_row<decltype(dt)::value>; });
}

// Columns 0..n-1 of `rows` (units of T) to a tile's [column][16 rows] order.
template <typename T>
void transpose_rows(const uint8_t* const* rows, int num_rows, int64_t n, uint8_t* tile) {
  for (int64_t k = 0; k < n; ++k) {
    uint8_t* dst = tile + static_cast<size_t>(k) * kQuantTileRows * sizeof(T);
    for (int r = 0; r < num_rows; ++r)
      std::memcpy(dst + static_cast<size_t>(r) * sizeof(T), rows[r] + static_cast<size_t>(k) * sizeof(T),
                  sizeof(T));
  }
}

// A float tile's values from its num_rows source rows of `cols` values: [k][16 rows] (F32, F16,
// F8_E4M3), or BF16's pairs of inputs [k / 2][16 rows][2] (see bf16_packed_offset), its last pair
// half zero for odd cols. The tile is zeroed already.
void pack_float_rows(DType dtype, const uint8_t* const* rows, int num_rows, int64_t cols, uint8_t* tile) {
  switch (dtype) {
    case DType::kF32: return transpose_rows<uint32_t>(rows, num_rows, cols, tile);
    case DType::kF16: return transpose_rows<uint16_t>(rows, num_rows, cols, tile);
    case DType::kBF16: {
      transpose_rows<uint32_t>(rows, num_rows, cols / 2, tile);
      if (cols % 2 != 0) {
        for (int r = 0; r < num_rows; ++r)
          std::memcpy(tile + bf16_packed_offset(cols - 1, r), rows[r] + static_cast<size_t>(cols - 1) * 2, 2);
      }
      return;
    }
    default: return transpose_rows<uint8_t>(rows, num_rows, cols, tile);  // F8_E4M3
  }
}

}  // namespace

bool PackedWeight::supports(DType dtype) {
  switch (dtype) {
    case DType::kQ8_0:
    case DType::kQ5_0:
    case DType::kQ5_1:
    case DType::kQ4_0:
    case DType::kQ4_1:
    case DType::kQ4_K:
    case DType::kQ5_K:
    case DType::kQ6_K:
    case DType::kI8:
    case DType::kQ4_G128:
    case DType::kQ4_G64:
    case DType::kIQ4_NL:
    case DType::kIQ4_XS:
    case DType::kQ2_K:
    case DType::kQ3_K:
    case DType::kIQ3_XXS:
    case DType::kIQ3_S:
    case DType::kIQ2_S:
    case DType::kIQ2_XXS:
    case DType::kIQ2_XS:
    case DType::kIQ1_S:
    case DType::kIQ1_M:
    case DType::kTQ1_0:
    case DType::kTQ2_0:
    case DType::kF32:
    case DType::kF16:
    case DType::kBF16:
    case DType::kF8_E4M3: return true;
    default: return false;
  }
}

bool PackedWeight::is_float_dtype(DType dtype) {
  return dtype == DType::kF32 || dtype == DType::kF16 || dtype == DType::kBF16 || dtype == DType::kF8_E4M3;
}

Expected<PackedWeight> PackedWeight::pack(std::span<const TensorView* const> parts, ThreadPool* pool) {
  return pack_tiles(parts, false, pool);
}

Expected<PackedWeight> PackedWeight::pack_swiglu(const TensorView& gate, const TensorView& up,
                                                 ThreadPool* pool) {
  const TensorView* parts[2] = {&gate, &up};
  if (gate.num_rows() != up.num_rows()) {
    return invalid_argument("gate " + gate.shape_string() + " and up " + up.shape_string() +
                            " differ in shape");
  }
  return pack_tiles(parts, true, pool);
}

Expected<PackedWeight> PackedWeight::pack_tiles(std::span<const TensorView* const> parts, bool interleave,
                                                ThreadPool* pool) {
  INFERD_CHECK(!parts.empty());
  const TensorView& first = *parts[0];
  for (const TensorView* p : parts) {
    if (!supports(p->dtype)) {
      return unsupported(p->name + ": " + std::string(dtype_info(p->dtype).name) + " has no integer kernel");
    }
    if (p->dtype != first.dtype || p->row_length() != first.row_length() || p->num_dims != 2) {
      return invalid_argument(p->name + ": packed together, matrices need one dtype and row length");
    }
    if (dtype_has_row_scale(p->dtype) && p->row_scale == nullptr)
      return invalid_argument(p->name + ": " + std::string(dtype_info(p->dtype).name) +
                              " without row scales");
  }
  PackedWeight w;
  w.dtype_ = first.dtype;
  w.cols_ = first.row_length();
  w.swiglu_ = interleave;
  const bool is_float = is_float_dtype(w.dtype_);
  if (!is_float && w.cols_ % kQuantBlockValues != 0)
    return invalid_argument(first.name + ": row length not a multiple of 32");
  const int64_t blocks = w.cols_ / kQuantBlockValues;
  const Format f = format_of(w.dtype_);
  if (!is_float && blocks % f.group_blocks != 0)
    return invalid_argument(first.name + ": row length not a multiple of " +
                            std::to_string(f.group_blocks * kQuantBlockValues));
  const size_t elem = static_cast<size_t>(dtype_info(w.dtype_).block_bytes);  // float dtypes: bytes per value
  const size_t header = tile_header_bytes(w.dtype_);
  w.block_bytes_ = is_float ? 0 : packed_block_bytes(f);
  w.tile_bytes_ =
      header + (is_float ? static_cast<size_t>(float_packed_cols(w.dtype_, w.cols_)) * kQuantTileRows * elem
                         : static_cast<size_t>(blocks / f.group_blocks) * w.block_bytes_);
  int64_t tiles = 0;
  for (const TensorView* p : parts) {
    const int64_t n = (p->num_rows() + kQuantTileRows - 1) / kQuantTileRows;
    w.parts_.push_back({interleave ? static_cast<int64_t>(w.parts_.size()) : tiles, n, p->num_rows()});
    tiles += n;
  }
  w.tiles_ = tiles;
  w.data_ = {weight_bytes(w.num_bytes()), std::free};
  // Each tile is packed on its own (zeroed first: the rows past a part's end and the padding
  // stay zero), so tiles go to the pool's threads, and their pages are first touched there too.
  struct TileSource {
    size_t part;
    int64_t index;  // within the part
  };
  std::vector<TileSource> sources(static_cast<size_t>(tiles));
  for (size_t pi = 0; pi < parts.size(); ++pi) {
    const Part& part = w.parts_[pi];
    for (int64_t ti = 0; ti < part.num_tiles; ++ti) {
      const int64_t tile_index = interleave ? 2 * ti + static_cast<int64_t>(pi) : part.first_tile + ti;
      sources[static_cast<size_t>(tile_index)] = {pi, ti};
    }
  }
  const PackRowFn pack_row = is_float ? nullptr : pack_row_function(w.dtype_);
  auto pack_range = [&](int64_t begin, int64_t end) {
    for (int64_t tile_index = begin; tile_index < end; ++tile_index) {
      const TileSource& at = sources[static_cast<size_t>(tile_index)];
      const TensorView& src = *parts[at.part];
      const Part& part = w.parts_[at.part];
      const int64_t ti = at.index;
      auto* tile_start =
          reinterpret_cast<uint8_t*>(w.data_.get() + static_cast<size_t>(tile_index) * w.tile_bytes_);
      std::memset(tile_start, 0, w.tile_bytes_);
      uint8_t* tile = tile_start + header;
      for (int r = 0; r < kQuantTileRows && ti * kQuantTileRows + r < part.rows; ++r) {
        const auto* row = reinterpret_cast<const uint8_t*>(src.row(ti * kQuantTileRows + r));
        if (header != 0) {
          // F8_E4M3's kernel sums value * 2^-8 (see the float kernel): its scale carries the 2^8.
          const float scale =
              src.row_scale[ti * kQuantTileRows + r] * (w.dtype_ == DType::kF8_E4M3 ? 256.0f : 1.0f);
          std::memcpy(tile_start + sizeof(float) * static_cast<size_t>(r), &scale, sizeof(float));
        }
        if (!is_float) pack_row(row, r, blocks, w.block_bytes_, tile);  // floats: below, all rows at once
      }
      if (is_float) {
        const uint8_t* rows[kQuantTileRows];
        const int n = static_cast<int>(std::min<int64_t>(kQuantTileRows, part.rows - ti * kQuantTileRows));
        for (int r = 0; r < n; ++r)
          rows[r] = reinterpret_cast<const uint8_t*>(src.row(ti * kQuantTileRows + r));
        pack_float_rows(w.dtype_, rows, n, w.cols_, tile);
      }
    }
  };
  if (pool == nullptr || pool->num_threads() == 1 || tiles < 2) {
    pack_range(0, tiles);
  } else {
    pool->parallel_for_dynamic(tiles, std::max<int64_t>(1, tiles / (8 * pool->num_threads())), pack_range);
  }
  return w;
}

namespace {

// The epilogues of an ISA: a tile's results stored (with bias) or combined as silu(gate) * up.
struct Epilogues {
  decltype(&store_scalar) store = store_scalar;
  decltype(&swiglu_scalar) swiglu = swiglu_scalar;
};

Epilogues epilogues(Isa isa) {
  Epilogues e;
#if defined(__x86_64__)
  if (static_cast<int>(isa) >= static_cast<int>(Isa::kAvx512)) {
    e.store = store_avx512;
    e.swiglu = swiglu_avx512;
  } else if (static_cast<int>(isa) >= static_cast<int>(Isa::kAvx2)) {
    e.store = store_avx2;
    e.swiglu = swiglu_avx2;
  }
#endif
  return e;
}

// Where tile i of w (not a SwiGLU weight) writes: its part's output, and its first row and number
// of rows there.
struct TileRows {
  const QuantMatmulOutput* o;
  int64_t row0;
  int rows;
};

TileRows tile_rows(const PackedWeight& w, const QuantMatmulOutput* outputs, int64_t i) {
  size_t part = 0;
  while (i >= w.part_first_tile(part) + w.part_tiles(part)) ++part;
  const int64_t row0 = (i - w.part_first_tile(part)) * kQuantTileRows;
  return {&outputs[part], row0,
          static_cast<int>(std::min<int64_t>(kQuantTileRows, w.part_rows(part) - row0))};
}

void store_tile(const Epilogues& e, const TileRows& d, const float* out, int64_t t0, int nt) {
  e.store(out, nt, d.rows, d.o->y + t0 * d.o->ld + d.row0, d.o->ld,
          d.o->bias != nullptr ? d.o->bias + d.row0 : nullptr);
}

// Runs no pair kernel: the drive of a weight whose kernels take one tile per call.
struct NoPairs {};

// Work unit u of w (a tile, or a gate/up tile pair of a SwiGLU weight; with `run_pair`, tiles 2u
// and 2u + 1 of other weights) for every group of tokens: run_tile(tile, first_token, num_tokens,
// out) or run_pair(tile, tile_b, first_token, num_tokens, out, out_b), results written into the
// outputs. Tokens go to the kernel in groups of `groups.full`, a smaller rest in groups of up to
// `groups.tail`. out / out_up: [kAmxTokens * kQuantTileRows] scratch.
template <typename RunTile, typename RunPair>
void run_unit(const PackedWeight& w, const QuantMatmulOutput* outputs, bool raw, int64_t u, int64_t tokens,
              const Epilogues& e, TokenGroups groups, RunTile& run_tile, RunPair& run_pair, float* out,
              float* out_up) {
  constexpr bool kPairs = !std::is_same_v<RunPair, NoPairs>;
  // The rows this unit writes (a SwiGLU weight's gate/up pair writes one tile's rows).
  const int64_t first = w.swiglu() ? 0 : (kPairs ? 2 * u : u);
  const TileRows a =
      w.swiglu()
          ? TileRows{&outputs[0], u * kQuantTileRows,
                     static_cast<int>(std::min<int64_t>(kQuantTileRows, w.part_rows(0) - u * kQuantTileRows))}
          : tile_rows(w, outputs, first);
  const bool second = kPairs && !w.swiglu() && first + 1 < w.tiles();
  const TileRows b = second ? tile_rows(w, outputs, first + 1) : a;
  for (int64_t t0 = 0; t0 < tokens;) {
    const int nt = static_cast<int>(tokens - t0 >= groups.full ? groups.full
                                                               : std::min<int64_t>(groups.tail, tokens - t0));
    float* y = a.o->y + t0 * a.o->ld + a.row0;
    if (w.swiglu()) {
      if constexpr (kPairs) {
        run_pair(w.tile(2 * u), w.tile(2 * u + 1), t0, nt, out, out_up);
      } else {
        run_tile(w.tile(2 * u), t0, nt, out);
        run_tile(w.tile(2 * u + 1), t0, nt, out_up);
      }
      if (raw) {  // gate and up as they are, into two outputs
        const QuantMatmulOutput& up = outputs[1];
        e.store(out, nt, a.rows, y, a.o->ld, nullptr);
        e.store(out_up, nt, a.rows, up.y + t0 * up.ld + a.row0, up.ld, nullptr);
      } else {
        e.swiglu(out, out_up, nt, a.rows, y, a.o->ld);
      }
    } else if (second) {
      if constexpr (kPairs) run_pair(w.tile(first), w.tile(first + 1), t0, nt, out, out_up);
      store_tile(e, a, out, t0, nt);
      store_tile(e, b, out_up, t0, nt);
    } else {
      run_tile(w.tile(first), t0, nt, out);
      store_tile(e, a, out, t0, nt);
    }
    t0 += nt;
  }
}

int64_t num_units(const PackedWeight& w, bool pairs) {
  return w.swiglu() ? w.tiles() / 2 : (pairs ? (w.tiles() + 1) / 2 : w.tiles());
}

// Units per range of a matmul split over `threads`: a whole number of ranges per thread (so
// that threads running at one speed finish together), up to 8 each, but none under
// kMinRangeWork (weight bytes x tokens), below which each range's start (a new stream for the
// prefetchers, the epilogue set-up) costs more than the balance gains.
constexpr int64_t kMinRangeWork = int64_t{256} * 1024;

int64_t range_units(int64_t units, int64_t work_per_unit, int threads) {
  const int64_t per_thread =
      std::clamp<int64_t>(units * work_per_unit / std::max<int64_t>(1, threads * kMinRangeWork), 1, 8);
  const int64_t ranges = per_thread * threads;
  return std::max<int64_t>(1, (units + ranges - 1) / ranges);
}

// Runs run_unit over every unit of w, split over the pool; with run_pair (not NoPairs), two tiles
// per kernel call.
template <typename RunTile, typename RunPair = NoPairs>
void drive(const PackedWeight& w, std::span<const QuantMatmulOutput> outputs, int64_t tokens,
           ThreadPool& pool, Isa isa, RunTile run_tile, RunPair run_pair = {}) {
  const bool raw = w.swiglu() && outputs.size() == 2;
  INFERD_CHECK(raw || outputs.size() == (w.swiglu() ? 1 : w.num_parts()));
  if (tokens == 0) return;
  const Epilogues e = epilogues(isa);
  const TokenGroups groups = token_groups(isa, w, tokens);
  constexpr bool kPairs = !std::is_same_v<RunPair, NoPairs>;
  // Units are taken in ranges of about an eighth of a thread's share: the two threads of a core
  // (or a thread the host pauses) do not run at the same speed, and a static halving left the
  // faster one spinning for 3-8 % of a decode step. Each unit's rows come from one thread's
  // arithmetic, whichever it is, so the result does not depend on the split.
  const int64_t units = num_units(w, kPairs);
  const int64_t grain = range_units(
      units, static_cast<int64_t>(w.num_bytes() / static_cast<size_t>(units)) * tokens, pool.num_threads());
  pool.parallel_for_dynamic(units, grain, [&](int64_t begin, int64_t end) {
    alignas(64) float out[kAmxTokens * kQuantTileRows];
    alignas(64) float out_up[kAmxTokens * kQuantTileRows];
    prepare_thread(isa, w, tokens);
    for (int64_t u = begin; u < end; ++u)
      run_unit(w, outputs.data(), raw, u, tokens, e, groups, run_tile, run_pair, out, out_up);
  });
}

// The AMX kernel's view of one matmul's activations: their block scales and scaled sums tiled
// [group of 16 tokens][block][16 tokens], and the call's id for the weight caches.
struct AmxActivations {
  std::vector<float> scales;
  std::vector<float> scaled_sums;
  uint64_t call = 0;
#if defined(__x86_64__)
  PerThread<AmxWeightCache> weights;  // each thread's prepared weight tiles of this call
#endif
};

// Fills `out` for x's whole groups of 16 tokens, and grows the weight caches of every thread of
// `pool` (grown, never shrunk: no allocation once warm, whichever thread runs which tile).
void tile_amx_activations(const QuantizedActivations& x, AmxActivations& out, const ThreadPool& pool) {
  const int64_t groups = x.tokens() / kAmxTokens, nb = x.blocks();
  const auto n = static_cast<size_t>(groups * nb * kAmxTokens);
  if (out.scales.size() < n) {
    out.scales.resize(n);
    out.scaled_sums.resize(n);
  }
#if defined(__x86_64__)
  const auto tile_bytes = static_cast<size_t>(x.k() / kQuantBlockValues) * kAmxMaxBlockBytes;
  out.weights.prepare(pool, [&](AmxWeightCache& c) { c.reserve(tile_bytes); });
#else
  (void)pool;
#endif
  for (int64_t g = 0; g < groups; ++g) {
    for (int t = 0; t < kAmxTokens; ++t) {
      const float* d = x.scale(g * kAmxTokens + t);
      const float* ss = x.scaled_sum(g * kAmxTokens + t);
      for (int64_t b = 0; b < nb; ++b) {
        const auto i = static_cast<size_t>((g * nb + b) * kAmxTokens + t);
        out.scales[i] = d[b];
        out.scaled_sums[i] = ss[b];
      }
    }
  }
#if defined(__x86_64__)
  out.call = next_amx_call();
#endif
}

// The integer tile kernel of `isa` over tokens t0 .. t0 + nt of one tile of w.
void run_quant_tile(Isa isa, const PackedWeight& w, const QuantizedActivations& x, AmxActivations& amx,
                    const std::byte* tile, int64_t t0, int nt, float* out) {
  const size_t header = tile_header_bytes(w.dtype());
  const int64_t blocks = w.cols() / kQuantBlockValues;
  const auto* row_scale = header != 0 ? reinterpret_cast<const float*>(tile) : nullptr;
  TileArgs args{
      tile + header, row_scale, blocks, w.block_bytes(), &x, t0, nt, out, w.tile(0) + w.num_bytes()};
#if defined(__x86_64__)
  if (nt == kAmxTokens) {
    AmxWeightCache& cache = amx.weights.mine();
    const std::byte* first = tile + header;
    const AmxFunctions f = amx_functions(w.dtype());
    const auto kernel = static_cast<int>(amx_int8_kernel());
    args.amx_weights = cache.get(first, amx.call, static_cast<size_t>(blocks) * f.block_bytes[kernel],
                                 [&](int8_t* b) { f.prepare[kernel](first, w.block_bytes(), blocks, b); });
    const auto offset = static_cast<size_t>(t0 / kAmxTokens * blocks * kAmxTokens);
    args.amx_scales = amx.scales.data() + offset;
    args.amx_scaled_sums = amx.scaled_sums.data() + offset;
  }
#endif
  tile_kernel(isa, w.dtype(), nt)(args);
}

// One float matmul's activations: f32 rows, and for BF16 weights the rows rounded to bf16 (kb
// apart).
struct FloatActivations {
  const float* x;
  const uint16_t* xb;
  int64_t kb;
};

// The float tile kernel of `isa` over tokens t0 .. t0 + nt of one tile of w.
void run_float_tile(Isa isa, const PackedWeight& w, const FloatActivations& a, const std::byte* tile,
                    int64_t t0, int nt, float* out) {
  const size_t header = tile_header_bytes(w.dtype());
  const auto* row_scale = header != 0 ? reinterpret_cast<const float*>(tile) : nullptr;
  const int64_t k = w.cols();
  FloatTileArgs args{tile + header,
                     row_scale,
                     k,
                     a.x + t0 * k,
                     nt,
                     out,
                     nullptr,
                     a.xb != nullptr ? a.xb + t0 * a.kb : nullptr,
                     a.kb};
#if defined(__x86_64__)
  if (amx_bf16_path(isa, w))
    return amx_emulation() ? float_tile_amx_bf16<true>(args) : float_tile_amx_bf16<false>(args);
#endif
  float_tile_kernel(isa, w.dtype(), nt)(args);
}

// The pair kernel of `isa` (pairs_tiles) over tokens t0 .. t0 + nt of two tiles of w. Compiled for
// AVX-512 (it only runs where the pair kernels do): built for the baseline ISA, its legacy-SSE
// zeroing of `args` between two AVX-512 kernel calls took 2.5 % of an F16 prefill's samples on
// Zen 5, nearly all on the instruction after it; with VEX/EVEX encodings, 0.1 %.
INFERD_AVX512 void run_float_pair(Isa isa, const PackedWeight& w, const FloatActivations& a,
                                  const std::byte* tile, const std::byte* tile_b, int64_t t0, int nt,
                                  float* out, float* out_b) {
  INFERD_CHECK(tile_header_bytes(w.dtype()) == 0);
  const int64_t k = w.cols();
  FloatTileArgs args{.tile = tile,
                     .row_scale = nullptr,
                     .k = k,
                     .x = a.x + t0 * k,
                     .num_tokens = nt,
                     .out = out,
                     .end = nullptr,
                     .xb = a.xb != nullptr ? a.xb + t0 * a.kb : nullptr,
                     .kb = a.kb,
                     .tile_b = tile_b,
                     .out_b = out_b};
  float_pair_kernel(isa, w.dtype(), nt)(args);
}

// BF16 weights: the row length of their rounded activations (k rounded up to even); 0 otherwise.
int64_t bf16_row(const PackedWeight& w, int64_t k, Isa isa) {
  if (!w.is_float() || w.dtype() != DType::kBF16) return 0;
#if defined(__x86_64__)
  if (amx_bf16_path(isa, w)) return float_packed_cols(DType::kBF16, k);  // the AMX kernel's rows
#else
  (void)isa;
#endif
  return (k + 1) / 2 * 2;
}

// x [tokens][k] rounded to bf16 into `buf` (grown, never shrunk: no allocation once warm), split
// over the pool when there are enough rows for it to pay.
// The AMX-BF16 kernel reads 16 rows from a group's first: the buffer has kAmxTokens - 1 more.
const uint16_t* activations_as_bf16(const float* x, int64_t tokens, int64_t k, int64_t kb,
                                    std::vector<uint16_t>& buf, ThreadPool& pool, Isa isa) {
  const auto need = static_cast<size_t>((tokens + kAmxTokens - 1) * kb);
  if (buf.size() < need) buf.resize(need);
  uint16_t* out = buf.data();
  for_rows(&pool, tokens, [&](int64_t begin, int64_t end) {
    round_to_bf16(x + begin * k, end - begin, k, kb, out + begin * kb, isa);
  });
  return out;
}

}  // namespace

void quant_matmul(const QuantizedActivations& x, const PackedWeight& w,
                  std::span<const QuantMatmulOutput> outputs, ThreadPool& pool, Isa isa) {
  INFERD_CHECK(!w.is_float() && x.k() == w.cols());
  thread_local AmxActivations amx_state;
  AmxActivations& amx = amx_state;  // the caller's: the workers reach it through this reference
  if (uses_amx(isa, w, x.tokens())) tile_amx_activations(x, amx, pool);
  drive(w, outputs, x.tokens(), pool, isa, [&](const std::byte* tile, int64_t t0, int nt, float* out) {
    run_quant_tile(isa, w, x, amx, tile, t0, nt, out);
  });
}

void float_matmul(const float* x, int64_t tokens, const PackedWeight& w,
                  std::span<const QuantMatmulOutput> outputs, ThreadPool& pool, Isa isa) {
  INFERD_CHECK(w.is_float());
  const int64_t k = w.cols();
  thread_local std::vector<uint16_t> rounded;  // the caller's; workers read it through xb
  const int64_t kb = bf16_row(w, k, isa);
  const uint16_t* xb = kb > 0 ? activations_as_bf16(x, tokens, k, kb, rounded, pool, isa) : nullptr;
  auto run_tile = [&](const std::byte* tile, int64_t t0, int nt, float* out) {
    run_float_tile(isa, w, {x, xb, kb}, tile, t0, nt, out);
  };
  if (pairs_tiles(isa, w, tokens)) {
    drive(w, outputs, tokens, pool, isa, run_tile,
          [&](const std::byte* tile, const std::byte* tile_b, int64_t t0, int nt, float* out, float* out_b) {
            run_float_pair(isa, w, {x, xb, kb}, tile, tile_b, t0, nt, out, out_b);
          });
  } else {
    drive(w, outputs, tokens, pool, isa, run_tile);
  }
}

void packed_matmul(const float* x, int64_t tokens, const PackedWeight& w, QuantizedActivations& scratch,
                   std::span<const QuantMatmulOutput> outputs, ThreadPool& pool) {
  if (w.is_float()) return float_matmul(x, tokens, w, outputs, pool);
  scratch.quantize(x, tokens, w.cols());
  quant_matmul(scratch, w, outputs, pool);
}

void packed_matmul_groups(std::span<const PackedMatmulGroup> groups, ThreadPool& pool, Isa isa) {
  // first[g]: the first unit of group g in the combined range the threads split.
  thread_local std::vector<int64_t> first_list;  // the caller's; workers reach it through `first`
  std::vector<int64_t>& first = first_list;
  first.assign(groups.size() + 1, 0);
  int64_t work = 0;  // weight bytes x tokens, over the groups
  for (size_t g = 0; g < groups.size(); ++g) {
    const PackedMatmulGroup& grp = groups[g];
    INFERD_CHECK(grp.w != nullptr && (grp.w->swiglu() || grp.w->num_parts() == 1));
    INFERD_CHECK(grp.tokens == 0 || (grp.w->is_float() ? grp.x_f32 != nullptr
                                                       : grp.x != nullptr && grp.x->k() == grp.w->cols() &&
                                                             grp.x->tokens() >= grp.tokens));
    first[g + 1] = first[g] + (grp.tokens > 0 ? num_units(*grp.w, pairs_tiles(isa, *grp.w, grp.tokens)) : 0);
    if (grp.tokens > 0) work += static_cast<int64_t>(grp.w->num_bytes()) * grp.tokens;
  }
  if (first.back() == 0) return;
  // BF16 float groups: their activations rounded once, before the threads split the tiles.
  thread_local std::vector<std::vector<uint16_t>> rounded;  // the caller's, one per group
  if (rounded.size() < groups.size()) rounded.resize(groups.size());
  thread_local std::vector<const uint16_t*> group_xb_list;
  std::vector<const uint16_t*>& group_xb = group_xb_list;  // the workers reach the caller's through this
  group_xb.assign(groups.size(), nullptr);
  for (size_t g = 0; g < groups.size(); ++g) {
    const PackedMatmulGroup& grp = groups[g];
    const int64_t kb = bf16_row(*grp.w, grp.w->cols(), isa);
    if (grp.tokens > 0 && kb > 0)
      group_xb[g] = activations_as_bf16(grp.x_f32, grp.tokens, grp.w->cols(), kb, rounded[g], pool, isa);
  }
  // Integer groups on the AMX path: their activations' scales tiled once, before the split.
  thread_local std::vector<AmxActivations> amx_list;  // the caller's, one per group
  if (amx_list.size() < groups.size()) amx_list.resize(groups.size());
  std::vector<AmxActivations>& amx = amx_list;
  for (size_t g = 0; g < groups.size(); ++g) {
    const PackedMatmulGroup& grp = groups[g];
    if (!grp.w->is_float() && uses_amx(isa, *grp.w, grp.tokens)) tile_amx_activations(*grp.x, amx[g], pool);
  }
  const Epilogues e = epilogues(isa);
  const int64_t grain = range_units(first.back(), work / first.back(), pool.num_threads());
  pool.parallel_for_dynamic(first.back(), grain, [&](int64_t begin, int64_t end) {
    alignas(64) float out[kAmxTokens * kQuantTileRows];
    alignas(64) float out_up[kAmxTokens * kQuantTileRows];
    auto g = static_cast<size_t>(std::upper_bound(first.begin(), first.end(), begin) - first.begin() - 1);
    bool configured = false;  // the AMX tile configuration loaded on this thread
    for (int64_t u = begin; u < end; ++u) {
      while (u >= first[g + 1]) ++g;
      const PackedMatmulGroup& grp = groups[g];
      const PackedWeight& w = *grp.w;
      // The same tile kernels, with the same arguments, as quant_matmul / float_matmul.
      auto run_tile = [&](const std::byte* tile, int64_t t0, int nt, float* o) {
        if (w.is_float()) {
          run_float_tile(isa, w, {grp.x_f32, group_xb[g], bf16_row(w, w.cols(), isa)}, tile, t0, nt, o);
        } else {
          run_quant_tile(isa, w, *grp.x, amx[g], tile, t0, nt, o);
        }
      };
      if (!configured && uses_amx(isa, w, grp.tokens)) {
        prepare_thread(isa, w, grp.tokens);
        configured = true;
      }
      const TokenGroups tg = token_groups(isa, w, grp.tokens);
      if (pairs_tiles(isa, w, grp.tokens)) {
        auto run_pair = [&](const std::byte* tile, const std::byte* tile_b, int64_t t0, int nt, float* o,
                            float* o_b) {
          run_float_pair(isa, w, {grp.x_f32, group_xb[g], bf16_row(w, w.cols(), isa)}, tile, tile_b, t0, nt,
                         o, o_b);
        };
        run_unit(w, &grp.out, false, u - first[g], grp.tokens, e, tg, run_tile, run_pair, out, out_up);
      } else {
        NoPairs none;
        run_unit(w, &grp.out, false, u - first[g], grp.tokens, e, tg, run_tile, none, out, out_up);
      }
    }
  });
}

}  // namespace inferd
