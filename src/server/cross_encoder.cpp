#include "server/cross_encoder.h"

#include <algorithm>
#include <ctime>
#include <nlohmann/json.hpp>

namespace inferd {

using json = nlohmann::json;

std::string fill_rerank_template(const std::string& tmpl, const std::string& query,
                                 const std::string& document) {
  static const std::string kQuery = "{query}", kDocument = "{document}";
  std::string out;
  size_t at = 0;
  while (at < tmpl.size()) {
    if (tmpl.compare(at, kQuery.size(), kQuery) == 0) {
      out += query;
      at += kQuery.size();
    } else if (tmpl.compare(at, kDocument.size(), kDocument) == 0) {
      out += document;
      at += kDocument.size();
    } else {
      out += tmpl[at++];
    }
  }
  return out;
}

std::optional<ApiError> make_pair_prompts(const CrossEncoder& encoder, ScoreRequest* request) {
  GenerationRequest& g = request->embedding.generation;
  const char* field = request->rerank ? "documents" : "text_2";
  if (encoder.tokenizer == nullptr)
    return ApiError{400, "the model has no tokenizer: a query-document pair needs one",
                    "invalid_request_error", field, ""};
  const size_t queries = request->num_queries;
  if (queries == 0 || g.prompts.size() <= queries)
    return ApiError{400, "give a query and at least one document", "invalid_request_error", field, ""};
  const size_t documents = g.prompts.size() - queries;
  const bool special = g.add_special_tokens.value_or(true);
  const Vocab& v = encoder.tokenizer->vocab();
  std::optional<int64_t> keep;
  if (g.truncate_prompt_tokens)
    keep = *g.truncate_prompt_tokens == -1 ? encoder.max_model_len : *g.truncate_prompt_tokens;
  if (keep && !encoder.rerank_template.empty())
    return ApiError{400,
                    "'truncate_prompt_tokens' is not supported with the model's rerank template (the "
                    "template's own tokens would be cut)",
                    "invalid_request_error", "truncate_prompt_tokens", ""};
  std::vector<PromptInput> pairs;
  for (size_t d = 0; d < documents; ++d) {
    const std::string& query = g.prompts[queries == 1 ? 0 : d].text;
    const std::string& document = g.prompts[queries + d].text;
    PromptInput p;
    p.is_ids = true;
    if (!encoder.rerank_template.empty()) {
      p.ids = encoder.tokenizer->encode(fill_rerank_template(encoder.rerank_template, query, document), true);
    } else {
      std::vector<int32_t> q = encoder.tokenizer->encode(query, true);
      std::vector<int32_t> t = encoder.tokenizer->encode(document, true);
      const bool bos = special && v.add_bos && v.bos_id;
      const bool append = special && v.append_id.has_value();
      const int64_t fixed = (bos ? 1 : 0) + (append ? 2 : 0);
      if (keep) {
        if (*keep <= fixed)
          return ApiError{400,
                          "'truncate_prompt_tokens' " + std::to_string(*keep) +
                              " leaves no room for the texts of a pair (it has " + std::to_string(fixed) +
                              " special tokens)",
                          "invalid_request_error", "truncate_prompt_tokens", ""};
        // Hugging Face's longest_first: one token off the end of the longer text at a time (the
        // document when they are as long).
        while (static_cast<int64_t>(q.size() + t.size()) + fixed > *keep) {
          if (q.size() > t.size())
            q.pop_back();
          else
            t.pop_back();
        }
      }
      if (bos) p.ids.push_back(*v.bos_id);
      p.ids.insert(p.ids.end(), q.begin(), q.end());
      if (append) p.ids.push_back(*v.append_id);
      p.ids.insert(p.ids.end(), t.begin(), t.end());
      if (append) p.ids.push_back(*v.append_id);
    }
    pairs.push_back(std::move(p));
  }
  g.prompts = std::move(pairs);
  g.truncate_prompt_tokens.reset();  // done here, pair-wise
  return std::nullopt;
}

std::vector<double> head_scores(const ClassifierHead& head, const std::vector<std::vector<float>>& logits,
                                bool activation) {
  std::vector<double> out;
  out.reserve(logits.size());
  for (const std::vector<float>& l : logits) out.push_back(head.score(l, activation).value_or(0.0f));
  return out;
}

std::string classify_body(const std::string& id, const std::string& model, const ClassifierHead& head,
                          const std::vector<std::vector<float>>& logits, bool activation,
                          int64_t prompt_tokens) {
  json data = json::array();
  for (size_t i = 0; i < logits.size(); ++i) {
    const std::vector<float> probs = head.probabilities(logits[i]);
    const size_t best =
        static_cast<size_t>(std::max_element(logits[i].begin(), logits[i].end()) - logits[i].begin());
    data.push_back({{"index", i},
                    {"label", head.labels.at(std::min(best, head.labels.size() - 1))},
                    {"probs", activation ? probs : logits[i]},
                    {"num_classes", head.labels.size()}});
  }
  return json{{"id", id},
              {"object", "list"},
              {"created", static_cast<int64_t>(std::time(nullptr))},
              {"model", model},
              {"data", std::move(data)},
              {"usage",
               {{"prompt_tokens", prompt_tokens},
                {"total_tokens", prompt_tokens},
                {"completion_tokens", 0},
                {"prompt_tokens_details", nullptr}}}}
      .dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace inferd
