#include "server/cross_encoder.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "test_support.h"
#include "tokenizer/tokenizer_loader.h"

namespace inferd {
namespace {

std::unique_ptr<Tokenizer> tokenizer(bool append_eos) {
  auto vocab = vocab_from_hf_dir(test::fixture_path("tokenizer/tiny_llama3_style"));
  EXPECT_TRUE(vocab.has_value()) << vocab.status().message();
  if (append_eos) vocab->append_id = vocab->eos_id;
  auto tok = Tokenizer::create(std::move(*vocab));
  EXPECT_TRUE(tok.has_value()) << tok.status().message();
  return std::move(*tok);
}

ScoreRequest rerank(const std::string& body) {
  ParsedScore p = parse_score_request(true, body);
  EXPECT_TRUE(p.request.has_value()) << p.error.message;
  return *p.request;
}

std::vector<int32_t> concat(std::initializer_list<std::vector<int32_t>> parts) {
  std::vector<int32_t> out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

TEST(CrossEncoderTest, RerankTemplateIsFilledInOnePass) {
  EXPECT_EQ(fill_rerank_template("<Q>{query}</Q><D>{document}</D>{query}", "q", "d"), "<Q>q</Q><D>d</D>q");
  // A text holding a placeholder is not substituted again.
  EXPECT_EQ(fill_rerank_template("{query}|{document}", "{document}", "{query}"), "{document}|{query}");
  EXPECT_EQ(fill_rerank_template("{quer}{", "x", "y"), "{quer}{");
}

// The tokenizer's pair encoding: BOS, query, appended token, document, appended token (the
// special tokens only with add_special_tokens), one prompt per document.
TEST(CrossEncoderTest, PairsAreTheTokenizersPairEncoding) {
  const auto plain = tokenizer(false);
  const ClassifierHead head;
  CrossEncoder enc{&head, plain.get(), "", 64};
  const int32_t bos = *plain->vocab().bos_id;
  const auto q = plain->encode("what is a fox", true);
  const auto d0 = plain->encode("a fox is an animal", true);
  const auto d1 = plain->encode("the sky", true);
  ScoreRequest r = rerank(R"({"query": "what is a fox", "documents": ["a fox is an animal", "the sky"]})");
  ASSERT_FALSE(make_pair_prompts(enc, &r).has_value());
  const auto& prompts = r.embedding.generation.prompts;
  ASSERT_EQ(prompts.size(), 2u);
  EXPECT_TRUE(prompts[0].is_ids);
  EXPECT_EQ(prompts[0].ids, concat({{bos}, q, d0}));
  EXPECT_EQ(prompts[1].ids, concat({{bos}, q, d1}));
  EXPECT_EQ(r.documents.size(), 2u);  // kept for return_documents

  ParsedScore bare = parse_score_request(
      false, R"({"text_1": "what is a fox", "text_2": "the sky", "add_special_tokens": false})");
  ASSERT_TRUE(bare.request.has_value()) << bare.error.message;
  ASSERT_FALSE(make_pair_prompts(enc, &*bare.request).has_value());
  EXPECT_EQ(bare.request->embedding.generation.prompts[0].ids, concat({q, d1}));

  const auto appending = tokenizer(true);
  const int32_t eos = *appending->vocab().eos_id;
  CrossEncoder with_eos{&head, appending.get(), "", 64};
  ScoreRequest e = rerank(R"({"query": "what is a fox", "documents": ["the sky"]})");
  ASSERT_FALSE(make_pair_prompts(with_eos, &e).has_value());
  EXPECT_EQ(e.embedding.generation.prompts[0].ids, concat({{bos}, q, {eos}, d1, {eos}}));

  // /score pair by pair: query k against document k.
  ParsedScore s = parse_score_request(
      false, R"({"text_1": ["what is a fox", "the sky"], "text_2": ["the sky", "a fox is an animal"]})");
  ASSERT_TRUE(s.request.has_value());
  ASSERT_FALSE(make_pair_prompts(enc, &*s.request).has_value());
  const auto sky = plain->encode("the sky", true);
  EXPECT_EQ(s.request->embedding.generation.prompts[0].ids, concat({{bos}, q, sky}));
  EXPECT_EQ(s.request->embedding.generation.prompts[1].ids, concat({{bos}, sky, d0}));
}

// truncate_prompt_tokens cuts the longer text first, from its end, as Hugging Face's
// longest_first; the special tokens stay.
TEST(CrossEncoderTest, TruncationCutsTheLongerTextFirst) {
  const auto tok = tokenizer(false);
  const ClassifierHead head;
  CrossEncoder enc{&head, tok.get(), "", 64};
  const int32_t bos = *tok->vocab().bos_id;
  const std::string longq = "the quick brown fox jumps over the lazy dog again and again";
  const auto q = tok->encode(longq, true);
  const auto d = tok->encode("a dog", true);
  ASSERT_GT(q.size(), d.size() + 4);
  const int64_t keep = 1 + static_cast<int64_t>(d.size()) + 4;
  ScoreRequest r =
      rerank(R"({"query": ")" + longq + R"(", "documents": ["a dog"], "truncate_prompt_tokens": )" +
             std::to_string(keep) + "}");
  ASSERT_FALSE(make_pair_prompts(enc, &r).has_value());
  EXPECT_EQ(r.embedding.generation.prompts[0].ids,
            concat({{bos}, std::vector<int32_t>(q.begin(), q.begin() + 4), d}));
  EXPECT_FALSE(r.embedding.generation.truncate_prompt_tokens.has_value());  // done pair-wise
  // Both texts cut once they are as long: the document loses a token first.
  ScoreRequest both =
      rerank(R"({"query": ")" + longq + R"(", "documents": ["a dog"], "truncate_prompt_tokens": 3})");
  ASSERT_FALSE(make_pair_prompts(enc, &both).has_value());
  EXPECT_EQ(both.embedding.generation.prompts[0].ids, concat({{bos}, {q[0]}, {d[0]}}));
  // -1: the model's length.
  ScoreRequest whole = rerank(R"({"query": "a", "documents": ["b"], "truncate_prompt_tokens": -1})");
  ASSERT_FALSE(make_pair_prompts(enc, &whole).has_value());
  EXPECT_EQ(whole.embedding.generation.prompts[0].ids,
            concat({{bos}, tok->encode("a", true), tok->encode("b", true)}));
  // No room for any text.
  ScoreRequest none = rerank(R"({"query": "a", "documents": ["b"], "truncate_prompt_tokens": 1})");
  auto err = make_pair_prompts(enc, &none);
  ASSERT_TRUE(err.has_value());
  EXPECT_EQ(err->param, "truncate_prompt_tokens");
}

TEST(CrossEncoderTest, TheRerankTemplateMakesThePromptAndRefusesTruncation) {
  const auto tok = tokenizer(false);
  const ClassifierHead head;
  const std::string tmpl = "<|begin_of_text|>Query: {query}\nDocument: {document}\nRelevant:";
  CrossEncoder enc{&head, tok.get(), tmpl, 64};
  ScoreRequest r = rerank(R"({"query": "fox", "documents": ["a fox"]})");
  ASSERT_FALSE(make_pair_prompts(enc, &r).has_value());
  EXPECT_EQ(r.embedding.generation.prompts[0].ids,
            tok->encode("<|begin_of_text|>Query: fox\nDocument: a fox\nRelevant:", true));
  EXPECT_EQ(r.embedding.generation.prompts[0].ids[0], *tok->vocab().bos_id);  // specials parsed
  ScoreRequest cut = rerank(R"({"query": "fox", "documents": ["a fox"], "truncate_prompt_tokens": 5})");
  auto err = make_pair_prompts(enc, &cut);
  ASSERT_TRUE(err.has_value());
  EXPECT_EQ(err->param, "truncate_prompt_tokens");
  CrossEncoder no_tokenizer{&head, nullptr, "", 64};
  ScoreRequest any = rerank(R"({"query": "fox", "documents": ["a fox"]})");
  auto missing = make_pair_prompts(no_tokenizer, &any);
  ASSERT_TRUE(missing.has_value());
  EXPECT_EQ(missing->param, "documents");
}

TEST(CrossEncoderTest, ClassifyBodyAndScores) {
  ClassifierHead head;
  head.hidden_size = 1;
  head.labels = {"neg", "pos", "mixed"};
  const std::vector<std::vector<float>> logits = {{0.0f, 2.0f, 1.0f}, {3.0f, -1.0f, 0.0f}};
  const auto body = nlohmann::json::parse(classify_body("classify-1", "m", head, logits, true, 7));
  EXPECT_EQ(body["object"], "list");
  EXPECT_EQ(body["id"], "classify-1");
  ASSERT_EQ(body["data"].size(), 2u);
  EXPECT_EQ(body["data"][0]["label"], "pos");
  EXPECT_EQ(body["data"][1]["label"], "neg");
  EXPECT_EQ(body["data"][1]["index"], 1);
  EXPECT_EQ(body["data"][0]["num_classes"], 3);
  double sum = 0;
  for (const auto& p : body["data"][0]["probs"]) sum += p.get<double>();
  EXPECT_NEAR(sum, 1.0, 1e-6);
  EXPECT_NEAR(body["data"][0]["probs"][1].get<double>(), std::exp(2.0) / (1 + std::exp(2.0) + std::exp(1.0)),
              1e-6);
  EXPECT_EQ(body["usage"]["prompt_tokens"], 7);
  EXPECT_EQ(body["usage"]["completion_tokens"], 0);
  const auto raw = nlohmann::json::parse(classify_body("classify-2", "m", head, logits, false, 7));
  EXPECT_EQ(raw["data"][1]["probs"][0].get<double>(), 3.0);

  head.labels = {"yes"};
  head.score_rule = ClassifierHead::ScoreRule::kSigmoid;
  const std::vector<double> s = head_scores(head, {{0.0f}, {2.0f}}, true);
  EXPECT_NEAR(s[0], 0.5, 1e-7);
  EXPECT_NEAR(s[1], 1 / (1 + std::exp(-2.0)), 1e-6);
  EXPECT_EQ(head_scores(head, {{2.0f}}, false)[0], 2.0);
}

}  // namespace
}  // namespace inferd
