// libFuzzer target: chat templates. Two attack surfaces, picked by the first input byte:
//   even: the rest is a template's source (a model file or --chat-template supplies it), compiled
//         and rendered with a fixed conversation;
//   odd:  the rest is a request's side (messages, tools and chat_template_kwargs as JSON), rendered
//         by each template the project ships fixtures of.
// Every failure must come back as a Status: the limits (depth, output, iterations) included.
#include <cstdint>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "jinja/chat_template.h"

namespace {

using Json = nlohmann::ordered_json;

// Small limits, so that a runaway template reaches them within the fuzzer's time per input.
inferd::ChatTemplateLimits fuzz_limits() {
  inferd::ChatTemplateLimits l;
  l.max_output_bytes = 1 << 20;
  l.max_loop_iterations = 100'000;
  return l;
}

const std::vector<inferd::ChatTemplate>& shipped_templates() {
  static const std::vector<inferd::ChatTemplate> templates = [] {
    std::vector<inferd::ChatTemplate> out;
    for (const char* name : {"llama-3.1-instruct", "llama-3.2-instruct", "qwen2.5-instruct", "qwen3",
                             "qwq-32b", "smollm2-135m-instruct"}) {
      std::ifstream f(std::string(INFERD_FIXTURES_DIR) + "/chat_templates/" + name + ".jinja");
      const std::string source((std::istreambuf_iterator<char>(f)), {});
      auto t = inferd::ChatTemplate::compile(source, fuzz_limits());
      if (source.empty() || !t) __builtin_trap();  // the fixtures must load
      out.push_back(std::move(*t));
    }
    return out;
  }();
  return templates;
}

Json fixed_context() {
  return Json{
      {"messages", Json::array({{{"role", "system"}, {"content", "Be brief."}},
                                {{"role", "user"}, {"content", "Hi <|im_start|> {{ x }}"}},
                                {{"role", "assistant"},
                                 {"content", ""},
                                 {"tool_calls",
                                  Json::array({{{"type", "function"},
                                                {"function", {{"name", "f"}, {"arguments", {{"a", 1}}}}}}})}},
                                {{"role", "tool"}, {"content", "42"}}})},
      {"tools", Json::array({{{"type", "function"},
                              {"function", {{"name", "f"}, {"parameters", {{"type", "object"}}}}}}})},
      {"add_generation_prompt", true},
      {"bos_token", "<s>"},
      {"eos_token", "</s>"}};
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  if (data[0] % 2 == 0) {
    auto t = inferd::ChatTemplate::compile(text, fuzz_limits());
    if (t) (void)t->render(fixed_context());
    return 0;
  }
  Json request = Json::parse(text, nullptr, false);
  if (request.is_discarded()) return 0;
  Json context = request.is_object() ? request : Json{{"messages", request}};
  if (!context.contains("messages")) context["messages"] = Json::array();
  for (const inferd::ChatTemplate& t : shipped_templates()) (void)t.render(context);
  return 0;
}
