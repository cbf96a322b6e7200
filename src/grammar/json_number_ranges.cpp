#include "grammar/json_number_ranges.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace inferd {

namespace {

constexpr int kMaxDigits = 16;

std::string digit_class(char lo, char hi) {
  if (lo == hi) return std::string("\"") + lo + "\"";
  return std::string("[") + lo + "-" + hi + "]";
}

std::string any_digits(size_t n) {
  if (n == 0) return "";
  return n == 1 ? "[0-9]" : "[0-9]{" + std::to_string(n) + "}";
}

std::string join(const std::string& a, const std::string& b) {
  if (a.empty()) return b;
  if (b.empty()) return a;
  return a + " " + b;
}

// Digit strings of equal length in [lo, hi] (leading zeros allowed: the caller fixes the first).
void same_length(const std::string& lo, const std::string& hi, const std::string& prefix,
                 std::vector<std::string>* out) {
  if (lo.empty()) {
    out->push_back(prefix.empty() ? "\"\"" : prefix);
    return;
  }
  if (lo[0] == hi[0]) {
    same_length(lo.substr(1), hi.substr(1), join(prefix, digit_class(lo[0], lo[0])), out);
    return;
  }
  const size_t rest = lo.size() - 1;
  const bool lo_rest_zero = lo.find_first_not_of('0', 1) == std::string::npos;
  const bool hi_rest_nine = hi.find_first_not_of('9', 1) == std::string::npos;
  char first = lo[0], last = hi[0];
  if (!lo_rest_zero) {
    same_length(lo.substr(1), std::string(rest, '9'), join(prefix, digit_class(lo[0], lo[0])), out);
    ++first;
  }
  if (!hi_rest_nine) --last;
  if (first <= last) out->push_back(join(join(prefix, digit_class(first, last)), any_digits(rest)));
  if (!hi_rest_nine)
    same_length(std::string(rest, '0'), hi.substr(1), join(prefix, digit_class(hi[0], hi[0])), out);
}

std::string alternatives(const std::vector<std::string>& alts) {
  if (alts.size() == 1) return alts[0];
  std::string out = "(";
  for (size_t i = 0; i < alts.size(); ++i) out += (i > 0 ? " | " : " ") + alts[i];
  return out + " )";
}

int64_t pow10(int n) {
  int64_t v = 1;
  for (int i = 0; i < n; ++i) v *= 10;
  return v;
}

// The smallest integer satisfying the lower bound / the largest satisfying the upper one.
std::optional<int64_t> lowest_integer(const NumberBounds& b) {
  if (!b.lower) return std::nullopt;
  const double c = std::ceil(*b.lower);
  return static_cast<int64_t>(b.lower_exclusive && c == *b.lower ? c + 1 : c);
}
std::optional<int64_t> highest_integer(const NumberBounds& b) {
  if (!b.upper) return std::nullopt;
  const double f = std::floor(*b.upper);
  return static_cast<int64_t>(b.upper_exclusive && f == *b.upper ? f - 1 : f);
}

// Integers in [lo, hi], either end open.
std::optional<std::string> integer_range(std::optional<int64_t> lo, std::optional<int64_t> hi) {
  if (lo && hi && *lo > *hi) return std::nullopt;
  std::vector<std::string> parts;
  if (!lo || *lo < 0) {  // negatives: -k for k in [max(1, -hi), -lo]
    const int64_t k_lo = hi && *hi < 0 ? -*hi : 1;
    const std::optional<int64_t> k_hi = lo ? std::optional<int64_t>(-*lo) : std::nullopt;
    if (auto neg = nonnegative_range_gbnf(k_lo, k_hi)) parts.push_back("\"-\" " + *neg);
  }
  if (!hi || *hi >= 0) {
    if (auto pos = nonnegative_range_gbnf(lo ? std::max<int64_t>(*lo, 0) : 0, hi)) parts.push_back(*pos);
  }
  if (parts.empty()) return std::nullopt;
  return alternatives(parts);
}

}  // namespace

std::optional<std::string> nonnegative_range_gbnf(int64_t lo, std::optional<int64_t> hi) {
  const int64_t cap = pow10(kMaxDigits) - 1;
  const int64_t top = hi ? std::min(*hi, cap) : cap;
  if (lo > top) return std::nullopt;
  std::vector<std::string> alts;
  const int lo_len = static_cast<int>(std::to_string(lo).size());
  const int hi_len = static_cast<int>(std::to_string(top).size());
  for (int n = lo_len; n <= hi_len; ++n) {
    const int64_t a = n == lo_len ? lo : pow10(n - 1);
    const int64_t b = n == hi_len ? top : pow10(n) - 1;
    if (!hi && n == lo_len + 1) {
      // Open above: every longer number, in one alternative.
      alts.push_back("[1-9] [0-9]{" + std::to_string(n - 1) + "," + std::to_string(kMaxDigits - 1) + "}");
      break;
    }
    same_length(std::to_string(a), std::to_string(b), "", &alts);
  }
  return alternatives(alts);
}

std::optional<std::string> integer_in_bounds_gbnf(const NumberBounds& b) {
  return integer_range(lowest_integer(b), highest_integer(b));
}

std::optional<std::string> number_in_bounds_gbnf(const NumberBounds& b, const std::string& fraction) {
  std::vector<std::string> parts;
  if (auto ints = integer_in_bounds_gbnf(b)) parts.push_back(*ints);
  // k.ddd in [k, k+1): k >= the lowest integer allowed, k + 1 <= upper.
  {
    const int64_t k_lo = std::max<int64_t>(0, lowest_integer(b).value_or(0));
    const std::optional<int64_t> k_hi =
        b.upper ? std::optional<int64_t>(static_cast<int64_t>(std::floor(*b.upper)) - 1) : std::nullopt;
    if (auto ks = nonnegative_range_gbnf(k_lo, k_hi)) parts.push_back(*ks + " " + fraction);
  }
  // -k.ddd in (-(k+1), -k]: -k within the upper bound, -(k+1) >= lower.
  {
    int64_t k_lo = 0;
    if (b.upper) {
      const double c = std::ceil(-*b.upper);
      k_lo = std::max<int64_t>(0, static_cast<int64_t>(b.upper_exclusive && c == -*b.upper ? c + 1 : c));
    }
    const std::optional<int64_t> k_hi =
        b.lower ? std::optional<int64_t>(static_cast<int64_t>(std::floor(-*b.lower)) - 1) : std::nullopt;
    if (!k_hi || *k_hi >= 0) {
      if (auto ks = nonnegative_range_gbnf(k_lo, k_hi)) parts.push_back("\"-\" " + *ks + " " + fraction);
    }
  }
  if (parts.empty()) return std::nullopt;
  return alternatives(parts);
}

}  // namespace inferd
