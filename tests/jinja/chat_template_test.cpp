#include "jinja/chat_template.h"

#include <gtest/gtest.h>

#include <ctime>
#include <nlohmann/json.hpp>
#include <thread>

#include "test_support.h"

namespace inferd {
namespace {

using Json = nlohmann::ordered_json;

std::string render(const std::string& source, const Json& context = Json::object()) {
  auto tpl = ChatTemplate::compile(source);
  if (!tpl.has_value()) {
    ADD_FAILURE() << "compile: " << tpl.status().message();
    return "<compile error>";
  }
  auto out = tpl->render(context);
  if (!out.has_value()) {
    ADD_FAILURE() << "render: " << out.status().message();
    return "<render error>";
  }
  return *out;
}

// The error of compiling, or else of rendering, `source`.
Status failure(const std::string& source, const Json& context = Json::object(),
               const ChatTemplateLimits& limits = {}) {
  auto tpl = ChatTemplate::compile(source, limits);
  if (!tpl.has_value()) return tpl.status();
  auto out = tpl->render(context);
  return out.has_value() ? Status::ok() : out.status();
}

Status compile_error(const std::string& source) {
  auto tpl = ChatTemplate::compile(source);
  return tpl.has_value() ? Status::ok() : tpl.status();
}

// ---------------------------------------------------------------------------------------------
// Real templates against transformers' own rendering (scripts/fixtures/make_chat_template_cases.py).

TEST(ChatTemplateFixtures, EveryCaseRendersLikeTransformers) {
  const std::string dir = test::fixture_path("chat_templates/");
  const Json cases = Json::parse(test::read_text(dir + "cases.json"));
  ASSERT_GE(cases.size(), 40u);
  size_t num_errors = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const Json& c = cases[i];
    const std::string name = c["template"].get<std::string>();
    SCOPED_TRACE("case " + std::to_string(i) + " (" + name + ")");
    auto tpl = ChatTemplate::compile(test::read_text(dir + name));
    ASSERT_TRUE(tpl.has_value()) << tpl.status().message();
    auto out = tpl->render(c["context"]);
    if (c.contains("error")) {
      ++num_errors;
      ASSERT_FALSE(out.has_value());
      EXPECT_NE(out.status().message().find(c["error"].get<std::string>()), std::string::npos)
          << out.status().message();
      continue;
    }
    ASSERT_TRUE(out.has_value()) << out.status().message();
    const std::string expected = c["expected"].get<std::string>();
    if (*out != expected) {
      size_t at = 0;
      while (at < out->size() && at < expected.size() && (*out)[at] == expected[at]) ++at;
      ADD_FAILURE() << "first difference at byte " << at << "\n--- rendered:\n"
                    << *out << "\n--- expected:\n"
                    << expected;
    }
  }
  EXPECT_LT(num_errors, cases.size() / 4);
}

TEST(ChatTemplateFixtures, EveryTemplateCompiles) {
  for (const char* name : {"smollm2-135m-instruct.jinja", "qwen2.5-instruct.jinja", "qwq-32b.jinja",
                           "qwen3.jinja", "llama-3.1-instruct.jinja", "llama-3.2-instruct.jinja"}) {
    auto tpl =
        ChatTemplate::compile(test::read_text(test::fixture_path(std::string("chat_templates/") + name)));
    EXPECT_TRUE(tpl.has_value()) << name << ": " << tpl.status().message();
  }
}

// mentions(): the names of tags and expressions, not text or string literals. The server
// refuses a request variable (documents, reasoning_effort) its template never mentions.
TEST(ChatTemplateFixtures, MentionsTheNamesItsExpressionsUse) {
  auto tpl = ChatTemplate::compile(
      "documents {{ 'reasoning_effort' }}{% for d in documents %}{{ d.title }}{% endfor %}"
      "{% if enable_thinking is defined %}x{% endif %}");
  ASSERT_TRUE(tpl.has_value());
  for (const char* name : {"documents", "d", "title", "enable_thinking", "defined"})
    EXPECT_TRUE(tpl->mentions(name)) << name;
  for (const char* name : {"reasoning_effort", "x", "tools", ""}) EXPECT_FALSE(tpl->mentions(name)) << name;
  auto qwen3 = ChatTemplate::compile(test::read_text(test::fixture_path("chat_templates/qwen3.jinja")));
  ASSERT_TRUE(qwen3.has_value());
  EXPECT_TRUE(qwen3->mentions("enable_thinking"));
  EXPECT_TRUE(qwen3->mentions("tools"));
  EXPECT_FALSE(qwen3->mentions("documents"));
  EXPECT_FALSE(qwen3->mentions("reasoning_effort"));
}

TEST(ChatTemplateFixtures, RendersConcurrentlyFromOneCompiledTemplate) {
  auto tpl = ChatTemplate::compile(test::read_text(test::fixture_path("chat_templates/qwen3.jinja")));
  ASSERT_TRUE(tpl.has_value());
  const Json context = {{"messages", {{{"role", "user"}, {"content", "hi"}}}},
                        {"add_generation_prompt", true}};
  const std::string expected = *tpl->render(context);
  std::vector<std::thread> threads;
  std::vector<int> ok(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 50; ++i) ok[t] += tpl->render(context).value() == expected ? 1 : 0;
    });
  }
  for (auto& th : threads) th.join();
  for (int n : ok) EXPECT_EQ(n, 50);
}

