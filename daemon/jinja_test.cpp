// The Jinja engine against Python's jinja2 (configured as transformers renders chat templates) on the
// templates of the supported model families x conversations (system, multi-turn, tool calls), and unit
// tests of the language and of its errors.
#include "jinja.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace inferd::jinja {
namespace {

const std::string kDir = std::string(INFERD_TEST_DATA_DIR) + "/chat_templates";

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

Result<std::string> render(std::string_view src, std::string_view context_json, int64_t now = 0,
                           const RenderLimits& limits = {}) {
  auto t = Template::parse(src);
  if (!t) return t.status();
  auto ctx = from_json(context_json);
  if (!ctx) return ctx.status();
  return t->render(*ctx, now, limits);
}

std::string must_render(std::string_view src, std::string_view context_json = "{}") {
  auto r = render(src, context_json);
  EXPECT_TRUE(r.is_ok()) << src << ": " << r.status().to_string();
  return r.is_ok() ? *r : std::string();
}

TEST(Jinja, EqualsJinja2OnEveryCommittedTemplateAndConversation) {
  setenv("TZ", "UTC", 1);
  tzset();
  const auto refs = from_json(read_file(kDir + "/refs.json"));
  ASSERT_TRUE(refs.is_ok()) << "missing " << kDir << "/refs.json";
  const Value* cases = refs->object().find("cases");
  const int64_t now = refs->object().find("now")->integer();
  ASSERT_TRUE(cases && cases->is_array());
  int compared = 0, refused = 0;
  for (const Value& c : cases->array()) {
    const std::string name = c.object().find("template")->str();
    const std::string what = name + " / " + c.object().find("conversation")->str();
    auto t = Template::parse(read_file(kDir + "/" + name));
    ASSERT_TRUE(t.is_ok()) << name << ": " << t.status().to_string();
    auto out = t->render(*c.object().find("context"), now);
    if (const Value* want = c.object().find("output")) {
      ASSERT_TRUE(out.is_ok()) << what << ": " << out.status().to_string();
      EXPECT_EQ(*out, want->str()) << what;
      ++compared;
    } else {
      // The template refused the conversation (raise_exception): so must we, with its message.
      const std::string err = c.object().find("error")->str();
      ASSERT_FALSE(out.is_ok()) << what << " rendered, but jinja2 raised " << err;
      const std::string msg = err.substr(err.find(": ") + 2);
      EXPECT_NE(out.status().message().find(msg), std::string::npos) << out.status().to_string() << " vs " << err;
      ++refused;
    }
  }
  EXPECT_GE(compared, 100);
  EXPECT_GE(refused, 5);
}

TEST(Jinja, WhitespaceControlAsTransformersConfiguresIt) {
  // trim_blocks: the newline after a block tag goes; lstrip_blocks: the indentation before one.
  EXPECT_EQ(must_render("{% if true %}\n  yes\n{% endif %}\nend"), "  yes\nend");
  EXPECT_EQ(must_render("  {% if true %}x{% endif %}"), "x");
  EXPECT_EQ(must_render("a  {{- ' b ' -}}  c"), "a b c");
  EXPECT_EQ(must_render("a\n  {%- if true %} b{% endif %}"), "a b");
  EXPECT_EQ(must_render("x {# comment #}\ny"), "x y");
  EXPECT_EQ(must_render("  {%+ if true %}x{% endif %}"), "  x");
  EXPECT_EQ(must_render("{{ 'a' }}\nb"), "a\nb");  // no trimming after an expression
}

TEST(Jinja, ExpressionsFollowPython) {
  EXPECT_EQ(must_render("{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 10 }}"), "3 -4 1 2 3.5 1024");
  EXPECT_EQ(must_render("{{ 1 + 2 * 3 }} {{ 'a' ~ 1 ~ none }} {{ [1, 2] + [3] }}"), "7 a1None [1, 2, 3]");
  EXPECT_EQ(must_render("{{ true }} {{ none }} {{ 1.0 }} {{ 0.1 + 0.2 }} {{ {'a': [1, 'x']} }}"),
            "True None 1.0 0.30000000000000004 {'a': [1, 'x']}");
  EXPECT_EQ(must_render("{{ 'x' if 1 > 2 else 'y' }} {{ not 0 }} {{ 'b' in 'abc' }} {{ 3 not in [1, 2] }}"),
            "y True True True");
  EXPECT_EQ(must_render("{{ 'hello'[1:3] }} {{ 'hello'[::-1] }} {{ [1, 2, 3][-1] }} {{ 'héllo'[1] }}"), "el olleh 3 é");
  EXPECT_EQ(must_render("{{ ' a b '.strip() }}|{{ 'a,b,,c'.split(',') }}|{{ 'x y  z'.split() }}"),
            "a b|['a', 'b', '', 'c']|['x', 'y', 'z']");
  EXPECT_EQ(must_render("{{ m.content }} {{ m['role'] }} {{ m.missing is defined }} {{ m.get('x', 5) }}",
                        R"({"m": {"role": "user", "content": "hi"}})"),
            "hi user False 5");
}

TEST(Jinja, LoopsSetAndNamespaces) {
  EXPECT_EQ(must_render("{% for x in [1, 2, 3] %}{{ loop.index }}{{ x }}{% if not loop.last %},{% endif %}{% endfor %}"),
            "11,22,33");
  EXPECT_EQ(must_render("{% for x in [] %}a{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(must_render("{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }};{% endfor %}"), "a=1;b=2;");
  EXPECT_EQ(must_render("{% for x in range(10) if x is odd %}{{ x }}{% endfor %}"), "13579");
  EXPECT_EQ(must_render("{% for x in range(5) %}{% if x == 3 %}{% break %}{% endif %}{% if x == 1 %}{% continue %}{% endif %}{{ x }}{% endfor %}"),
            "02");
  // A set inside a loop stays in the loop; a namespace carries values out.
  EXPECT_EQ(must_render("{% set n = 0 %}{% set ns = namespace(n=0) %}{% for x in [1, 2] %}{% set n = n + x %}"
                        "{% set ns.n = ns.n + x %}{% endfor %}{{ n }} {{ ns.n }}"),
            "0 3");
  EXPECT_EQ(must_render("{% set x %}block {{ 1 + 1 }}{% endset %}[{{ x }}]"), "[block 2]");
  EXPECT_EQ(must_render("{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('Ann') }} {{ greet('Bo', punct='?') }}"),
            "Hi Ann! Hi Bo?");
}

TEST(Jinja, FiltersAndTests) {
  EXPECT_EQ(must_render("{{ [3, 1, 2] | sort | join(',') }} {{ 'abc' | upper }} {{ '  x ' | trim }} {{ [1, 2] | length }}"),
            "1,2,3 ABC x 2");
  EXPECT_EQ(must_render("{{ {'b': 1, 'a': [true, none, 'é\"']} | tojson }}"), R"({"b": 1, "a": [true, null, "é\""]})");
  EXPECT_EQ(must_render("{{ {'a': 1} | tojson(indent=2) }}"), "{\n  \"a\": 1\n}");
  EXPECT_EQ(must_render("{{ x | default('d') }} {{ '' | default('e', true) }}"), "d e");
  EXPECT_EQ(must_render("{{ ms | selectattr('role', 'equalto', 'user') | map(attribute='content') | join('+') }}",
                        R"({"ms": [{"role": "user", "content": "a"}, {"role": "bot", "content": "b"}, {"role": "user", "content": "c"}]})"),
            "a+c");
  EXPECT_EQ(must_render("{{ 'a\nb' | indent(2) }}|{{ 3 is divisibleby 3 }} {{ 'x' is string }} {{ none is none }}"),
            "a\n  b|True True True");
}

