#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/pre_tokenizer.h"

#include <pcre2.h>

namespace inferd {

const char* const kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
const char* const kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* const kQwen2Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

struct PreTokenizer::Impl {
  struct Regex {
    pcre2_code* code = nullptr;
    pcre2_match_data* match = nullptr;
  };
  std::vector<Regex> regexes;
  mutable std::vector<std::string_view> scratch;

  ~Impl() {
    for (auto& r : regexes) {
      pcre2_match_data_free(r.match);
      pcre2_code_free(r.code);
    }
  }
};

PreTokenizer::PreTokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
PreTokenizer::PreTokenizer(PreTokenizer&&) noexcept = default;
PreTokenizer& PreTokenizer::operator=(PreTokenizer&&) noexcept = default;
PreTokenizer::~PreTokenizer() = default;

Expected<PreTokenizer> PreTokenizer::create(const std::vector<std::string>& patterns) {
  auto impl = std::make_unique<Impl>();
  for (const auto& p : patterns) {
    int err = 0;
    PCRE2_SIZE offset = 0;
    pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(p.data()), p.size(), PCRE2_UTF | PCRE2_UCP,
                                     &err, &offset, nullptr);
    if (code == nullptr) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof msg);
      return invalid_argument("pre-tokenizer pattern '" + p + "' at offset " + std::to_string(offset) + ": " +
                              reinterpret_cast<const char*>(msg));
    }
    pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // falls back to the interpreter if JIT is absent
    impl->regexes.push_back({code, pcre2_match_data_create_from_pattern(code, nullptr)});
  }
  return PreTokenizer(std::move(impl));
}

Expected<std::vector<std::string>> PreTokenizer::patterns_for_gguf_pre(const std::string& pre) {
  if (pre == "default" || pre == "gpt-2" || pre == "gpt2") return std::vector<std::string>{kGpt2Pattern};
  if (pre == "smollm") return std::vector<std::string>{R"(\p{N})", kGpt2Pattern};
  if (pre == "qwen2" || pre == "deepseek-r1-qwen") return std::vector<std::string>{kQwen2Pattern};
  if (pre == "llama3" || pre == "llama-bpe") return std::vector<std::string>{kLlama3Pattern};
  return unsupported("tokenizer pre-tokenizer '" + pre +
                     "' is not supported (smollm, qwen2, llama-bpe, gpt-2)");
}

void PreTokenizer::split(std::string_view text, std::vector<std::string_view>* pieces) const {
  std::vector<std::string_view>& current = impl_->scratch;
  current.assign(1, text);
  std::vector<std::string_view> next;
  for (size_t r = 0; r < impl_->regexes.size(); ++r) {
    const Impl::Regex& re = impl_->regexes[r];
    next.clear();
    for (std::string_view piece : current) {
      size_t pos = 0;
      size_t last_end = 0;
      while (pos < piece.size()) {
        const int rc = pcre2_match(re.code, reinterpret_cast<PCRE2_SPTR>(piece.data()), piece.size(), pos,
                                   PCRE2_NO_UTF_CHECK, re.match, nullptr);
        if (rc < 0) break;
        const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(re.match);
        const size_t begin = ov[0], end = ov[1];
        if (end == begin) {  // empty match: step over one character, keep it in the gap
          pos = begin + 1;
          while (pos < piece.size() && (static_cast<unsigned char>(piece[pos]) & 0xC0) == 0x80) ++pos;
          continue;
        }
        if (begin > last_end) next.push_back(piece.substr(last_end, begin - last_end));
        next.push_back(piece.substr(begin, end - begin));
        pos = last_end = end;
      }
      if (last_end < piece.size()) next.push_back(piece.substr(last_end));
    }
    current.swap(next);
  }
  pieces->insert(pieces->end(), current.begin(), current.end());
}

}  // namespace inferd
