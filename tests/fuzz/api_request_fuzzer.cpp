// libFuzzer target: the OpenAI request-body parsers (chat, completions, embeddings, classify, score,
// rerank, tokenize, detokenize), the Responses API body, the Triton / KServe generate translation
// and /v2 targets, and the reasoning splitter on arbitrary bytes.
#include <cstdint>
#include <string>

#include "engine/reasoning_splitter.h"
#include "server/openai_api.h"
#include "server/responses_api.h"
#include "server/triton_api.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string body(reinterpret_cast<const char*>(data), size);
  (void)inferd::parse_generate_request(inferd::ApiEndpoint::kChat, body);
  (void)inferd::parse_generate_request(inferd::ApiEndpoint::kCompletion, body);
  (void)inferd::parse_tokenize_request(body);
  (void)inferd::parse_embedding_request(body);
  (void)inferd::parse_embedding_request(body, /*classify=*/true);
  (void)inferd::parse_score_request(size % 2 == 0, body);
  (void)inferd::base64_encode(body);
  (void)inferd::parse_detokenize_request(body);
  (void)inferd::parse_responses_request(body, [](const std::string& id) -> std::optional<nlohmann::json> {
    if (id.empty()) return std::nullopt;
    return nlohmann::json::array({{{"role", "user"}, {"content", id}}});
  });
  std::string id;
  if (auto c = inferd::triton_to_completion(body, "m", size % 2 == 1, &id))
    (void)inferd::parse_generate_request(inferd::ApiEndpoint::kCompletion, c->dump());
  (void)inferd::parse_triton_target(body);
  inferd::ReasoningSplitter splitter(size % 2 == 0);
  (void)splitter.feed(body.substr(0, size / 2));
  (void)splitter.feed(body.substr(size / 2));
  (void)splitter.finish();
  return 0;
}
