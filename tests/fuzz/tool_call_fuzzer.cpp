// libFuzzer target: the tool-call parser on a model's output (any bytes a model can write), fed in
// chunks whose sizes the input picks, for both formats and both call limits. Checked: no more
// calls than the limit, and each call's arguments are JSON text (the value the model wrote, as
// vLLM's parsers pass it on: an object unless the model wrote something else).
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "engine/tool_call_parser.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  const auto format =
      data[0] % 2 == 0 ? inferd::ToolCallFormat::kHermes : inferd::ToolCallFormat::kLlama3Json;
  const int32_t max_calls = (data[0] / 2) % 2 == 0 ? 1 : 8;
  inferd::ToolCallParser parser(format, max_calls);
  size_t chunk = 1 + data[0] / 4 % 7;
  for (size_t at = 0; at < text.size(); at += chunk, chunk = chunk % 7 + 1)
    (void)parser.feed(text.substr(at, chunk));
  (void)parser.finish();
  if (parser.calls().size() > static_cast<size_t>(max_calls)) __builtin_trap();
  for (const inferd::ToolCall& call : parser.calls()) {
    const auto args = nlohmann::json::parse(call.arguments, nullptr, false);
    if (args.is_discarded()) __builtin_trap();
  }
  return 0;
}
