#include "tokenizer/chat_encoder.h"

#include <algorithm>

#include "tokenizer/utf8.h"

namespace inferd {

namespace {

using nlohmann::ordered_json;

// The message with its content normalised to one well-formed string; appends it to `contents`.
Expected<ordered_json> normalise_message(const ordered_json& m, size_t index,
                                         std::vector<std::string>* contents) {
  if (!m.is_object() || !m.contains("role") || !m["role"].is_string()) {
    return invalid_argument("messages[" + std::to_string(index) + "] needs a string 'role'");
  }
  ordered_json out = m;
  std::string text;
  if (m.contains("content")) {
    const auto& c = m["content"];
    if (c.is_string()) {
      text = c.get<std::string>();
    } else if (c.is_array()) {
      for (const auto& part : c) {
        if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") ||
            !part["text"].is_string()) {
          return invalid_argument("messages[" + std::to_string(index) +
                                  "].content parts must be {\"type\": \"text\", \"text\": ...}");
        }
        text += part["text"].get<std::string>();
      }
    } else if (!c.is_null()) {
      return invalid_argument("messages[" + std::to_string(index) +
                              "].content must be a string or a list of text parts");
    }
    out["content"] = sanitize_utf8(text);
    contents->push_back(out["content"].get<std::string>());
  }
  return out;
}

}  // namespace

ChatOptions chat_options_for(std::optional<bool> add_generation_prompt, bool continue_final_message,
                             std::optional<bool> add_special_tokens, ordered_json template_kwargs) {
  ChatOptions o;
  o.add_generation_prompt = add_generation_prompt.value_or(!continue_final_message);
  o.continue_final_message = continue_final_message;
  o.add_special_tokens = add_special_tokens.value_or(false);
  o.template_kwargs = std::move(template_kwargs);
  return o;
}

Expected<ChatPrompt> encode_chat(const Tokenizer& tokenizer, const ChatTemplate& chat_template,
                                 const ordered_json& messages, const ChatOptions& options) {
  if (!messages.is_array() || messages.empty())
    return invalid_argument("'messages' must be a non-empty array");
  ordered_json context = ordered_json::object();
  std::vector<std::string> contents;
  ordered_json normalised = ordered_json::array();
  for (size_t i = 0; i < messages.size(); ++i) {
    INFERD_ASSIGN_OR_RETURN(ordered_json m, normalise_message(messages[i], i, &contents));
    normalised.push_back(std::move(m));
  }
  if (options.continue_final_message && options.add_generation_prompt)
    return invalid_argument("continue_final_message and add_generation_prompt cannot both be set");
  std::string final_content;  // continue_final_message: the text the prompt ends with
  if (options.continue_final_message) {
    const ordered_json& last = normalised.back();
    if (!last.contains("content") ||
        last["content"].get_ref<const std::string&>().find_first_not_of(" \t\r\n") == std::string::npos)
      return invalid_argument("continue_final_message needs text in the last message to continue");
    final_content = last["content"].get<std::string>();
  }
  context["messages"] = std::move(normalised);
  context["add_generation_prompt"] = options.add_generation_prompt;
  if (!options.tools.is_null()) context["tools"] = options.tools;
  const Vocab& v = tokenizer.vocab();
  if (v.bos_id) context["bos_token"] = v.tokens[static_cast<size_t>(*v.bos_id)];
  if (v.eos_id) context["eos_token"] = v.tokens[static_cast<size_t>(*v.eos_id)];
  if (options.template_kwargs.is_object()) {
    for (const auto& [key, value] : options.template_kwargs.items()) {
      if (key == "messages") return invalid_argument("chat_template_kwargs must not set 'messages'");
      context[key] = value;
    }
  }
  INFERD_ASSIGN_OR_RETURN(std::string text, chat_template.render(context));
  if (options.continue_final_message) {
    // The last occurrence of the content (stripped: templates may trim it) ends the prompt; with
    // its leading space and trailing whitespace kept where the template kept them.
    const std::string_view blank = " \t\r\n";
    const size_t b = final_content.find_first_not_of(blank);
    const size_t e = final_content.find_last_not_of(blank);
    const std::string stripped = final_content.substr(b, e - b + 1);  // not empty: checked above
    const size_t at = text.rfind(stripped);
    if (at == std::string::npos)
      return invalid_argument(
          "continue_final_message: the last message's content does not appear in the rendered chat "
          "(the chat template changes it)");
    const std::string lstripped = final_content.substr(b);
    const bool kept = text.compare(at, lstripped.size(), lstripped) == 0;
    text.resize(at + (kept ? lstripped.size() : stripped.size()));
  }
  // Where each content landed in the rendered text (searched in order): specials stay plain
  // there. A content the template rewrote is not found and gets no protection of its own.
  std::vector<std::pair<size_t, size_t>> plain;
  size_t from = 0;
  for (const auto& c : contents) {
    if (c.empty()) continue;
    const size_t at = text.find(c, from);
    if (at == std::string::npos) continue;
    plain.emplace_back(at, at + c.size());
    from = at + c.size();
  }
  for (auto& [begin, end] : plain) {  // a content cut by continue_final_message
    begin = std::min(begin, text.size());
    end = std::min(end, text.size());
  }
  ChatPrompt out;
  if (options.add_special_tokens && v.add_bos && v.bos_id) out.ids.push_back(*v.bos_id);
  const std::vector<int32_t> body = tokenizer.encode(text, plain);
  out.ids.insert(out.ids.end(), body.begin(), body.end());
  out.text = std::move(text);
  return out;
}

}  // namespace inferd
