// Structured output end to end in the engine on the default model: under each schema of the
// grammar corpus, greedy and sampled, every answer that ends parses and validates; tool calls
// forced by tool_choice "required" are valid calls.
#include <gtest/gtest.h>

#include <map>
#include <optional>

#include "engine/engine.h"
#include "engine/input_processor.h"
#include "engine/tool_call_parser.h"
#include "grammar/json_schema_validator.h"
#include "grammar/schema_corpus.h"
#include "model/default_model.h"
#include "model/model_loader.h"
#include "model/transformer.h"
#include "test_support.h"
#include "tokenizer/tokenizer_loader.h"

namespace inferd {
namespace {

using Json = nlohmann::ordered_json;

struct DefaultModel {
  std::unique_ptr<ModelWeights> weights;
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<ChatTemplate> chat_template;
};

std::optional<DefaultModel> load_default() {
  auto path = default_model_path();
  if (!path) return std::nullopt;
  auto w = load_model(*path);
  if (!w) return std::nullopt;
  DefaultModel m;
  m.weights = std::move(*w);
  auto tok = load_tokenizer(m.weights->gguf.get(), m.weights->source_path, m.weights->config.vocab_size);
  if (!tok) return std::nullopt;
  m.tokenizer = std::move(*tok);
  auto tmpl = load_chat_template(m.weights->source_path, *m.tokenizer);
  if (!tmpl || !*tmpl) return std::nullopt;
  m.chat_template = std::move(*tmpl);
  return m;
}

// The default model, a Transformer on two threads and an InputProcessor over them (m empty when
// the model is not installed).
struct Rig {
  std::optional<DefaultModel> m = load_default();
  ThreadPool pool{2};
  std::optional<Transformer> model;
  std::optional<InputProcessor> inputs;
  Rig() {
    if (!m) return;
    model.emplace(*m->weights, pool);
    inputs.emplace(m->tokenizer.get(), m->chat_template.get(),
                   InputLimits{2048, static_cast<int32_t>(m->weights->config.vocab_size), 4});
  }
};

struct Answer {
  std::vector<int32_t> tokens;
  FinishReason finish = FinishReason::kError;
};

// Runs every request together in one engine; the answers in order.
std::vector<Answer> run_all(Transformer& model, std::vector<RequestSpec> specs) {
  EngineOptions o;
  o.num_kv_blocks = 2048;
  o.scheduler.max_num_seqs = 64;
  Engine engine(model, o);
  std::map<RequestId, size_t> index;
  for (size_t i = 0; i < specs.size(); ++i) index[engine.add(std::move(specs[i]))] = i;
  std::vector<Answer> answers(index.size());
  while (engine.has_work()) {
    for (const StepOutput& s : engine.step()) {
      Answer& a = answers[index.at(s.id)];
      a.tokens.insert(a.tokens.end(), s.new_tokens.begin(), s.new_tokens.end());
      EXPECT_TRUE(s.error.empty()) << s.error;
      if (s.finished) a.finish = *s.finish_reason;
    }
  }
  return answers;
}

TEST(StructuredOutputTest, EveryAnswerUnderEverySchemaValidates) {
  Rig rig;
  INFERD_REQUIRE_OR_SKIP(rig.m.has_value(), "default model not installed");
  Transformer& model = *rig.model;
  const InputProcessor& inputs = *rig.inputs;
  const auto& corpus = test::schema_corpus();
  ASSERT_GE(corpus.size(), 30u);
  // Under the sanitizers a quarter of the corpus (every 4th schema, both temperatures); the Release
  // pass answers all of it.
  const size_t stride = test::kSanitizerBuild ? 4 : 1;
  std::vector<RequestSpec> specs;
  std::vector<size_t> schema_of;
  for (float temperature : {0.0f, 1.0f}) {
    for (size_t i = 0; i < corpus.size(); i += stride) {
      schema_of.push_back(i);
      GenerationRequest g;
      g.messages = Json::array({{{"role", "user"}, {"content", "Answer in JSON matching " + corpus[i]}}});
      g.sampling.temperature = temperature;
      g.sampling.seed = i;
      g.max_tokens = 256;
      g.structured_output = StructuredOutput{
          StructuredOutput::Kind::kJsonSchema, Json::parse(corpus[i]), "", {}, "response_format"};
      InputProcessed p = inputs.process(g);
      ASSERT_TRUE(p.input.has_value()) << corpus[i] << ": " << p.error.message;
      specs.push_back(std::move(p.input->requests[0]));
    }
  }
  const auto answers = run_all(model, std::move(specs));
  int64_t stopped = 0;
  for (size_t k = 0; k < answers.size(); ++k) {
    const std::string& schema = corpus[schema_of[k]];
    const std::string text = rig.m->tokenizer->decode(answers[k].tokens, /*skip_special=*/true);
    if (answers[k].finish == FinishReason::kLength) continue;  // cut off at max_tokens: not a whole answer
    ASSERT_EQ(answers[k].finish, FinishReason::kStop) << schema;
    ++stopped;
    const Json doc = Json::parse(text, nullptr, false);
    ASSERT_FALSE(doc.is_discarded()) << schema << "\ndoes not parse: " << text;
    const std::string why = test::JsonSchemaValidator(Json::parse(schema)).check(doc);
    EXPECT_TRUE(why.empty()) << schema << "\ninvalid (" << why << "): " << text;
  }
  std::printf("[ figures  ] %lld of %zu answers ended (the rest reached max_tokens 256); all of them valid\n",
              static_cast<long long>(stopped), answers.size());
  EXPECT_GE(stopped, static_cast<int64_t>(answers.size() * 3 / 4));
}

TEST(StructuredOutputTest, RequiredToolCallsAreValidCalls) {
  auto m = load_default();
  INFERD_REQUIRE_OR_SKIP(m.has_value(), "default model not installed");
  ThreadPool pool(2);
  Transformer model(*m->weights, pool);
  InputLimits limits{2048, static_cast<int32_t>(m->weights->config.vocab_size), 4};
  const Json tools = Json::parse(R"([
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
      "properties": {"city": {"type": "string", "maxLength": 30}, "days": {"type": "integer", "minimum": 1,
      "maximum": 7}}, "required": ["city", "days"], "additionalProperties": false}}},
    {"type": "function", "function": {"name": "ping"}}])");
  for (ToolCallFormat format : {ToolCallFormat::kHermes, ToolCallFormat::kLlama3Json}) {
    limits.tool_call_parser = format;
    const InputProcessor inputs(m->tokenizer.get(), m->chat_template.get(), limits);
    std::vector<RequestSpec> specs;
    for (int seed = 0; seed < 8; ++seed) {
      GenerationRequest g;
      g.messages = Json::array({{{"role", "user"}, {"content", "What is the weather in Oslo?"}}});
      g.sampling.temperature = seed == 0 ? 0.0f : 1.0f;
      g.sampling.seed = static_cast<uint64_t>(seed);
      g.max_tokens = 200;
      g.tools = tools;
      g.tool_choice = ToolChoice{ToolChoice::Kind::kRequired, ""};
      InputProcessed p = inputs.process(g);
      ASSERT_TRUE(p.input.has_value()) << p.error.message;
      specs.push_back(std::move(p.input->requests[0]));
    }
    for (const Answer& a : run_all(model, std::move(specs))) {
      if (a.finish == FinishReason::kLength) continue;
      ToolCallParser parser(format, 128);
      const std::string text = m->tokenizer->decode(a.tokens, /*skip_special=*/true);
      auto parts = parser.feed(text);
      auto rest = parser.finish();
      EXPECT_EQ(parts.content + rest.content, "") << text;
      ASSERT_FALSE(parser.calls().empty()) << text;
      for (const ToolCall& c : parser.calls()) {
        const Json args = Json::parse(c.arguments);
        if (c.name == "get_weather") {
          EXPECT_TRUE(args["city"].is_string() && args["days"].is_number_integer()) << text;
          EXPECT_EQ(args.size(), 2u) << text;
        } else {
          EXPECT_EQ(c.name, "ping") << text;
        }
      }
    }
  }
}

