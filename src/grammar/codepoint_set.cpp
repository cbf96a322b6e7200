#include "grammar/codepoint_set.h"

#include <algorithm>

#include "common/text.h"

namespace inferd {

namespace {

constexpr uint32_t kSurrogateLo = 0xD800, kSurrogateHi = 0xDFFF;

void append_sequences(uint32_t lo, uint32_t hi, std::vector<Utf8Sequence>* out) {
  static constexpr uint32_t kMaxOfLength[] = {0x7F, 0x7FF, 0xFFFF};
  for (uint32_t max : kMaxOfLength) {
    if (lo <= max && hi > max) {
      append_sequences(lo, max, out);
      append_sequences(max + 1, hi, out);
      return;
    }
  }
  if (hi <= 0x7F) {
    Utf8Sequence s;
    s.num_bytes = 1;
    s.ranges[0] = {static_cast<uint8_t>(lo), static_cast<uint8_t>(hi)};
    out->push_back(s);
    return;
  }
  // Split until every continuation byte position spans a full or a single-prefix range.
  for (int i = 1; i < 4; ++i) {
    const uint32_t m = (1u << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        append_sequences(lo, lo | m, out);
        append_sequences((lo | m) + 1, hi, out);
        return;
      }
      if ((hi & m) != m) {
        append_sequences(lo, (hi & ~m) - 1, out);
        append_sequences(hi & ~m, hi, out);
        return;
      }
    }
  }
  const std::string a = utf8_encode(lo), b = utf8_encode(hi);
  Utf8Sequence s;
  s.num_bytes = static_cast<int>(a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    s.ranges[i] = {static_cast<uint8_t>(a[i]), static_cast<uint8_t>(b[i])};
  }
  out->push_back(s);
}

}  // namespace

CodepointSet CodepointSet::all() {
  CodepointSet s;
  s.add_range(0, kMaxCodepoint);
  return s;
}

void CodepointSet::add_range(uint32_t lo, uint32_t hi) {
  hi = std::min(hi, kMaxCodepoint);
  if (lo > hi) return;
  ranges_.emplace_back(lo, hi);
  normalize();
}

void CodepointSet::add_set(const CodepointSet& other) {
  ranges_.insert(ranges_.end(), other.ranges_.begin(), other.ranges_.end());
  normalize();
}

void CodepointSet::normalize() {
  std::sort(ranges_.begin(), ranges_.end());
  std::vector<std::pair<uint32_t, uint32_t>> merged;
  for (const auto& r : ranges_) {
    // Surrogates are not scalar values: cut them out.
    std::pair<uint32_t, uint32_t> parts[2] = {r, {1, 0}};
    if (r.first <= kSurrogateHi && r.second >= kSurrogateLo) {
      parts[0] = {r.first, kSurrogateLo - 1};
      parts[1] = {kSurrogateHi + 1, r.second};
      if (r.first >= kSurrogateLo) parts[0] = {1, 0};
      if (r.second <= kSurrogateHi) parts[1] = {1, 0};
    }
    for (const auto& p : parts) {
      if (p.first > p.second) continue;
      if (!merged.empty() && p.first <= merged.back().second + 1) {
        merged.back().second = std::max(merged.back().second, p.second);
      } else {
        merged.push_back(p);
      }
    }
  }
  ranges_ = std::move(merged);
}

CodepointSet CodepointSet::complement() const {
  CodepointSet out;
  uint32_t next = 0;
  for (const auto& r : ranges_) {
    if (r.first > next) out.ranges_.emplace_back(next, r.first - 1);
    next = r.second + 1;
  }
  if (next <= kMaxCodepoint) out.ranges_.emplace_back(next, kMaxCodepoint);
  out.normalize();
  return out;
}

CodepointSet CodepointSet::minus(const CodepointSet& other) const {
  CodepointSet keep = other.complement();
  CodepointSet out;
  // Intersection of two normalized range lists.
  size_t i = 0, j = 0;
  while (i < ranges_.size() && j < keep.ranges_.size()) {
    const uint32_t lo = std::max(ranges_[i].first, keep.ranges_[j].first);
    const uint32_t hi = std::min(ranges_[i].second, keep.ranges_[j].second);
    if (lo <= hi) out.ranges_.emplace_back(lo, hi);
    if (ranges_[i].second < keep.ranges_[j].second) {
      ++i;
    } else {
      ++j;
    }
  }
  return out;
}

bool CodepointSet::contains(uint32_t cp) const {
  auto it = std::upper_bound(ranges_.begin(), ranges_.end(), std::make_pair(cp, kMaxCodepoint + 1));
  return it != ranges_.begin() && std::prev(it)->second >= cp;
}

std::vector<Utf8Sequence> utf8_sequences(const CodepointSet& set) {
  std::vector<Utf8Sequence> out;
  for (const auto& r : set.ranges()) append_sequences(r.first, r.second, &out);
  return out;
}

}  // namespace inferd
