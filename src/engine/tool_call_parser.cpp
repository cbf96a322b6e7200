#include "engine/tool_call_parser.h"

#include <algorithm>
#include <random>

#include <nlohmann/json.hpp>

#include "common/text.h"

namespace inferd {

namespace {

constexpr std::string_view kHermesOpen = "<tool_call>";
constexpr std::string_view kHermesClose = "</tool_call>";
constexpr std::string_view kPythonTag = "<|python_tag|>";

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

bool is_arguments_key(const std::string& key) {
  return key == "arguments" || key == "parameters";
}

// The value of a JSON string literal (with its quotes); empty if it is not one.
std::string string_value(std::string_view literal) {
  auto j = nlohmann::json::parse(literal, nullptr, /*allow_exceptions=*/false);
  return j.is_string() ? j.get<std::string>() : std::string();
}

}  // namespace

std::string make_tool_call_id() {
  static constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  thread_local std::mt19937_64 rng{std::random_device{}()};
  std::string id = "call_";
  for (int i = 0; i < 24; ++i) id += kAlphabet[rng() % (sizeof(kAlphabet) - 1)];
  return id;
}

ToolCallParser::ToolCallParser(ToolCallFormat format, int32_t max_calls)
    : format_(format), max_calls_(max_calls), state_(State::kOpening) {}

ToolCallParser::Parts ToolCallParser::feed(std::string_view text) {
  pending_.append(text);
  return drain(false);
}

ToolCallParser::Parts ToolCallParser::finish() {
  return drain(true);
}

ToolCallParser::Parts ToolCallParser::drain(bool final) {
  Parts out;
  for (;;) {
    switch (state_) {
      case State::kOpening: {  // llama3_json decides by how the output opens; hermes has no opening
        if (format_ == ToolCallFormat::kHermes) {
          state_ = State::kContent;
          continue;
        }
        const size_t first = pending_.find_first_not_of(" \t\r\n");
        if (first == std::string::npos) {
          if (!final) return out;
          state_ = State::kContent;
          continue;
        }
        std::string_view rest = std::string_view(pending_).substr(first);
        if (rest.substr(0, kPythonTag.size()) == kPythonTag) {
          pending_.erase(0, first + kPythonTag.size());
          continue;
        }
        if (!final && kPythonTag.substr(0, rest.size()) == rest) return out;
        if (rest[0] == '{') {
          pending_.erase(0, first);
          scan_ = Scan{};
          state_ = State::kCall;
        } else {
          state_ = State::kContent;
        }
        continue;
      }
      case State::kContent: {
        if (format_ == ToolCallFormat::kLlama3Json) {  // not a call: all content
          out.content += pending_;
          pending_.clear();
          return out;
        }
        if (strip_space_) {  // the whitespace after a call belongs to neither part
          const size_t body = pending_.find_first_not_of(" \t\r\n");
          pending_.erase(0, body == std::string::npos ? pending_.size() : body);
          if (pending_.empty()) return out;
          strip_space_ = false;
        }
        const size_t at = pending_.find(kHermesOpen);
        if (at != std::string::npos) {
          out.content += pending_.substr(0, at);
          pending_.erase(0, at + kHermesOpen.size());
          scan_ = Scan{};
          state_ = State::kCall;
          continue;
        }
        const size_t hold = final ? 0 : partial_tag_suffix(pending_, kHermesOpen);
        out.content += pending_.substr(0, pending_.size() - hold);
        pending_.erase(0, pending_.size() - hold);
        return out;
      }
      case State::kCall: {
        scan_.body += pending_;
        pending_.clear();
        scan_call(&out);
        if (!scan_.done && !final) return out;
        pending_ = scan_.body.substr(scan_.pos);  // text after the call's object
        scan_.body.resize(scan_.pos);
        end_call(&out);
        state_ = scan_.malformed ? State::kContent : State::kAfterCall;  // malformed: its text was content
        continue;
      }
      case State::kAfterCall: {
        const size_t first =
            pending_.find_first_not_of(format_ == ToolCallFormat::kHermes ? " \t\r\n" : " \t\r\n;");
        if (first == std::string::npos) {
          if (final) pending_.clear();
          return out;
        }
        std::string_view rest = std::string_view(pending_).substr(first);
        if (format_ == ToolCallFormat::kHermes) {
          if (rest.substr(0, kHermesClose.size()) == kHermesClose) {
            pending_.erase(0, first + kHermesClose.size());
            strip_space_ = true;
            state_ = State::kContent;
            continue;
          }
          if (!final && kHermesClose.substr(0, rest.size()) == rest) return out;
          pending_.erase(0, first);
          state_ = State::kContent;
          continue;
        }
        const bool next_call = rest[0] == '{';
        pending_.erase(0, first);
        if (next_call) scan_ = Scan{};
        state_ = next_call ? State::kCall : State::kContent;
        continue;
      }
    }
  }
}

// A small streaming scan of the call's JSON object: nesting, strings, the depth-1 keys, where
// the "name" string and the "arguments" (or "parameters") value start and end.
void ToolCallParser::scan_call(Parts* out) {
  Scan& s = scan_;
  for (; s.pos < s.body.size() && !s.done; ++s.pos) {
    const char c = s.body[s.pos];
    if (s.in_string) {
      if (s.escaped) {
        s.escaped = false;
      } else if (c == '\\') {
        s.escaped = true;
      } else if (c == '"') {
        s.in_string = false;
        const std::string value =
            string_value(std::string_view(s.body).substr(s.string_start, s.pos + 1 - s.string_start));
        if (s.reading_key) {
          s.key = value;
          s.reading_key = false;
        } else if (s.depth == 1 && s.key == "name" && !s.name) {
          s.name = value;
        } else if (s.depth == 1 && is_arguments_key(s.key) && s.args_start && !s.args_end) {
          s.args_end = s.pos + 1;
        }
      }
      continue;
    }
    const bool value_position = s.depth == 1 && s.after_colon;
    const bool starts_arguments = value_position && is_arguments_key(s.key) && !s.args_start;
    if (s.depth == 0) {
      if (is_space(c)) continue;
      if (c != '{') {  // not a JSON object: the "call" is malformed text
        s.malformed = true;
        s.done = true;
        s.pos = s.body.size();
        break;
      }
      s.depth = 1;
      continue;
    }
    switch (c) {
      case '"':
        s.in_string = true;
        s.string_start = s.pos;
        if (s.depth == 1 && !s.after_colon) s.reading_key = true;
        if (starts_arguments) s.args_start = s.pos;
        break;
      case '{':
      case '[':
        if (starts_arguments) s.args_start = s.pos;
        ++s.depth;
        break;
      case '}':
      case ']':
        --s.depth;
        if (s.depth == 1 && is_arguments_key(s.key) && s.args_start && !s.args_end) s.args_end = s.pos + 1;
        if (s.depth == 0) {
          if (s.args_start && !s.args_end) s.args_end = s.pos;  // a scalar value ran to the end
          s.done = true;
        }
        break;
      case ':':
        if (s.depth == 1) s.after_colon = true;
        break;
      case ',':
        if (s.depth == 1) {
          if (is_arguments_key(s.key) && s.args_start && !s.args_end) s.args_end = s.pos;
          s.after_colon = false;
        }
        break;
      default:
        if (starts_arguments && !is_space(c)) s.args_start = s.pos;  // a number, true, false, null
        break;
    }
    if (s.done) {
      ++s.pos;
      break;
    }
  }
  // Announce the call once its name is known; then send the arguments as far as they are written.
  if (s.malformed || num_calls_ >= max_calls_) return;
  if (!s.announced && s.name) {
    s.announced = true;
    s.index = num_announced_++;
    ToolCallDelta d;
    d.index = s.index;
    d.id = make_tool_call_id();
    d.name = *s.name;
    s.id = *d.id;
    out->calls.push_back(std::move(d));
  }
  if (s.announced && s.args_start) {
    const size_t end = s.args_end.value_or(s.pos);
    const size_t from = *s.args_start + s.args_sent;
    if (end > from) {
      ToolCallDelta d;
      d.index = s.index;
      d.arguments = s.body.substr(from, end - from);
      s.args_sent += d.arguments.size();
      out->calls.push_back(std::move(d));
    }
  }
}

void ToolCallParser::end_call(Parts* out) {
  Scan& s = scan_;
  const bool dropped = num_calls_ >= max_calls_;
  ++num_calls_;
  const auto j = nlohmann::json::parse(s.body, nullptr, /*allow_exceptions=*/false);
  const bool well_formed =
      !s.malformed && j.is_object() && s.name && j.contains("name") && j["name"].is_string();
  if (dropped) return;
  if (!s.announced) {
    // Never announced (no name): the text was not a call after all; nothing of it was sent.
    if (format_ == ToolCallFormat::kHermes) out->content += std::string(kHermesOpen);
    out->content += s.body;
    --num_calls_;
    return;
  }
  if (!s.args_start) {  // a call without arguments: "{}"
    ToolCallDelta d;
    d.index = s.index;
    d.arguments = "{}";
    out->calls.push_back(std::move(d));
    s.args_start = 0;
    s.args_end = 0;
  }
  if (!well_formed) return;  // announced, then broken off: what was sent stands, no call recorded
  ToolCall call;
  call.id = s.id;
  call.name = *s.name;
  call.arguments = s.args_end && *s.args_end > *s.args_start
                       ? s.body.substr(*s.args_start, *s.args_end - *s.args_start)
                       : std::string("{}");
  calls_.push_back(std::move(call));
}

}  // namespace inferd
