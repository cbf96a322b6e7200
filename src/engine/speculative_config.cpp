#include "engine/speculative_config.h"

#include <algorithm>
#include <type_traits>

#include <nlohmann/json.hpp>

namespace inferd {

Expected<SpeculativeOptions> parse_speculative_config(const std::string& text) {
  SpeculativeOptions o;
  if (text.empty()) return o;
  const auto j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object())
    return invalid_argument("--speculative-config: not a JSON object: " + text);
  if (!j.contains("method") || !j["method"].is_string())
    return invalid_argument("--speculative-config: \"method\" (a string) is required, e.g. \"ngram\"");
  const std::string method = j["method"].get<std::string>();
  if (method == "draft_model") {
    o.method = SpeculativeMethod::kDraftModel;
  } else if (method != "ngram") {
    return unsupported(
        "--speculative-config: method \"" + method +
        "\" is not supported; inferd drafts by prompt lookup (\"ngram\") or with a smaller model "
        "(\"draft_model\")");
  }
  auto integer = [&](const char* field, auto* out) -> Status {
    if (!j.contains(field)) return Status::ok();
    if (!j[field].is_number_integer() || j[field].get<int64_t>() < 0 || j[field].get<int64_t>() > (1 << 20))
      return invalid_argument(std::string("--speculative-config: \"") + field +
                              "\" must be an integer in [0, 1048576]");
    *out = static_cast<std::remove_reference_t<decltype(*out)>>(j[field].get<int64_t>());
    return Status::ok();
  };
  // Fields of the other method are refused, not ignored: each changes what the user gets.
  const bool ngram = o.method == SpeculativeMethod::kNgram;
  for (const auto& [key, value] : j.items()) {
    (void)value;
    const bool common = key == "method" || key == "num_speculative_tokens" || key == "disable_by_batch_size";
    const bool own = ngram ? key == "prompt_lookup_min" || key == "prompt_lookup_max" : key == "model";
    if (!common && !own)
      return invalid_argument("--speculative-config: unknown field \"" + key + "\" for method \"" + method +
                              "\"");
  }
  if (!ngram) {
    if (!j.contains("model") || !j["model"].is_string() || j["model"].get<std::string>().empty())
      return invalid_argument(
          "--speculative-config: method \"draft_model\" needs \"model\" (the draft's path)");
    o.draft_model = j["model"].get<std::string>();
  }
  INFERD_RETURN_IF_ERROR(integer("num_speculative_tokens", &o.ngram.num_speculative_tokens));
  INFERD_RETURN_IF_ERROR(integer("prompt_lookup_min", &o.ngram.prompt_lookup_min));
  INFERD_RETURN_IF_ERROR(integer("prompt_lookup_max", &o.ngram.prompt_lookup_max));
  INFERD_RETURN_IF_ERROR(integer("disable_by_batch_size", &o.disable_by_batch_size));
  // prompt_lookup_max alone, below the default minimum, takes the minimum down with it.
  if (j.contains("prompt_lookup_max") && !j.contains("prompt_lookup_min"))
    o.ngram.prompt_lookup_min = std::min(o.ngram.prompt_lookup_min, o.ngram.prompt_lookup_max);
  o.enabled = true;
  if (Status s = o.validate(); !s.is_ok()) return invalid_argument("--speculative-config: " + s.message());
  return o;
}

}  // namespace inferd
