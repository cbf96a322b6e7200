#include "engine/ngram_proposer.h"

#include <algorithm>

namespace inferd {

void propose_ngram(std::span<const int32_t> prompt, std::span<const int32_t> output,
                   const NgramOptions& options, int64_t max_tokens, std::vector<int32_t>* draft) {
  draft->clear();
  const auto len = static_cast<int64_t>(prompt.size() + output.size());
  auto at = [&](int64_t i) {
    const auto p = static_cast<size_t>(i);
    return p < prompt.size() ? prompt[p] : output[p - prompt.size()];
  };
  const int64_t want = std::min<int64_t>(options.num_speculative_tokens, max_tokens);
  if (want <= 0) return;
  for (int64_t n = std::min<int64_t>(options.prompt_lookup_max, len - 1); n >= options.prompt_lookup_min;
       --n) {
    // The latest start s < len - n whose n tokens equal the last n: the continuation the text
    // most recently took from there.
    for (int64_t s = len - n - 1; s >= 0; --s) {
      int64_t i = 0;
      while (i < n && at(s + i) == at(len - n + i)) ++i;
      if (i < n) continue;
      for (int64_t j = s + n; j < len && static_cast<int64_t>(draft->size()) < want; ++j)
        draft->push_back(at(j));
      return;
    }
  }
}

void propose_from_prediction(std::span<const int32_t> prediction, std::span<const int32_t> output, int32_t k,
                             int64_t max_tokens, int64_t* cursor, std::vector<int32_t>* draft) {
  draft->clear();
  const int64_t want = std::min<int64_t>(k, max_tokens);
  const auto len = static_cast<int64_t>(prediction.size());
  if (want <= 0 || output.empty() || len == 0) return;
  for (int64_t n = std::min<int64_t>(4, static_cast<int64_t>(output.size())); n >= 1; --n) {
    const std::span<const int32_t> tail = output.last(static_cast<size_t>(n));
    auto matches_at = [&](int64_t end) {  // prediction[end - n, end) == tail
      return std::equal(tail.begin(), tail.end(), prediction.begin() + (end - n));
    };
    int64_t found = -1;
    for (int64_t end = std::max(n, *cursor); end < len && found < 0; ++end) {
      if (matches_at(end)) found = end;
    }
    for (int64_t end = n; end < std::min(len, std::max(n, *cursor)) && found < 0; ++end) {
      if (matches_at(end)) found = end;
    }
    if (found < 0) continue;
    *cursor = found;
    for (int64_t j = found; j < len && static_cast<int64_t>(draft->size()) < want; ++j)
      draft->push_back(prediction[static_cast<size_t>(j)]);
    return;
  }
}

}  // namespace inferd