// ---------------------------------------------------------------------------------------------
// Expressions.

TEST(ChatTemplateExpressions, ArithmeticFollowsPython) {
  EXPECT_EQ(
      render("{{ 1 + 2 * 3 - 4 / 2 }}|{{ 7 // 2 }}|{{ -7 // 2 }}|{{ -7 % 3 }}|{{ 10 % -3 }}|{{ 2 ** 10 }}"),
      "5.0|3|-4|2|-2|1024");
  EXPECT_EQ(render("{{ 10 / 4 }}|{{ 4 / 2 }}|{{ 10.0 // 4 }}|{{ -7.5 % 2 }}|{{ 2 ** -1 }}|{{ 2 ** 3 ** 2 }}"),
            "2.5|2.0|2.0|0.5|0.5|64");
  EXPECT_EQ(render("{{ true + 1 }}|{{ 1 == 1.0 }}|{{ true == 1 }}|{{ -(3) }}|{{ -3|abs }}"),
            "2|True|True|-3|3");
  EXPECT_EQ(render("{{ 'ab' * 3 }}|{{ 2 * 'x' }}|{{ [1] * 2 }}|{{ [1] + [2] }}|{{ 'a' ~ 1 ~ none ~ true }}"),
            "ababab|xx|[1, 1]|[1, 2]|a1NoneTrue");
}

TEST(ChatTemplateExpressions, NumbersPrintLikePython) {
  EXPECT_EQ(
      render(
          "{{ 0.1 + 0.2 }} {{ 1e-5 }} {{ 0.0001 }} {{ 1e16 }} {{ 1e15 }} {{ 1.0 }} {{ -0.0 }} {{ 2.5e-3 }}"),
      "0.30000000000000004 1e-05 0.0001 1e+16 1000000000000000.0 1.0 -0.0 0.0025");
  EXPECT_EQ(render("{{ 123456789012345678.0 }} {{ 5e-324 }} {{ 1.7976931348623157e308 }}"),
            "1.2345678901234568e+17 5e-324 1.7976931348623157e+308");
}