TEST(Jinja, ErrorsNameTheConstructAndLine) {
  auto expect_error = [](std::string_view src, const std::string& fragment, std::string_view ctx = "{}") {
    auto r = render(src, ctx);
    ASSERT_FALSE(r.is_ok()) << src << " rendered";
    EXPECT_NE(r.status().message().find(fragment), std::string::npos) << src << ": " << r.status().to_string();
  };
  expect_error("a\n{% include 'x' %}", "line 2: the tag '{% include %}' is not supported");
  expect_error("{{ x | frobnicate }}", "the filter 'frobnicate' is not supported");
  expect_error("{{ x is frobnicated }}", "the test 'frobnicated' is not supported");
  expect_error("{{ 'a'.frobnicate() }}", "'frobnicate' is undefined");
  expect_error("{% if true %}never closed", "missing '{% elif %}'");
  expect_error("{{ 1 + }}", "unexpected");
  expect_error("{{ 'unterminated }}", "'{{' is never closed");
  expect_error("{% set x = 'unterminated %}", "unterminated string literal");
  expect_error("{{ raise_exception('Only user and assistant roles') }}", "Only user and assistant roles");
  expect_error("{% for i in range(1000000) %}{% endfor %}", "range() is limited");
  expect_error("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", "nests too deeply");
  expect_error("{{ 1 / 0 }}", "division by zero");
  expect_error("{{ x.y }}", "of an undefined value");
  expect_error("{% set ns = 1 %}{% set ns.a = 2 %}", "is not a namespace");
  expect_error("{{ 'x' * 100000000 }}", "too long");
  // The step bound, at a tenth of a million steps (the default five million take minutes under the sanitizers).
  EXPECT_EQ(RenderLimits{}.max_steps, 5'000'000);
  const std::string_view nested = "{% for i in range(1000) %}{% for j in range(1000) %}{% endfor %}{% endfor %}";
  auto r = render(nested, "{}", 0, RenderLimits{100'000});
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("too many steps"), std::string::npos) << r.status().to_string();
  EXPECT_TRUE(render("{% for i in range(100) %}{% for j in range(100) %}{% endfor %}{% endfor %}", "{}", 0,
                     RenderLimits{100'000})
                  .is_ok());
}

TEST(Jinja, StrftimeNowUsesTheGivenTime) {
  setenv("TZ", "UTC", 1);
  tzset();
  auto r = render("{{ strftime_now('%d %b %Y') }}", "{}", 1764115200);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(*r, "26 Nov 2025");
}

}  // namespace
}  // namespace inferd::jinja
