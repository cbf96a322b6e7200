#include "server/triton_api.h"

#include <array>
#include <vector>

#include "common/text.h"

namespace inferd {

namespace {

using nlohmann::json;

// The generate parameters passed on to the completions request under the same name.
constexpr std::array<const char*, 12> kSampling = {
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "stop",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
    "ignore_eos",
    "min_tokens",
};

bool is_sampling(const std::string& key) {
  for (const char* k : kSampling)
    if (key == k) return true;
  return false;
}

// %XX escapes of a path segment decoded; nullopt for a bad escape.
std::optional<std::string> url_decode(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '%') {
      out += s[i];
      continue;
    }
    if (i + 2 >= s.size()) return std::nullopt;
    auto hex = [](char c) -> int {
      if (c >= '0' && c <= '9') return c - '0';
      if (c >= 'a' && c <= 'f') return c - 'a' + 10;
      if (c >= 'A' && c <= 'F') return c - 'A' + 10;
      return -1;
    };
    const int hi = hex(s[i + 1]), lo = hex(s[i + 2]);
    if (hi < 0 || lo < 0) return std::nullopt;
    out += static_cast<char>(hi * 16 + lo);
    i += 2;
  }
  return out;
}

std::vector<std::string_view> split_path(std::string_view path) {
  std::vector<std::string_view> parts;
  size_t start = 0;
  while (start <= path.size()) {
    const size_t slash = std::min(path.find('/', start), path.size());
    if (slash > start) parts.push_back(path.substr(start, slash - start));
    start = slash + 1;
  }
  return parts;
}

const char* reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kAborted: return "abort";
    case FinishReason::kError: return "error";
  }
  return "error";
}

std::string dump(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace

std::optional<TritonRoute> parse_triton_target(std::string_view target) {
  if (target != "/v2" && target.rfind("/v2/", 0) != 0) return std::nullopt;
  const std::vector<std::string_view> p = split_path(target);  // p[0] == "v2"
  TritonRoute r;
  using K = TritonRoute::Kind;
  if (p.size() == 1) {
    r.kind = K::kServerMetadata;
  } else if (p.size() == 3 && p[1] == "health") {
    r.kind = p[2] == "live" ? K::kLive : p[2] == "ready" ? K::kReady : K::kUnknown;
  } else if (p.size() >= 3 && p[1] == "models") {
    std::optional<std::string> model = url_decode(p[2]);
    if (!model) return r;
    r.model = *model;
    size_t next = 3;
    if (p.size() >= 5 && p[3] == "versions") {
      std::optional<std::string> version = url_decode(p[4]);
      if (!version) return r;
      r.version = *version;
      next = 5;
    } else if (p.size() == 4 && p[3] == "versions") {
      return r;
    }
    if (p.size() == next) {
      r.kind = K::kModelMetadata;
    } else if (p.size() == next + 1) {
      const std::string_view last = p[next];
      r.kind = last == "ready"             ? K::kModelReady
               : last == "generate"        ? K::kGenerate
               : last == "generate_stream" ? K::kGenerateStream
                                           : K::kUnknown;
    }
  }
  return r;
}

Expected<json> triton_to_completion(std::string_view body, const std::string& model, bool stream,
                                    std::string* id) {
  if (json_nests_deeper_than(body))
    return invalid_argument("the request body nests arrays and objects deeper than " +
                            std::to_string(kMaxJsonDepth) + " levels");
  json in = json::parse(body, nullptr, false);
  if (in.is_discarded() || !in.is_object()) return invalid_argument("the request body is not a JSON object");
  json out = {{"model", model}, {"stream", stream}};
  auto take = [&](const std::string& key, const json& value, const char* where) -> Status {
    if (is_sampling(key)) {
      if (out.contains(key))
        return invalid_argument("'" + key + "' is given both at the top level and in 'parameters'");
      out[key] = value;
      return Status::ok();
    }
    if (key == "stream") {
      if (!value.is_boolean()) return invalid_argument("'stream' must be a boolean");
      if (value.get<bool>() != stream)
        return invalid_argument(stream ? "'stream': false does not go with generate_stream (use generate)"
                                       : "'stream': true does not go with generate (use generate_stream)");
      return Status::ok();
    }
    if (key == "exclude_input_in_output") {
      if (!value.is_boolean()) return invalid_argument("'exclude_input_in_output' must be a boolean");
      if (!value.get<bool>()) out["echo"] = true;
      return Status::ok();
    }
    return invalid_argument(std::string("unsupported ") + where + " '" + key +
                            "' (supported: the sampling parameters max_tokens, temperature, top_p, top_k, "
                            "min_p, seed, stop, frequency_penalty, presence_penalty, repetition_penalty, "
                            "ignore_eos, min_tokens; stream, exclude_input_in_output)");
  };
  for (const auto& [key, value] : in.items()) {
    if (key == "text_input") {
      if (!value.is_string()) return invalid_argument("'text_input' must be a string");
      out["prompt"] = value;
    } else if (key == "id") {
      if (!value.is_string()) return invalid_argument("'id' must be a string");
      *id = value.get<std::string>();
    } else if (key == "parameters") {
      if (!value.is_object()) return invalid_argument("'parameters' must be an object");
      for (const auto& [pk, pv] : value.items()) INFERD_RETURN_IF_ERROR(take(pk, pv, "parameter"));
    } else {
      INFERD_RETURN_IF_ERROR(take(key, value, "field"));
    }
  }
  if (!out.contains("prompt")) return invalid_argument("'text_input' is required");
  return out;
}

std::string triton_error_body(const std::string& message) {
  return dump(json{{"error", message}});
}

std::string triton_generate_body(const std::string& model, const std::string& id, const std::string& text,
                                 FinishReason reason) {
  json j = {{"model_name", model},
            {"model_version", kTritonModelVersion},
            {"text_output", text},
            {"finish_reason", reason_name(reason)}};
  if (!id.empty()) j["id"] = id;
  return dump(j);
}

std::string triton_stream_event(const std::string& model, const std::string& id, const std::string& text,
                                std::optional<FinishReason> done) {
  json j = {{"model_name", model},
            {"model_version", kTritonModelVersion},
            {"text_output", text},
            {"done", done.has_value()}};
  if (done) j["finish_reason"] = reason_name(*done);
  if (!id.empty()) j["id"] = id;
  return "data: " + dump(j) + "\n\n";
}

std::string triton_server_metadata(const std::string& version) {
  return dump(json{{"name", "inferd"}, {"version", version}, {"extensions", json::array({"generate"})}});
}

std::string triton_model_metadata(const std::string& model) {
  auto tensor = [](const char* name) { return json{{"name", name}, {"datatype", "BYTES"}, {"shape", {1}}}; };
  return dump(json{{"name", model},
                   {"versions", json::array({kTritonModelVersion})},
                   {"platform", "inferd"},
                   {"inputs", json::array({tensor("text_input")})},
                   {"outputs", json::array({tensor("text_output")})}});
}

}  // namespace inferd
