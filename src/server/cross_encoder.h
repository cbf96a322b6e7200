// Serving a classification model (model/classifier_head.h): /score and /rerank as a cross-encoder
// (each query-document pair is one prompt, read through the head), and /classify. The prompt of a
// pair, and the answers' bodies; no I/O, no engine (the HTTP layer calls these).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "model/classifier_head.h"
#include "server/openai_api.h"
#include "tokenizer/tokenizer.h"

namespace inferd {

// What a pair's prompt is made of.
struct CrossEncoder {
  const ClassifierHead* head = nullptr;
  const Tokenizer* tokenizer = nullptr;  // null: no text can be scored
  // A GGUF's `tokenizer.chat_template.rerank` (llama.cpp's): the pair's prompt is this text with
  // {query} and {document} replaced, tokenized with special tokens and nothing added. Empty: the
  // tokenizer's pair encoding: BOS (when the model adds one), the query, the appended token (when
  // the tokenizer appends one, e.g. Qwen3's <|endoftext|>), the document, the appended token; the
  // special tokens only with add_special_tokens (default true).
  std::string rerank_template;
  int64_t max_model_len = 0;  // truncate_prompt_tokens -1
};

// The template with every {query} and {document} replaced in one pass (a replacement's own text
// is not searched again).
std::string fill_rerank_template(const std::string& tmpl, const std::string& query,
                                 const std::string& document);

// Replaces `request`'s prompts (its texts: queries first, then documents) with one token-id prompt
// per pair (query 0 or query k against document k), and truncates each pair to
// truncate_prompt_tokens as Hugging Face's pair truncation does (longest first: a token off the
// end of the longer text until it fits); with a rerank template truncation is refused. The error
// names the field.
std::optional<ApiError> make_pair_prompts(const CrossEncoder& encoder, ScoreRequest* request);

// The logits' scores for /score and /rerank (ClassifierHead::score), one per pair.
std::vector<double> head_scores(const ClassifierHead& head, const std::vector<std::vector<float>>& logits,
                                bool activation);

// vLLM's /classify answer: {"id", "object": "list", "created", "model", "data": [{"index", "label",
// "probs", "num_classes"}], "usage"}; probs are the labels' probabilities (or, without activation,
// the raw logits) and label the most likely one's name.
std::string classify_body(const std::string& id, const std::string& model, const ClassifierHead& head,
                          const std::vector<std::vector<float>>& logits, bool activation,
                          int64_t prompt_tokens);

}  // namespace inferd
