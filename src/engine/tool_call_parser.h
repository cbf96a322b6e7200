// ToolCallParser: the tool-call side of the output (OutputProcessor): finds the function calls a
// model writes in its text, in the format its --tool-call-parser names, as the text streams in.
//   hermes       Qwen2.5 / QwQ / Qwen3: <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>,
//                one block per call, text outside the blocks is content.
//   llama3_json  Llama 3.1 / 3.2: the output is {"name": ..., "parameters": {...}} (several joined
//                by ";"), optionally after <|python_tag|>; output that opens otherwise is content.
// A call's name is known once its "name" string closes; its arguments stream as the model writes
// them (the raw JSON text of the value, so the fragments concatenate to the final string).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace inferd {

enum class ToolCallFormat { kHermes, kLlama3Json };

// What feed() adds to the answer: new content, and for tool calls a header (index, id, name) the
// first time a call is seen, then argument fragments.
struct ToolCallDelta {
  int32_t index = 0;
  std::optional<std::string> id, name;  // set on a call's first delta only
  std::string arguments;                // the next fragment of the arguments' JSON text
};

struct ToolCall {
  std::string id, name, arguments;  // arguments: JSON text, the value the model wrote (normally an object)
};

class ToolCallParser final {
 public:
  // max_calls: calls beyond it are dropped (1 when parallel_tool_calls is false).
  ToolCallParser(ToolCallFormat format, int32_t max_calls);

  struct Parts {
    std::string content;
    std::vector<ToolCallDelta> calls;
  };
  Parts feed(std::string_view text);
  Parts finish();  // the end of the output: flushes text held back

  // The calls whose JSON was complete and well-formed, in order.
  const std::vector<ToolCall>& calls() const { return calls_; }

 private:
  enum class State { kContent, kOpening, kCall, kAfterCall };
  Parts drain(bool final);
  void scan_call(Parts* out);  // advances the JSON scan of the call in pending_
  void end_call(Parts* out);

  ToolCallFormat format_;
  int32_t max_calls_;
  State state_;
  std::string pending_;       // text not yet decided
  bool strip_space_ = false;  // drop the whitespace that follows a closed call

  // The call being scanned: its raw JSON so far, and where the scan stands in it.
  struct Scan {
    std::string body;
    size_t pos = 0;
    int depth = 0;  // nesting of { and [ (the call's own object is depth 1)
    bool in_string = false, escaped = false;
    std::string key;  // the last key read at depth 1
    bool reading_key = false, after_colon = false;
    size_t string_start = 0;           // in body
    std::optional<size_t> args_start;  // the arguments value's start in body
    std::optional<size_t> args_end;
    size_t args_sent = 0;  // bytes of the arguments value already sent
    std::optional<std::string> name;
    std::string id;
    int32_t index = 0;  // once announced
    bool announced = false;
    bool malformed = false;  // not a JSON object
    bool done = false;       // the call's object closed
  };
  Scan scan_;
  int32_t num_calls_ = 0;      // calls found (announced ones, and dropped ones beyond max_calls_)
  int32_t num_announced_ = 0;  // the next call's index
  std::vector<ToolCall> calls_;
};

// A tool-call id in OpenAI's style ("call_" and 24 random letters and digits).
std::string make_tool_call_id();

}  // namespace inferd
