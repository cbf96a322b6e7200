// Sets of Unicode code points (char classes of GBNF and regexes) and their compilation to UTF-8
// byte-range sequences: the grammar matches bytes, so a class becomes alternatives of byte ranges.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace inferd {

inline constexpr uint32_t kMaxCodepoint = 0x10FFFF;

// A set of code points as sorted, disjoint, non-adjacent closed ranges. Plain value type.
class CodepointSet final {
 public:
  CodepointSet() = default;
  static CodepointSet all();  // every scalar value: 0..0x10FFFF without the surrogates

  void add(uint32_t cp) { add_range(cp, cp); }
  void add_range(uint32_t lo, uint32_t hi);  // [lo, hi]; lo > hi adds nothing
  void add_set(const CodepointSet& other);
  // The scalar values not in the set (surrogates never included).
  CodepointSet complement() const;
  CodepointSet minus(const CodepointSet& other) const;
  bool contains(uint32_t cp) const;
  bool empty() const { return ranges_.empty(); }
  const std::vector<std::pair<uint32_t, uint32_t>>& ranges() const { return ranges_; }

 private:
  void normalize();
  std::vector<std::pair<uint32_t, uint32_t>> ranges_;
};

// One UTF-8 byte sequence pattern: byte i lies in [ranges[i].first, ranges[i].second].
struct Utf8Sequence {
  int num_bytes = 0;
  std::array<std::pair<uint8_t, uint8_t>, 4> ranges{};
};

// The UTF-8 encodings of exactly the (non-surrogate) code points of `set`, as byte-range
// sequences (the algorithm of Rust's regex-syntax Utf8Sequences): disjoint, at most a few per
// range.
std::vector<Utf8Sequence> utf8_sequences(const CodepointSet& set);

}  // namespace inferd
