// The Jinja2 subset of chat templates (kolos/tokenizer/chat_template.h):
// each construct renders as Jinja2 renders it under transformers' settings
// (trim_blocks, lstrip_blocks); constructs outside the subset are refused at
// parse time naming the construct and its line:column. (The e2e test
// tests/e2e/inference compares whole templates against transformers'
// apply_chat_template.)
#include "kolos/tokenizer/chat_template.h"

#include <gtest/gtest.h>

#include "kolos/core/error.h"

namespace kolos::tokenizer {
namespace {

std::string render(const std::string& source, const ChatTemplateInputs& in = {}) {
  return ChatTemplate(source, "t.jinja").render(in);
}

ChatTemplateInputs conversation() {
  ChatTemplateInputs in;
  in.messages = {{"system", "be brief"}, {"user", "hi"}, {"assistant", "hello"}, {"user", "bye"}};
  in.bos_token = "<s>";
  in.eos_token = "</s>";
  return in;
}

std::string refusal(const std::string& source) {
  try {
    ChatTemplate(source, "t.jinja");
  } catch (const DataError& e) {
    return e.what();
  }
  return "";
}

TEST(ChatTemplate, TextAndOutput) {
  EXPECT_EQ(render("plain text"), "plain text");
  EXPECT_EQ(render("{{ 'a' + \"b\" ~ 3 }}"), "ab3");
  EXPECT_EQ(render("{{ bos_token }}x{{ eos_token }}", conversation()), "<s>x</s>");
  EXPECT_EQ(render("{{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 2 * 3 - 1 }}"), "3 -4 2 5");
  EXPECT_EQ(render("{{ true }} {{ none }} {{ undefined_name }}."), "True None .");
  EXPECT_EQ(render("{{ 'x' if add_generation_prompt else 'y' }}"), "x");
  EXPECT_EQ(render("a\n"), "a");  // one trailing newline dropped, as Jinja's default
}

TEST(ChatTemplate, LoopAndConditions) {
  const std::string t =
      "{% for m in messages %}"
      "{% if loop.first %}[{% endif %}"
      "{{ loop.index0 }}:{{ m['role'] }}={{ m.content }}"
      "{% if not loop.last %},{% else %}]{% endif %}"
      "{% endfor %}";
  EXPECT_EQ(render(t, conversation()),
            "[0:system=be brief,1:user=hi,2:assistant=hello,3:user=bye]");
  const std::string chain =
      "{% for m in messages %}{% if m.role == 'system' %}S{% elif m.role in ['user'] %}U"
      "{% elif m.role not in ['tool'] and loop.index is defined %}A{% else %}?{% endif %}"
      "{% endfor %}";
  EXPECT_EQ(render(chain, conversation()), "SUAU");
  EXPECT_EQ(render("{{ messages|length }}{{ messages[-1].content|upper }}{{ 'AbC'|lower }}",
                   conversation()),
            "4BYEabc");
  EXPECT_EQ(render("{% for m in messages[1:3] %}{{ m.role }} {% endfor %}", conversation()),
            "user assistant ");
  EXPECT_EQ(render("{{ 'héllo'[1:3] }}{{ 'héllo'|length }}"), "él5");
}

TEST(ChatTemplate, SetScopes) {
  // A set at the top level is seen after it; a set in a loop stays in the loop.
  EXPECT_EQ(
      render("{% set x = 'a' %}{% for m in messages %}{% set x = m.role %}{% endfor %}{{ x }}",
             conversation()),
      "a");
  EXPECT_EQ(render("{% if true %}{% set y = 2 %}{% endif %}{{ y + 1 }}"), "3");
}

TEST(ChatTemplate, WhitespaceControl) {
  // trim_blocks and lstrip_blocks, as transformers sets them.
  EXPECT_EQ(render("{% if true %}\n    x\n{% endif %}\ny"), "    x\ny");
  EXPECT_EQ(render("a\n  {% if true %}\nb\n  {% endif %}\nc"), "a\nb\nc");
  EXPECT_EQ(render("a   {{- ' b ' -}}   c"), "a b c");
  EXPECT_EQ(render("a \n {%- if true -%} \n b {%- endif %}"), "ab");
  EXPECT_EQ(render("x {# a comment #}\ny"), "x y");
}

TEST(ChatTemplate, FiltersAndMethods) {
  EXPECT_EQ(render("{{ '  pad  '|trim }}|{{ ' s '.strip() }}|{{ ' s '.lstrip() }}|"
                   "{{ 'abc'.startswith('ab') }}{{ 'abc'.endswith('x') }}"),
            "pad|s|s |TrueFalse");
  EXPECT_EQ(render("{{ 'a\"b\\n'|tojson }} {{ [1, 'x', none, true]|tojson }}"),
            "\"a\\\"b\\n\" [1, \"x\", null, true]");
  EXPECT_EQ(render("{{ 3|string + 'x' }}"), "3x");
  // Keys in insertion order, Python's separators.
  EXPECT_EQ(render("{{ messages[1]|tojson }}", conversation()),
            "{\"role\": \"user\", \"content\": \"hi\"}");
}

TEST(ChatTemplate, RaiseException) {
  const ChatTemplate t(
      "{% for m in messages %}{% if (m.role == 'user') != (loop.index0 % 2 == 0) %}"
      "{{ raise_exception('roles must alternate user/assistant') }}{% endif %}{% endfor %}ok",
      "t.jinja");
  ChatTemplateInputs good;
  good.messages = {{"user", "a"}, {"assistant", "b"}};
  EXPECT_EQ(t.render(good), "ok");
  ChatTemplateInputs bad;
  bad.messages = {{"user", "a"}, {"user", "b"}};
  try {
    t.render(bad);
    FAIL() << "no exception";
  } catch (const DataError& e) {
    EXPECT_STREQ(e.what(), "roles must alternate user/assistant");
  }
}

TEST(ChatTemplate, RuntimeErrorsNamePosition) {
  try {
    render("ab\n{{ messages[0].content.role }}{{ nothing.attr }}", conversation());
    FAIL() << "no exception";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("t.jinja:2:"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("undefined"), std::string::npos) << e.what();
  }
  EXPECT_THROW(render("{{ 'a' + 1 }}"), DataError);
}

TEST(ChatTemplate, RefusesWhatTheSubsetLacks) {
  struct Case {
    std::string source, construct, where;
  };
  const std::vector<Case> cases = {
      {"ok\n{% macro f() %}{% endmacro %}", "the statement `{% macro %}`", "t.jinja:2:4"},
      {"{{ x|join(', ') }}", "the filter `join`", "t.jinja:1:5"},
      {"{{ x|trim(1) }}", "arguments to the filter `trim`", "t.jinja:1:10"},
      {"{% set ns = namespace(a=1) %}", "the function `namespace`", "t.jinja:1:13"},
      {"{{ {'a': 1} }}", "a dict literal", "t.jinja:1:4"},
      {"{{ x.split(',') }}", "the method `split()`", "t.jinja:1:5"},
      {"{{ 1 / 2 }}", "the operator `/`", "t.jinja:1:6"},
      {"{% for a, b in x %}{% endfor %}", "unpacking in a for loop", "t.jinja:1:9"},
      {"{{ x is even }}", "the test `is even`", "t.jinja:1:6"},
      {"{{ 1 < 2 < 3 }}", "a chained comparison", "t.jinja:1:10"},
      {"{% include 'other' %}", "the statement `{% include %}`", "t.jinja:1:4"},
  };
  for (const Case& c : cases) {
    const std::string what = refusal(c.source);
    EXPECT_NE(what.find("unsupported construct: " + c.construct), std::string::npos)
        << c.source << " -> " << what;
    EXPECT_EQ(what.rfind(c.where + ":", 0), 0u) << c.source << " -> " << what;
  }
  EXPECT_NE(refusal("{% if x %}a").find("expected `{% endif %}`"), std::string::npos);
  EXPECT_NE(refusal("{{ x").find("never closed"), std::string::npos);
  EXPECT_NE(refusal("{% endfor %}").find("without its opening tag"), std::string::npos);
}

}  // namespace
}  // namespace kolos::tokenizer
