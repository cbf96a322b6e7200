// OpenAI's batch file format, as `vllm run-batch` reads and writes it: each input line is one
// request, {"custom_id", "method": "POST", "url", "body"}; each output line its answer,
// {"id", "custom_id", "response": {"status_code", "request_id", "body"}, "error"}, or, for a line
// that is no request, "response": null and "error": {"code", "message"}. `inferd run-batch` runs
// the requests through the server's own endpoints (docs/server.md "Batch files").
#pragma once

#include <string>
#include <string_view>

namespace inferd {

// The endpoints a batch line may name.
bool batch_url_supported(std::string_view url);

struct BatchLine {
  std::string custom_id;  // as given (empty when absent or not a string)
  std::string url;
  std::string body;  // the body object, serialized
  // Why the line is no request ("custom_id must be a string", "url ... is not supported",
  // "body.stream: ..."); empty: a request.
  std::string error;
};

// Reads one input line; never fails: a bad line carries its error.
BatchLine parse_batch_line(std::string_view line);

// The output line (no newline) of an answered request: the endpoint's status and body (JSON; a
// body that is not JSON goes as a string).
std::string batch_answer_line(const BatchLine& line, int status_code, std::string_view body);

// The output line (no newline) of a line that is no request, or of one the server could not answer.
std::string batch_error_line(const BatchLine& line, std::string_view code, std::string_view message);

}  // namespace inferd
