// libFuzzer target: the OpenAI request-body parsers (chat, completions, tokenize, detokenize) and
// the reasoning splitter on arbitrary bytes.
#include <cstdint>
#include <string>

#include "engine/reasoning_splitter.h"
#include "server/openai_api.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string body(reinterpret_cast<const char*>(data), size);
  (void)inferd::parse_generate_request(inferd::ApiEndpoint::kChat, body);
  (void)inferd::parse_generate_request(inferd::ApiEndpoint::kCompletion, body);
  (void)inferd::parse_tokenize_request(body);
  (void)inferd::parse_detokenize_request(body);
  inferd::ReasoningSplitter splitter(size % 2 == 0);
  (void)splitter.feed(body.substr(0, size / 2));
  (void)splitter.feed(body.substr(size / 2));
  (void)splitter.finish();
  return 0;
}
