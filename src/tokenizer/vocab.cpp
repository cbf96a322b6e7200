#include "tokenizer/vocab.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tokenizer/pre_tokenizer.h"

namespace inferd {

namespace {

using nlohmann::json;

constexpr int64_t kTokenTypeControl = 3;
constexpr int64_t kTokenTypeUserDefined = 4;

// Tokens that end a turn in the families we serve, besides the declared EOS.
void add_stop_ids(Vocab* v) {
  if (v->eos_id) v->stop_ids.push_back(*v->eos_id);
  for (const auto& t : v->added_tokens) {
    if (t.content == "<|im_end|>" || t.content == "<|eot_id|>" || t.content == "<|eom_id|>" ||
        t.content == "<|endoftext|>") {
      if (std::find(v->stop_ids.begin(), v->stop_ids.end(), t.id) == v->stop_ids.end())
        v->stop_ids.push_back(t.id);
    }
  }
}

Status check_ids(const std::string& source, const Vocab& v) {
  const auto n = static_cast<int64_t>(v.tokens.size());
  for (auto id : {v.bos_id, v.eos_id, v.pad_id}) {
    if (id && (*id < 0 || *id >= n))
      return corrupt_file(source + ": special token id " + std::to_string(*id) +
                          " is outside the vocabulary");
  }
  for (const auto& t : v.added_tokens) {
    if (t.id < 0 || t.id >= n)
      return corrupt_file(source + ": added token id " + std::to_string(t.id) + " is outside the vocabulary");
    if (t.content.empty())
      return corrupt_file(source + ": added token " + std::to_string(t.id) + " is empty");
  }
  return Status::ok();
}

}  // namespace

Expected<Vocab> vocab_from_gguf(const GgufFile& f) {
  const std::string& src = f.path();
  INFERD_ASSIGN_OR_RETURN(std::optional<std::string> model, f.get_string("tokenizer.ggml.model"));
  if (!model) return not_found(src + ": no tokenizer in the file (tokenizer.ggml.model missing)");
  if (*model != "gpt2")
    return unsupported(src + ": tokenizer model '" + *model +
                       "' is not supported (byte-level BPE 'gpt2' only)");
  const GgufValue* tokens = f.find("tokenizer.ggml.tokens");
  if (tokens == nullptr || tokens->type != GgufType::kArray || tokens->array_type != GgufType::kString) {
    return corrupt_file(src + ": tokenizer.ggml.tokens must be an array of strings");
  }
  Vocab v;
  v.tokens = tokens->array_strings;
  const GgufValue* merges = f.find("tokenizer.ggml.merges");
  if (merges == nullptr || merges->array_type != GgufType::kString) {
    return corrupt_file(src + ": tokenizer.ggml.merges must be an array of strings");
  }
  v.merges.reserve(merges->array_strings.size());
  for (const auto& m : merges->array_strings) {
    const size_t sp = m.find(' ', 1);
    if (sp == std::string::npos) return corrupt_file(src + ": merge '" + m + "' is not 'left right'");
    v.merges.emplace_back(m.substr(0, sp), m.substr(sp + 1));
  }
  if (const GgufValue* types = f.find("tokenizer.ggml.token_type")) {
    if (types->array_ints.size() != v.tokens.size())
      return corrupt_file(src + ": tokenizer.ggml.token_type length differs from tokens");
    for (size_t i = 0; i < v.tokens.size(); ++i) {
      const int64_t t = types->array_ints[i];
      if (t == kTokenTypeControl || t == kTokenTypeUserDefined) {
        v.added_tokens.push_back({static_cast<int32_t>(i), v.tokens[i], t == kTokenTypeControl});
      }
    }
  }
  INFERD_ASSIGN_OR_RETURN(std::optional<std::string> pre, f.get_string("tokenizer.ggml.pre"));
  INFERD_ASSIGN_OR_RETURN(v.pre_tokenizer_patterns,
                          PreTokenizer::patterns_for_gguf_pre(pre.value_or("default")));
  v.nfc = pre && (*pre == "qwen2" || *pre == "deepseek-r1-qwen");
  v.ignore_merges = pre && (*pre == "llama-bpe" || *pre == "llama3");
  auto id = [&](const char* key) -> Expected<std::optional<int32_t>> {
    INFERD_ASSIGN_OR_RETURN(std::optional<int64_t> x, f.get_int(key));
    if (!x) return std::optional<int32_t>();
    return std::optional<int32_t>(static_cast<int32_t>(*x));
  };
  INFERD_ASSIGN_OR_RETURN(v.bos_id, id("tokenizer.ggml.bos_token_id"));
  INFERD_ASSIGN_OR_RETURN(v.eos_id, id("tokenizer.ggml.eos_token_id"));
  INFERD_ASSIGN_OR_RETURN(v.pad_id, id("tokenizer.ggml.padding_token_id"));
  if (const GgufValue* add_bos = f.find("tokenizer.ggml.add_bos_token")) v.add_bos = add_bos->int_value != 0;
  if (const GgufValue* add_eos = f.find("tokenizer.ggml.add_eos_token");
      add_eos != nullptr && add_eos->int_value != 0)
    v.append_id = v.eos_id;
  INFERD_ASSIGN_OR_RETURN(std::optional<std::string> tmpl, f.get_string("tokenizer.chat_template"));
  v.chat_template = tmpl.value_or("");
  INFERD_RETURN_IF_ERROR(check_ids(src, v));
  add_stop_ids(&v);
  return v;
}

namespace {

Expected<json> read_json(const std::filesystem::path& p, bool required) {
  std::ifstream in(p);
  if (!in) {
    if (required) return not_found(p.string() + ": cannot open");
    return json();
  }
  std::stringstream ss;
  ss << in.rdbuf();
  json j = json::parse(ss.str(), nullptr, false);
  if (j.is_discarded()) return corrupt_file(p.string() + ": not valid JSON");
  return j;
}

// Pre-tokenizer patterns of a tokenizer.json "pre_tokenizer" node.
Status hf_pre_tokenizer(const std::string& src, const json& node, std::vector<std::string>* out) {
  if (node.is_null()) return Status::ok();
  const std::string type = node.value("type", "");
  if (type == "Sequence") {
    for (const auto& p : node.value("pretokenizers", json::array()))
      INFERD_RETURN_IF_ERROR(hf_pre_tokenizer(src, p, out));
    return Status::ok();
  }
  if (type == "ByteLevel") {
    if (node.value("add_prefix_space", false))
      return unsupported(src + ": ByteLevel add_prefix_space is not supported");
    if (node.value("use_regex", true)) out->push_back(kGpt2Pattern);
    return Status::ok();
  }
  if (type == "Digits") {
    out->push_back(node.value("individual_digits", false) ? R"(\p{N})" : R"(\p{N}+)");
    return Status::ok();
  }
  if (type == "Split") {
    const json& pattern = node.value("pattern", json::object());
    if (node.value("behavior", "") != "Isolated" || node.value("invert", false) ||
        !pattern.contains("Regex")) {
      return unsupported(src + ": only Split with an isolated Regex pattern is supported");
    }
    out->push_back(pattern["Regex"].get<std::string>());
    return Status::ok();
  }
  return unsupported(src + ": pre-tokenizer '" + type + "' is not supported");
}

std::string token_text(const json& j) {
  if (j.is_string()) return j.get<std::string>();
  if (j.is_object() && j.contains("content") && j["content"].is_string())
    return j["content"].get<std::string>();
  return "";
}

// The special token a TemplateProcessing post-processor puts after a single sequence
// ("single": [{"Sequence": {"id": "A"}}, {"SpecialToken": {"id": "<|endoftext|>"}}]), also inside a
// Sequence post-processor; none when it puts nothing there.
template <class FindId>
std::optional<int32_t> template_trailing_token(const json& p, const FindId& find_id) {
  if (!p.is_object()) return std::nullopt;
  if (p.value("type", "") == "Sequence" && p.contains("processors") && p["processors"].is_array()) {
    for (const json& inner : p["processors"]) {
      if (auto id = template_trailing_token(inner, find_id)) return id;
    }
    return std::nullopt;
  }
  if (p.value("type", "") != "TemplateProcessing" || !p.contains("single") || !p["single"].is_array() ||
      p["single"].size() < 2)
    return std::nullopt;
  const json& last = p["single"].back();
  if (!last.is_object() || !last.contains("SpecialToken") || !last["SpecialToken"].is_object())
    return std::nullopt;
  const json& id = last["SpecialToken"].value("id", json());
  return id.is_string() ? find_id(id.get<std::string>()) : std::nullopt;
}

Expected<Vocab> vocab_from_hf_dir_unchecked(const std::string& dir) {
  namespace fs = std::filesystem;
  const fs::path tok_path = fs::path(dir) / "tokenizer.json";
  const std::string src = tok_path.string();
  INFERD_ASSIGN_OR_RETURN(json tok, read_json(tok_path, true));
  INFERD_ASSIGN_OR_RETURN(json cfg, read_json(fs::path(dir) / "tokenizer_config.json", false));
  if (!tok.is_object() || !tok.contains("model") || !tok["model"].is_object())
    return corrupt_file(src + ": no 'model' object");
  const json& model = tok["model"];
  if (model.value("type", "") != "BPE")
    return unsupported(src + ": model type '" + model.value("type", "?") + "' is not supported (BPE only)");
  Vocab v;
  v.ignore_merges = model.value("ignore_merges", false);
  const json& vocab = model.value("vocab", json::object());
  if (!vocab.is_object() || vocab.empty())
    return corrupt_file(src + ": model.vocab must be a non-empty object");
  size_t max_id = 0;
  for (const auto& [text, id] : vocab.items()) {
    if (!id.is_number_unsigned() || id.get<uint64_t>() > (1u << 24))
      return corrupt_file(src + ": bad id of token '" + text + "'");
    max_id = std::max<size_t>(max_id, id.get<size_t>());
  }
  const json& added = tok.value("added_tokens", json::array());
  for (const auto& a : added) {
    if (a.contains("id") && a["id"].is_number_unsigned() && a["id"].get<uint64_t>() <= (1u << 24))
      max_id = std::max<size_t>(max_id, a["id"].get<size_t>());
  }
  v.tokens.resize(max_id + 1);
  for (const auto& [text, id] : vocab.items()) v.tokens[id.get<size_t>()] = text;
  for (const auto& m : model.value("merges", json::array())) {
    if (m.is_string()) {
      const std::string s = m.get<std::string>();
      const size_t sp = s.find(' ', 1);
      if (sp == std::string::npos) return corrupt_file(src + ": merge '" + s + "' is not 'left right'");
      v.merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      v.merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
    } else {
      return corrupt_file(src + ": a merge is neither 'a b' nor [a, b]");
    }
  }
  for (const auto& a : added) {
    if (!a.is_object() || !a.contains("id") || !a["id"].is_number_unsigned() || !a.contains("content") ||
        !a["content"].is_string()) {
      return corrupt_file(src + ": added_tokens entries need id and content");
    }
    AddedToken t{a["id"].get<int32_t>(), a["content"].get<std::string>(), a.value("special", false)};
    v.tokens[static_cast<size_t>(t.id)] = t.content;
    v.added_tokens.push_back(t);
  }
  const json& norm = tok.value("normalizer", json());
  if (norm.is_object()) {
    const std::string type = norm.value("type", "");
    if (type == "NFC") {
      v.nfc = true;
    } else {
      return unsupported(src + ": normalizer '" + type + "' is not supported");
    }
  }
  INFERD_RETURN_IF_ERROR(
      hf_pre_tokenizer(src, tok.value("pre_tokenizer", json()), &v.pre_tokenizer_patterns));
  auto find_id = [&](const std::string& text) -> std::optional<int32_t> {
    for (const auto& t : v.added_tokens) {
      if (t.content == text) return t.id;
    }
    auto it = vocab.find(text);
    if (it != vocab.end()) return it->get<int32_t>();
    return std::nullopt;
  };
  if (cfg.is_object()) {
    if (cfg.contains("bos_token")) v.bos_id = find_id(token_text(cfg["bos_token"]));
    if (cfg.contains("eos_token")) v.eos_id = find_id(token_text(cfg["eos_token"]));
    if (cfg.contains("pad_token")) v.pad_id = find_id(token_text(cfg["pad_token"]));
    v.add_bos = cfg.value("add_bos_token", false) && v.bos_id.has_value();
    if (cfg.value("add_eos_token", false)) v.append_id = v.eos_id;
    if (cfg.contains("chat_template")) {
      const json& ct = cfg["chat_template"];
      if (ct.is_string()) {
        v.chat_template = ct.get<std::string>();
      } else if (ct.is_array()) {
        for (const auto& e : ct) {
          if (e.value("name", "") == "default" && e.contains("template"))
            v.chat_template = e["template"].get<std::string>();
        }
      }
    }
  }
  if (!v.append_id) v.append_id = template_trailing_token(tok.value("post_processor", json()), find_id);
  INFERD_RETURN_IF_ERROR(check_ids(src, v));
  add_stop_ids(&v);
  return v;
}

}  // namespace

Expected<Vocab> vocab_from_hf_dir(const std::string& dir) {
  try {
    return vocab_from_hf_dir_unchecked(dir);
  } catch (const nlohmann::json::exception& e) {
    return corrupt_file(dir + "/tokenizer.json: unexpected structure: " + e.what());
  }
}

}  // namespace inferd
