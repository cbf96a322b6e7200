#include "tokenizer/chat_encoder.h"

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
  ChatPrompt out;
  out.ids = tokenizer.encode(text, plain);
  out.text = std::move(text);
  return out;
}

}  // namespace inferd
