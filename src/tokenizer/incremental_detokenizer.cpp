#include "tokenizer/incremental_detokenizer.h"

#include <algorithm>
#include <span>

#include "tokenizer/utf8.h"

namespace inferd {

IncrementalDetokenizer::IncrementalDetokenizer(const Tokenizer& tokenizer,
                                               std::vector<std::string> stop_strings, bool keep_special,
                                               int64_t min_tokens)
    : tokenizer_(tokenizer), keep_special_(keep_special), min_tokens_(min_tokens) {
  for (auto& s : stop_strings) {
    if (!s.empty()) stops_.push_back(std::move(s));
  }
}

IncrementalDetokenizer::Output IncrementalDetokenizer::push(int32_t id) {
  if (stopped_) return {};
  ++pushed_;
  if (id >= 0 && id < tokenizer_.vocab_size() && (keep_special_ || !tokenizer_.is_special(id))) {
    pending_ += tokenizer_.token_bytes(id);
  }
  return drain(false);
}

IncrementalDetokenizer::Output IncrementalDetokenizer::finish() {
  if (stopped_) return {};
  return drain(true);
}

IncrementalDetokenizer::Output IncrementalDetokenizer::drain(bool final) {
  Output out;
  // The earliest stop string anywhere in the pending bytes ends the text there; none is looked
  // for before min_tokens tokens, but the tail that could start one is held back all along, so a
  // stop string that ends in a later token is still found whole (as vLLM finds it).
  const std::span<const std::string> stops =
      pushed_ >= min_tokens_ ? std::span<const std::string>(stops_) : std::span<const std::string>();
  size_t stop_at = std::string::npos;
  for (const auto& s : stops) {
    const size_t at = pending_.find(s);
    if (at != std::string::npos && at < stop_at) {
      stop_at = at;
      out.matched_stop = s;
    }
  }
  size_t ready;
  if (stop_at != std::string::npos) {
    ready = stop_at;
    out.stopped = stopped_ = true;
  } else if (final) {
    ready = pending_.size();
  } else {
    ready = utf8_complete_prefix(pending_);
    // Hold back a tail that is a proper prefix of some stop string.
    for (const auto& s : stops_) {
      for (size_t len = std::min(s.size() - 1, pending_.size()); len > 0; --len) {
        if (pending_.compare(pending_.size() - len, len, s, 0, len) == 0) {
          ready = std::min(ready, pending_.size() - len);
          break;
        }
      }
    }
  }
  if (!out.stopped && !final) {
    // Never cut a character in two: back off to a character boundary of the ready text.
    ready = utf8_complete_prefix(std::string_view(pending_).substr(0, ready));
  }
  out.text = sanitize_utf8(std::string_view(pending_).substr(0, ready));
  pending_.erase(0, ready);
  emitted_ += out.text;
  return out;
}

}  // namespace inferd
