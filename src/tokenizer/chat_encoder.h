// Chat prompts: render a conversation with the model's chat template and tokenize it so that
// only the template's own markers become special tokens — text inside message contents that
// merely looks like "<|im_start|>" is encoded as plain text. Used by `inferd run --chat`,
// `inferd generate` (messages) and the server.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "jinja/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace inferd {

struct ChatOptions {
  bool add_generation_prompt = true;
  // The prompt ends inside the last message, so the model continues it (a prefilled assistant
  // turn): the conversation is rendered without a generation prompt and cut right after the last
  // message's content (as transformers' apply_chat_template does). Excludes add_generation_prompt.
  bool continue_final_message = false;
  // The model's BOS in front of the rendered text when its tokenizer asks for one (vLLM's
  // add_special_tokens; templates usually write the BOS themselves, so off by default).
  bool add_special_tokens = false;
  nlohmann::ordered_json tools;  // null, or the OpenAI-style tool list
  // Extra variables for the template (a request's chat_template_kwargs, e.g. Qwen3's
  // {"enable_thinking": false}): null or an object; they may override add_generation_prompt,
  // never "messages".
  nlohmann::ordered_json template_kwargs;
};

// A request's chat options with vLLM's defaults for what it left out: a generation prompt unless
// it continues the final message, no BOS of the tokenizer's (the template writes it).
ChatOptions chat_options_for(std::optional<bool> add_generation_prompt, bool continue_final_message,
                             std::optional<bool> add_special_tokens, nlohmann::ordered_json template_kwargs);

struct ChatPrompt {
  std::string text;  // the rendered prompt
  std::vector<int32_t> ids;
};

// `messages`: an array of {"role", "content" (string or list of {"type": "text", "text"}), ...}.
// Contents are made well-formed UTF-8 and list contents joined. Errors: messages not an array,
// a message without role, a template that fails to render (its message says where).
Expected<ChatPrompt> encode_chat(const Tokenizer& tokenizer, const ChatTemplate& chat_template,
                                 const nlohmann::ordered_json& messages, const ChatOptions& options);

}  // namespace inferd
