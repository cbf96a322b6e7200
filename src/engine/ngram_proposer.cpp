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

}  // namespace inferd