// A grammar that doubles its live parses with every byte (each "a" may close with "c" or "d")
// fails its own request with the matcher's error once past StackStore's bound; a request beside
// it in the same batches completes.
TEST(StructuredOutputTest, AGrammarTooAmbiguousFailsOnlyItsRequest) {
  Rig rig;
  INFERD_REQUIRE_OR_SKIP(rig.m.has_value(), "default model not installed");
  Transformer& model = *rig.model;
  const InputProcessor& inputs = *rig.inputs;
  std::vector<RequestSpec> specs;
  for (bool constrained : {true, false}) {
    GenerationRequest g;
    g.messages = Json::array({{{"role", "user"}, {"content", "Write the letter a many times."}}});
    g.sampling.temperature = 0.0f;
    g.max_tokens = 40;
    if (constrained) {
      g.structured_output = StructuredOutput{StructuredOutput::Kind::kGrammar,
                                             nullptr,
                                             "root ::= \"a\" root \"c\" | \"a\" root \"d\"\n",
                                             {},
                                             "guided_grammar"};
    }
    InputProcessed p = inputs.process(g);
    ASSERT_TRUE(p.input.has_value()) << p.error.message;
    specs.push_back(std::move(p.input->requests[0]));
  }
  EngineOptions o;
  o.num_kv_blocks = 256;
  Engine engine(model, o);
  const RequestId ambiguous = engine.add(std::move(specs[0]));
  const RequestId plain = engine.add(std::move(specs[1]));
  std::map<RequestId, std::string> errors;
  std::map<RequestId, FinishReason> finish;
  std::map<RequestId, size_t> tokens;
  while (engine.has_work()) {
    for (const StepOutput& s : engine.step()) {
      tokens[s.id] += s.new_tokens.size();
      if (!s.error.empty()) errors[s.id] = s.error;
      if (s.finished) finish[s.id] = *s.finish_reason;
    }
  }
  ASSERT_EQ(finish.at(ambiguous), FinishReason::kError);
  EXPECT_NE(errors[ambiguous].find("the output grammar is too ambiguous"), std::string::npos)
      << errors[ambiguous];
  EXPECT_LT(tokens[ambiguous], 17u);  // "a" bytes: 2^14 parses and more are past the bound
  EXPECT_EQ(finish.at(plain), FinishReason::kLength);
  EXPECT_EQ(tokens[plain], 40u);
  EXPECT_TRUE(errors[plain].empty()) << errors[plain];
}

}  // namespace
}  // namespace inferd
