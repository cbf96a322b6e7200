// --speculative-config: vLLM's JSON object naming the drafting method and its settings.
#pragma once

#include <string>

#include "common/status.h"
#include "engine/scheduler.h"

namespace inferd {

// Parses '{"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_min": 2,
// "prompt_lookup_max": 4, "disable_by_batch_size": 4}' (every field but method optional; the
// defaults are SpeculativeOptions'). An empty string: speculation off. Refused, naming the field:
// malformed JSON, an unknown field (or one of the other method), a value out of range or of the
// wrong type, and methods not built (eagle, medusa, ...). '{"method": "draft_model", "model":
// PATH, "num_speculative_tokens": 3}' names a draft model; the caller loads it.
Expected<SpeculativeOptions> parse_speculative_config(const std::string& json);

}  // namespace inferd