TEST(ChatTemplateExpressions, ValuesPrintLikePython) {
  EXPECT_EQ(
      render(
          "{{ none }}|{{ true }}|{{ [1, 'a', none, 1.5] }}|{{ {'a': 1, 'b': 'x'} }}|{{ (1,) }}|{{ (1, 2) }}"),
      "None|True|[1, 'a', None, 1.5]|{'a': 1, 'b': 'x'}|(1,)|(1, 2)");
  EXPECT_EQ(render(R"({{ ["it's", 'a"b', 'x\ny', "both'\"", '\t\\'] }})"),
            R"(["it's", 'a"b', 'x\ny', 'both\'"', '\t\\'])");
  EXPECT_EQ(render("{{ x }}", {{"x", {{"b", 1}, {"a", nullptr}}}}), "{'b': 1, 'a': None}");
}

TEST(ChatTemplateExpressions, ComparisonsMembershipAndLogic) {
  EXPECT_EQ(render("{{ 1 < 2 < 3 }}{{ 3 > 2 > 2 }}{{ 'ab' < 'b' }}{{ [1, 2] < [1, 3] }}{{ 1 != 2 }}"),
            "TrueFalseTrueTrueTrue");
  EXPECT_EQ(
      render("{{ 'a' in 'cab' }}{{ 1 in [1, 2] }}{{ 'a' in {'a': 1} }}{{ 'a' not in ['b'] }}{{ 'x' in y }}"),
      "TrueTrueTrueTrueFalse");
  EXPECT_EQ(render("{{ true and 'x' }}|{{ false or 'y' }}|{{ 0 or none }}|{{ not 'a' }}|{{ not 1 == 2 }}"),
            "x|y|None|False|True");
  EXPECT_EQ(render("{{ 'a' if x else 'b' }}|{{ 'a' if 1 > 2 }}|{{ 'p' if false else 'q' if true else 'r' }}"),
            "b||q");
}

TEST(ChatTemplateExpressions, SubscriptsSlicesAndAttributes) {
  const Json ctx = {{"l", {1, 2, 3}}, {"s", "héllo"}, {"d", {{"a", {{"b", {10, 20}}}}}}, {"n", nullptr}};
  EXPECT_EQ(render("{{ l[-1] }}{{ l[1:] }}{{ l[::-1] }}{{ l[5] }}{{ l[:-5] }}{{ l[::2] }}", ctx),
            "3[2, 3][3, 2, 1][][1, 3]");
  EXPECT_EQ(render("{{ s[1] }}|{{ s[1:3] }}|{{ s[::-1] }}|{{ s|length }}", ctx), "é|él|olléh|5");
  EXPECT_EQ(render("{{ d.a.b[1] }}{{ d['a']['b'].0 }}{{ d.missing }}{{ n.x }}", ctx), "2010");
  EXPECT_EQ(render("{{ 'a,b,c'.split(',')[-1] }}|{{ '<t>x</t>y'.split('</t>')[0] }}"), "c|<t>x");
}

TEST(ChatTemplateExpressions, UndefinedBehavesLikeJinja) {
  EXPECT_EQ(
      render("[{{ x }}]{{ x is defined }}{{ x is undefined }}{{ x | length }}{{ x ~ 'a' }}{{ x == none }}"),
      "[]FalseTrue0aFalse");
  EXPECT_EQ(render("{% for i in x %}a{% else %}empty{% endfor %}{% if not x %}!{% endif %}"), "empty!");
  EXPECT_EQ(render("{{ x|default('d') }}{{ none|default('d') }}{{ ''|default('d', true) }}"), "dNoned");
  EXPECT_NE(failure("{{ x.y }}").message().find("'x' is undefined"), std::string::npos);
  EXPECT_NE(failure("{{ x + 1 }}").message().find("'x' is undefined"), std::string::npos);
  EXPECT_NE(failure("{{ d.a.b }}", {{"d", Json::object()}}).message().find("has no attribute 'a'"),
            std::string::npos);
  EXPECT_FALSE(failure("{{ x|tojson }}").is_ok());
  EXPECT_FALSE(failure("{{ x() }}").is_ok());
}

TEST(ChatTemplateExpressions, TypeErrorsAreErrorsNotCrashes) {
  EXPECT_FALSE(failure("{{ 'a' + 1 }}").is_ok());
  EXPECT_FALSE(failure("{{ 'a' < 1 }}").is_ok());
  EXPECT_FALSE(failure("{{ 1 / 0 }}").is_ok());
  EXPECT_FALSE(failure("{{ 1 // 0 }}").is_ok());
  EXPECT_FALSE(failure("{{ 1 in none }}").is_ok());
  EXPECT_FALSE(failure("{{ 9223372036854775807 + 1 }}").is_ok());
  EXPECT_FALSE(failure("{% for x in 5 %}{% endfor %}").is_ok());
  EXPECT_FALSE(failure("{{ -'a' }}").is_ok());
}

// ---------------------------------------------------------------------------------------------
// Filters, tests and methods.

TEST(ChatTemplateFilters, StringFilters) {
  EXPECT_EQ(render("{{ '  a b \n'|trim }}|{{ 'xxaxx'|trim('x') }}|{{ 'hello world'|capitalize }}|{{ 'hello "
                   "world'|title }}"),
            "a b|a|Hello world|Hello World");
  EXPECT_EQ(render("{{ 'Abc'|upper }}{{ 'Abc'|lower }}{{ 'héllo ß'|upper }}|{{ 'abc'|replace('b', 'x') }}{{ "
                   "'aaa'|replace('a', 'b', 2) }}"),
            "ABCabcHÉLLO SS|axcbba");
  EXPECT_EQ(render("{{ 3|string }}{{ none|string }}{{ [1]|string }}{{ 'x'|safe }}"), "3None[1]x");
  EXPECT_EQ(
      render("{{ 'a\nb'|indent(2) }}|{{ 'a\nb'|indent(2, true) }}|{{ 'a\n\nb'|indent(2, blank=true) }}"),
      "a\n  b|  a\n  b|a\n  \n  b");
}

TEST(ChatTemplateFilters, NumberFilters) {
  EXPECT_EQ(render("{{ '3'|int }}{{ 'x'|int }}{{ '3.5'|int }}{{ 3.7|int }}{{ ' 42 '|int }}{{ 'x'|int(7) }}"),
            "3033427");
  EXPECT_EQ(render("{{ '3.5'|float }} {{ 3|float }} {{ 'x'|float }} {{ 2.5|round }} {{ 2.567|round(2) }} {{ "
                   "2|round }}"),
            "3.5 3.0 0.0 2.0 2.57 2");
}

TEST(ChatTemplateFilters, ListFilters) {
  const Json ctx = {{"msgs",
                     {{{"role", "user"}, {"content", "a"}},
                      {{"role", "assistant"}, {"content", "b"}, {"tool_calls", {{{"name", "f"}}}}},
                      {{"role", "user"}, {"content", "c"}}}}};
  EXPECT_EQ(render("{{ msgs|length }}{{ msgs|first|attr('content') }}{{ (msgs|last).content }}", ctx), "3ac");
  EXPECT_EQ(render("{{ msgs|map(attribute='role')|join(',') }}", ctx), "user,assistant,user");
  EXPECT_EQ(render("{{ msgs|selectattr('role', 'equalto', 'user')|list|length }}", ctx), "2");
  EXPECT_EQ(render("{{ msgs|rejectattr('tool_calls')|map(attribute='content')|join }}", ctx), "ac");
  EXPECT_EQ(render("{{ msgs|map(attribute='tool_calls.0.name', default='-')|list }}", ctx),
            "['-', 'f', '-']");
  EXPECT_EQ(render("{{ [3, 1, 2]|sort }}{{ ['b', 'A', 'a']|sort }}{{ [1, 2, 3]|reverse|list }}{{ [1, 2, "
                   "2]|unique|list }}"),
            "[1, 2, 3]['A', 'a', 'b'][3, 2, 1][1, 2]");
  EXPECT_EQ(
      render("{{ [1, 2, 3]|select('odd')|list }}{{ [1, 2, 3]|reject('equalto', 2)|list }}{{ [1, 2]|sum }}"
             "{{ [1, 5, 2]|max }}{{ ['a', 'b']|map('upper')|join }}"),
      "[1, 3][1, 3]35AB");
  EXPECT_EQ(render("{{ {'b': 1, 'a': 2}|dictsort }}{{ {'b': 1}|items|list }}{{ 'ab'|list }}"),
            "[('a', 2), ('b', 1)][('b', 1)]['a', 'b']");
}

TEST(ChatTemplateFilters, ToJsonMirrorsTransformers) {
  // json.dumps(ensure_ascii=False) with Python's separators; key order as given.
  const Json ctx = {{"t", {{"name", "f"}, {"b", {1, 2.5, nullptr, true}}, {"a", "é\"<>&\n\x01"}}}};
  EXPECT_EQ(render("{{ t|tojson }}", ctx),
            "{\"name\": \"f\", \"b\": [1, 2.5, null, true], \"a\": \"é\\\"<>&\\n\\u0001\"}");
  EXPECT_EQ(render("{{ t.b|tojson(indent=2) }}", ctx), "[\n  1,\n  2.5,\n  null,\n  true\n]");
  EXPECT_EQ(render("{{ t|tojson(sort_keys=true, separators=(',', ':')) }}", ctx),
            "{\"a\":\"é\\\"<>&\\n\\u0001\",\"b\":[1,2.5,null,true],\"name\":\"f\"}");
  EXPECT_EQ(
      render("{{ '😀é'|tojson(ensure_ascii=true) }}{{ {}|tojson(indent=4) }}{{ [[]]|tojson(indent=1) }}"),
      "\"\\ud83d\\ude00\\u00e9\"{}[\n []\n]");
  // A nlohmann::json context iterates its objects in sorted key order.
  auto tpl = ChatTemplate::compile("{{ t|tojson }}");
  ASSERT_TRUE(tpl.has_value());
  EXPECT_EQ(tpl->render(nlohmann::json{{"t", {{"b", 1}, {"a", 2}}}}).value(), "{\"a\": 2, \"b\": 1}");
}

TEST(ChatTemplateFilters, TestsLikeJinja) {
  EXPECT_EQ(
      render(
          "{{ 1 is number }}{{ true is number }}{{ 1.0 is integer }}{{ 'a' is string }}{{ {} is mapping }}"
          "{{ 'a' is iterable }}{{ none is none }}{{ 1 is true }}{{ true is true }}{{ 4 is divisibleby 2 }}"
          "{{ 3 is odd }}{{ 'a' is eq 'a' }}{{ 3 is gt 2 }}{{ 1 is in [1] }}{{ x is not defined }}"),
      "TrueTrueFalseTrueTrueTrueTrueFalseTrueTrueTrueTrueTrueTrueTrue");
}

TEST(ChatTemplateFilters, StringAndDictMethods) {
  EXPECT_EQ(
      render(
          "{{ 'abc'.startswith('a') }}{{ 'abc'.endswith(('x', 'c')) }}{{ '\n a \n'.strip() }}"
          "{{ '\nx\n'.lstrip('\n') }}{{ 'x\n\n'.rstrip('\n') }}{{ 'a b  c'.split() }}{{ 'a-b-c'.split('-', "
          "1) }}"
          "{{ 'a-b-c'.rsplit('-', 1) }}{{ 'Ab'.upper() }}{{ 'Ab'.lower() }}{{ 'ab ab'.replace('a', 'x') }}"),
      "TrueTrueax\nx['a', 'b', 'c']['a', 'b-c']['a-b', 'c']ABabxb xb");
  EXPECT_EQ(
      render("{{ '{} and {x}'.format(1, x='y') }}|{{ ', '.join(['a', 'b']) }}|{{ 'hello world'.title() }}"),
      "1 and y|a, b|Hello World");
  const Json ctx = {{"d", {{"a", 1}, {"b", 2}}}};
  EXPECT_EQ(
      render("{{ d.get('a') }}{{ d.get('z') }}{{ d.get('z', 0) }}{{ d.keys()|list }}{{ d.values()|list }}"
             "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}",
             ctx),
      "1None0['a', 'b'][1, 2]a=1;b=2;");
  EXPECT_EQ(failure("{{ 'x'.zfill(3) }}").code(), StatusCode::kUnsupported);
}

TEST(ChatTemplateFilters, Globals) {
  EXPECT_EQ(render("{{ range(3)|list }}{{ range(1, 7, 2)|list }}{{ dict(a=1) }}{% set ns = namespace(a=1) "
                   "%}{{ ns.a }}"),
            "[0, 1, 2][1, 3, 5]{'a': 1}1");
  const Status raised = failure("\n  {{ raise_exception('Roles must alternate') }}");
  EXPECT_EQ(raised.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(raised.message().find("Roles must alternate"), std::string::npos);
  EXPECT_NE(raised.message().find("line 2:"), std::string::npos);

  char expected[32];
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  std::strftime(expected, sizeof(expected), "%d %b %Y", &local);
  EXPECT_EQ(render("{{ strftime_now('%d %b %Y') }}"), expected);
}

// ---------------------------------------------------------------------------------------------
// Statements.

TEST(ChatTemplateStatements, LoopVariablesElseFilterAndControl) {
  EXPECT_EQ(render("{% for x in ['a', 'b', 'c'] %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ "
                   "loop.revindex0 }}"
                   "{{ loop.first }}{{ loop.last }}{{ loop.length }};{% endfor %}"),
            "1032TrueFalse3;2121FalseFalse3;3210FalseTrue3;");
  EXPECT_EQ(
      render("{% for i in [1, 2, 3, 4] if i is odd %}{{ i }}/{{ loop.length }}{% else %}none{% endfor %}"),
      "1/23/2");
  EXPECT_EQ(render("{% for i in [] %}x{% else %}none{% endfor %}"), "none");
  EXPECT_EQ(
      render("{% for i in [1, 2, 3, 4] %}{% if i == 2 %}{% continue %}{% endif %}{% if i == 4 %}{% break %}"
             "{% endif %}{{ i }}{% endfor %}"),
      "13");
  EXPECT_EQ(render("{% for i in [1, 2] %}{{ loop.previtem }}{{ loop.nextitem }}{{ loop.cycle('a', 'b') }}{% "
                   "endfor %}"),
            "2a1b");
  EXPECT_EQ(render("{% for a, b in [[1, 2], [3, 4]] %}{{ a }}{{ b }}{% endfor %}"), "1234");
}

TEST(ChatTemplateStatements, ScopingLikeJinja) {
  // A set inside a loop body lives for that iteration only; an if does not open a scope.
  EXPECT_EQ(
      render("{% set a = 5 %}{% for i in range(2) %}[{{ a }}]{% set a = i %}[{{ a }}]{% endfor %}{{ a }}"),
      "[5][0][5][1]5");
  EXPECT_EQ(render("{% if true %}{% set a = 1 %}{% endif %}{{ a }}"), "1");
  EXPECT_EQ(render("{% set ns = namespace(n=0) %}{% for i in range(4) %}{% set ns.n = ns.n + i %}{% endfor "
                   "%}{{ ns.n }}"),
            "6");
  EXPECT_EQ(render("{% set messages = messages[1:] %}{{ messages|length }}", {{"messages", {1, 2, 3}}}), "2");
  EXPECT_EQ(render("{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set c %}x{{ a }}{% endset %}[{{ c }}]"), "12[x1]");
  EXPECT_FALSE(failure("{% set x = 1 %}{% set x.y = 2 %}").is_ok());
  EXPECT_FALSE(failure("{% set ns = namespace() %}{% set ns._secret = 1 %}").is_ok());
}

TEST(ChatTemplateStatements, MacrosAndFilterBlocks) {
  EXPECT_EQ(
      render(
          "{% macro f(x, y=2) %}[{{ x }}{{ y }}{{ z }}]{% endmacro %}{% set z = 7 %}{{ f(1) }}{{ f(1, y=3) }}"
          "{{ f(x=4) }}"),
      "[127][137][427]");
  EXPECT_EQ(render("{% filter upper %}abc{{ 1 }}{% endfilter %}"), "ABC1");
  EXPECT_EQ(render("{% generation %}a{% endgeneration %}b"), "ab");
  EXPECT_FALSE(failure("{% macro f(x) %}{% endmacro %}{{ f(1, 2) }}").is_ok());
  EXPECT_FALSE(failure("{% macro f(x) %}{% endmacro %}{{ f(z=1) }}").is_ok());
}

TEST(ChatTemplateStatements, WhitespaceControlMatchesTransformersEnvironment) {
  // trim_blocks drops the newline after a block tag; lstrip_blocks the indentation before it.
  EXPECT_EQ(render("{% if true %}\n  yes\n{% endif %}\n"), "  yes\n");
  EXPECT_EQ(render("<\n    {% if true %}\n  x\n    {% endif %}\n>"), "<\n  x\n>");
  EXPECT_EQ(render("a  {{- 'b' -}}  c"), "abc");
  EXPECT_EQ(render("a\n  {%- if true -%}\n  b  \n{%- endif %}"), "ab");
  EXPECT_EQ(render("  {%+ if true %}x{% endif +%}\ny"), "  x\ny");
  EXPECT_EQ(render("a\n  {# comment #}\nb"), "a\nb");
  EXPECT_EQ(render("{{ 'v' }}\n{{ 'w' }}"), "v\nw");  // no trimming after }}
  EXPECT_EQ(render("{% raw %}{{ not evaluated }}{% endraw %}"), "{{ not evaluated }}");
  EXPECT_EQ(render("line1\r\nline2\r\n"), "line1\nline2");  // newlines normalized, one trailing dropped
  EXPECT_EQ(render("x\n\n"), "x\n");
}

// ---------------------------------------------------------------------------------------------
// Errors.

TEST(ChatTemplateErrors, CompileErrorsSayWhatAndWhere) {
  Status s = compile_error("hello\n  {% if x %}\n{{ foo( }}");
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("line 3:9"), std::string::npos) << s.message();
  s = compile_error("{% for m in messages %}\n{{ m }}");
  EXPECT_NE(s.message().find("line 2:8"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("endfor"), std::string::npos) << s.message();
  s = compile_error("ok\n\n   {{ x | nosuchfilter }}");
  EXPECT_EQ(s.code(), StatusCode::kUnsupported);
  EXPECT_NE(s.message().find("line 3:11: unknown filter 'nosuchfilter'"), std::string::npos) << s.message();
  s = compile_error("{{ x is nosuchtest }}");
  EXPECT_NE(s.message().find("line 1:9: unknown test 'nosuchtest'"), std::string::npos) << s.message();
  s = compile_error("{% include 'other.jinja' %}");
  EXPECT_EQ(s.code(), StatusCode::kUnsupported);
  EXPECT_NE(s.message().find("line 1:4"), std::string::npos) << s.message();
  EXPECT_NE(compile_error("{# never closed").message().find("line 1:1"), std::string::npos);
  EXPECT_NE(compile_error("{{ 'never closed }}").message().find("line 1:4"), std::string::npos);
  EXPECT_NE(compile_error("{{ (1 }}").message().find("line 1:7"), std::string::npos);
  EXPECT_NE(compile_error("{% endif %}").message().find("unexpected 'endif'"), std::string::npos);
  EXPECT_NE(compile_error("{% break %}").message().find("outside of a for loop"), std::string::npos);
  EXPECT_NE(compile_error("{{ 1 }").message().find("line 1:6"), std::string::npos);
  EXPECT_EQ(compile_error("é {{ é }}").message().rfind("chat template line 1:6", 0),
            0u);  // columns count characters
}

TEST(ChatTemplateErrors, RenderErrorsNameTheLine) {
  const Status s =
      failure("a\nb {{ messages[0].content.upper() + 1 }}", {{"messages", {{{"content", "x"}}}}});
  EXPECT_NE(s.message().find("line 2:"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("can only concatenate str"), std::string::npos) << s.message();
  EXPECT_FALSE(ChatTemplate::compile("x").value().render(Json::array()).has_value());
}

// ---------------------------------------------------------------------------------------------
// Limits: hostile templates and inputs end in an error, never a crash.

TEST(ChatTemplateLimitsTest, RecursionDepth) {
  const Status s = failure("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}");
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("max_recursion_depth"), std::string::npos) << s.message();
  // Fan-out recursion is bounded by the iteration budget.
  ChatTemplateLimits limits;
  limits.max_loop_iterations = 10000;
  EXPECT_EQ(
      failure(
          "{% macro f(n) %}{% if n < 30 %}{{ f(n + 1) }}{{ f(n + 1) }}{% endif %}{% endmacro %}{{ f(0) }}",
          Json::object(), limits)
          .code(),
      StatusCode::kResourceExhausted);
}

TEST(ChatTemplateLimitsTest, OutputSize) {
  ChatTemplateLimits limits;
  limits.max_output_bytes = 1000;
  const Status s = failure("{% for i in range(200) %}0123456789{% endfor %}", Json::object(), limits);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("max_output_bytes"), std::string::npos) << s.message();
  EXPECT_EQ(failure("{{ 'x' * 100000 }}", Json::object(), limits).code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(
      failure(
          "{% set ns = namespace(s='ab') %}{% for i in range(60) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
          Json::object(), limits)
          .code(),
      StatusCode::kResourceExhausted);
}

TEST(ChatTemplateLimitsTest, LoopIterations) {
  ChatTemplateLimits limits;
  limits.max_loop_iterations = 5000;
  const Status s = failure("{% for i in range(100) %}{% for j in range(100) %}{% endfor %}{% endfor %}",
                           Json::object(), limits);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("max_loop_iterations"), std::string::npos) << s.message();
  EXPECT_EQ(failure("{{ range(1000000000000)|length }}").code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(failure("{{ [1] * 1000000000000 }}").code(), StatusCode::kResourceExhausted);
}

TEST(ChatTemplateLimitsTest, NestingOfTemplatesAndValues) {
  // Deep parentheses, unary chains, long operator chains and nested tags fail to compile.
  EXPECT_FALSE(compile_error("{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}").is_ok());
  EXPECT_FALSE(compile_error("{{ " + std::string(5000, '-') + "1 }}").is_ok());
  std::string chain = "{{ 1";
  for (int i = 0; i < 20000; ++i) chain += " + 1";
  EXPECT_FALSE(compile_error(chain + " }}").is_ok());
  std::string nested;
  for (int i = 0; i < 3000; ++i) nested += "{% if true %}";
  EXPECT_FALSE(compile_error(nested).is_ok());
  // Values built deeper than max_value_depth, and a too-deep context.
  EXPECT_EQ(
      failure("{% set ns = namespace(x=[]) %}{% for i in range(1000) %}{% set ns.x = [ns.x] %}{% endfor %}")
          .code(),
      StatusCode::kResourceExhausted);
  Json deep = Json::array();
  for (int i = 0; i < 1000; ++i) deep = Json::array({deep});
  EXPECT_FALSE(failure("{{ x|length }}", {{"x", deep}}).is_ok());
  // A namespace cannot hold itself (no reference cycles).
  EXPECT_FALSE(failure("{% set ns = namespace() %}{% set ns.me = [ns] %}{{ ns }}").is_ok());
}

TEST(ChatTemplateLimitsTest, InvalidLimitsAreRejected) {
  ChatTemplateLimits limits;
  limits.max_output_bytes = 0;
  const auto tpl = ChatTemplate::compile("x", limits);
  ASSERT_FALSE(tpl.has_value());
  EXPECT_NE(tpl.status().message().find("max_output_bytes"), std::string::npos);
}

}  // namespace
}  // namespace inferd
