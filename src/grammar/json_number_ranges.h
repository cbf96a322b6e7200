// GBNF for JSON numbers inside bounds: integers exactly (digit-range alternatives, as llama.cpp's
// json-schema-to-grammar), other numbers as a subset (docs/grammar.md). Internal to the module.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace inferd {

struct NumberBounds {
  std::optional<double> lower, upper;
  bool lower_exclusive = false, upper_exclusive = false;
};

// Integers (as JSON writes them: no leading zeros, no "-0") within `b`; empty when none is.
std::optional<std::string> integer_in_bounds_gbnf(const NumberBounds& b);

// Numbers within `b`: its integers, and k.ddd wherever the whole interval [k, k+1) (or (-(k+1), -k]
// for -k.ddd) lies within the bounds; no exponent. `fraction`: the rule of ".ddd". Empty when none.
std::optional<std::string> number_in_bounds_gbnf(const NumberBounds& b, const std::string& fraction);

// Non-negative integers in [lo, hi] (hi empty: up to 16 digits) as GBNF alternatives; empty when none.
std::optional<std::string> nonnegative_range_gbnf(int64_t lo, std::optional<int64_t> hi);

}  // namespace inferd
