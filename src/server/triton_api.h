// The KServe v2 / Triton shapes inferd answers beside the OpenAI API, so that clients of a
// Triton-served model switch without change: the health and model endpoints of the KServe v2
// (Open Inference) protocol and Triton's generate extension (POST
// /v2/models/{name}[/versions/{v}]/generate and /generate_stream: "text_input" plus sampling
// parameters in, "text_output" out). A generate request is translated into the body of an
// OpenAI completions request, which the server runs as any other; the answers are shaped here.
// No I/O, no engine.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "engine/request.h"

namespace inferd {

// A request target under /v2, parsed (the query string already removed).
struct TritonRoute {
  enum class Kind {
    kServerMetadata,  // GET /v2
    kLive,            // GET /v2/health/live
    kReady,           // GET /v2/health/ready
    kModelMetadata,   // GET /v2/models/{name}[/versions/{v}]
    kModelReady,      // GET .../ready
    kGenerate,        // POST .../generate
    kGenerateStream,  // POST .../generate_stream
    kUnknown,
  };
  Kind kind = Kind::kUnknown;
  std::string model;    // URL-decoded
  std::string version;  // empty when the URL names none
};
// nullopt: not a /v2 target at all.
std::optional<TritonRoute> parse_triton_target(std::string_view target);

// The model version inferd reports and accepts (one model, one version).
inline constexpr const char* kTritonModelVersion = "1";

// The generate request `body` as the JSON body of an OpenAI completions request for `model`:
// "text_input" -> "prompt"; the sampling parameters (max_tokens, temperature, top_p, top_k,
// min_p, seed, stop, frequency_penalty, presence_penalty, repetition_penalty, ignore_eos,
// min_tokens), at the top level or in "parameters", under the same names (their values checked
// by the completions parser); "exclude_input_in_output": false -> "echo"; "stream" must agree
// with the endpoint. Refused (kInvalidArgument, naming the field): not a JSON object, no
// "text_input" string, any other field, a field given both at the top level and in
// "parameters". "id" (Triton's request id) is accepted and returned in `id`.
Expected<nlohmann::json> triton_to_completion(std::string_view body, const std::string& model, bool stream,
                                              std::string* id);

// {"error": message}.
std::string triton_error_body(const std::string& message);
// The /generate answer.
std::string triton_generate_body(const std::string& model, const std::string& id, const std::string& text,
                                 FinishReason reason);
// One /generate_stream event ("data: {...}\n\n"): the new text, "done" on the last one.
std::string triton_stream_event(const std::string& model, const std::string& id, const std::string& text,
                                std::optional<FinishReason> done);
// GET /v2 and GET /v2/models/{name}.
std::string triton_server_metadata(const std::string& version);
std::string triton_model_metadata(const std::string& model);

}  // namespace inferd
