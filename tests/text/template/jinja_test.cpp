// The Jinja interpreter feature by feature: each template of tests/fixtures/text/template/
// features.json rendered with its context must equal @huggingface/jinja's output (expected/hf),
// or Jinja2's for the documented deviations; then the error paths, which must name the construct
// and the line.
#include "text/template/jinja.h"
#include "text/template/value.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

namespace moetier::text::jinja {
namespace {

namespace fs = std::filesystem;
using nlohmann::ordered_json;

const fs::path kDir = fs::path(MOETIER_FIXTURES_DIR) / "text" / "template";

ordered_json ReadJson(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in) << "cannot open " << path;
  std::stringstream buf;
  buf << in.rdbuf();
  return ordered_json::parse(buf.str());
}

Expected<std::string> Render(const std::string& source, const ordered_json& context = {}) {
  MT_ASSIGN_OR_RETURN(Template t, Template::Parse(source));
  return t.Render(context.is_null() ? ordered_json::object() : context);
}

std::string RenderOk(const std::string& source, const ordered_json& context = {}) {
  auto out = Render(source, context);
  EXPECT_TRUE(out.ok()) << source << "\n  -> " << out.message();
  return out.ok() ? *out : std::string();
}

std::string RenderError(const std::string& source, const ordered_json& context = {}) {
  auto out = Render(source, context);
  EXPECT_FALSE(out.ok()) << source << " rendered " << (out.ok() ? *out : "");
  return out.ok() ? std::string() : out.message();
}

TEST(JinjaFeatures, MatchReferenceRenderer) {
  const ordered_json features = ReadJson(kDir / "features.json");
  const ordered_json hf = ReadJson(kDir / "expected" / "hf" / "features.json").at("results");
  const ordered_json j2 = ReadJson(kDir / "expected" / "jinja2" / "features.json").at("results");
  const ordered_json deviations_doc = ReadJson(kDir / "deviations.json");
  std::set<std::string> deviations;
  for (const auto& d : deviations_doc.at("features")) deviations.insert(d.at("feature"));
  int matched = 0;
  for (const auto& [name, source] : features.at("templates").items()) {
    const bool deviation = deviations.count(name) > 0;
    const ordered_json& expected = deviation ? j2.at(name) : hf.at(name);
    SCOPED_TRACE(name + (deviation ? " (deviation: compared with Jinja2)" : ""));
    auto out = Render(source.get<std::string>(), features.at("context"));
    if (expected.contains("rendered")) {
      if (!out.ok()) {
        ADD_FAILURE() << "render failed: " << out.message();
        continue;
      }
      EXPECT_EQ(*out, expected["rendered"].get<std::string>());
      if (*out != expected["rendered"].get<std::string>()) continue;
    } else if (expected.at("raised").get<bool>()) {
      EXPECT_EQ(out.message(), "template raised: " + expected["error"].get<std::string>());
      if (out.ok() || out.message() != "template raised: " + expected["error"].get<std::string>()) {
        continue;
      }
    } else {
      EXPECT_FALSE(out.ok()) << "rendered, but the reference failed: " << expected["error"];
      if (out.ok()) continue;
    }
    ++matched;
  }
  std::printf("[ features ] %d/%zu templates match\n", matched, features.at("templates").size());
}

// ---- behaviour the reference corpus does not pin down ------------------------------------------

TEST(Jinja, KeyOrderIsPreserved) {
  const ordered_json ctx = ordered_json::parse(R"({"d": {"zeta": 1, "alpha": 2, "mid": 3}})");
  EXPECT_EQ(RenderOk("{% for k, v in d | items %}{{ k }}{% endfor %}", ctx), "zetaalphamid");
  EXPECT_EQ(RenderOk("{{ d | tojson }}", ctx), R"({"zeta": 1, "alpha": 2, "mid": 3})");
}

TEST(Jinja, FloatsFollowPython) {
  EXPECT_EQ(RenderOk("{{ x }} {{ x | tojson }}", ordered_json{{"x", 1.0}}), "1.0 1.0");
  EXPECT_EQ(RenderOk("{{ x | tojson }}", ordered_json{{"x", 1e-7}}), "1e-07");
  EXPECT_EQ(RenderOk("{{ x | tojson }}", ordered_json{{"x", 1.5e16}}), "1.5e+16");
  EXPECT_EQ(RenderOk("{{ x }}", ordered_json{{"x", 123456.789}}), "123456.789");
}

TEST(Jinja, JsonEscapes) {
  const ordered_json ctx{{"s", std::string("tab\t nl\n quote\" bs\\ ctl\x01 é")}};
  EXPECT_EQ(RenderOk("{{ s | tojson }}", ctx), R"("tab\t nl\n quote\" bs\\ ctl\u0001 é")");
  EXPECT_EQ(RenderOk("{{ s | tojson(ensure_ascii=true) }}", ctx),
            R"("tab\t nl\n quote\" bs\\ ctl\u0001 \u00e9")");
}

TEST(Jinja, ForElseRunsOnlyWithoutItems) {
  // Jinja2's rule; @huggingface/jinja also runs the else block when every pass hit `continue`.
  EXPECT_EQ(RenderOk("{% for x in [1, 2] %}{% continue %}{% else %}E{% endfor %}"), "");
  EXPECT_EQ(RenderOk("{% for x in [] %}x{% else %}E{% endfor %}"), "E");
}

TEST(Jinja, OutputBeforeBreakIsKept) {
  EXPECT_EQ(RenderOk("{% for x in [1, 2, 3] %}<{{ x }}{% if x == 2 %}{% break %}{% endif %}>"
                     "{% endfor %}"),
            "<1><2");
}

TEST(Jinja, MacroVarargsAndKwargs) {
  EXPECT_EQ(RenderOk("{% macro m(a) %}{{ a }}{{ varargs | length }}{{ kwargs | tojson }}"
                     "{% endmacro %}{{ m(1, 2, 3, k='v') }}"),
            R"(12{"k": "v"})");
}

TEST(Jinja, ExtrasBeyondTheReference) {
  EXPECT_EQ(RenderOk("{{ 10 is divisibleby(5) }} {{ 7 is divisibleby(3) }}"), "true false");
  EXPECT_EQ(RenderOk("{{ [1, 2, 3] | sum }} {{ [3, 1] | max }} {{ [3, 1] | min }}"), "6 3 1");
  EXPECT_EQ(RenderOk("{{ [1, 2, 3, 4, 5] | batch(2) | tojson }}"), "[[1, 2], [3, 4], [5]]");
  EXPECT_EQ(RenderOk("{{ [1, 2, 3, 4] | select('odd') | list }}"), "[1, 3]");
  EXPECT_EQ(RenderOk("{{ [1, 2, 3, 4] | reject('odd') | list }}"), "[2, 4]");
  EXPECT_EQ(RenderOk("{{ 2.567 | round(2) }} {{ 2.5 | round(0, 'floor') }}"), "2.57 2.0");
  EXPECT_EQ(RenderOk("{{ '<a href=\"x\">' | e }}"), "&lt;a href=&#34;x&#34;&gt;");
  EXPECT_EQ(RenderOk("{{ dict(a=1, b=2) | tojson }}"), R"({"a": 1, "b": 2})");
  EXPECT_EQ(RenderOk("{{ 'a,b,c'.rsplit(',', 1) }}"), R"(["a,b", "c"])");
  EXPECT_EQ(RenderOk("{{ 'hello'.find('l') }} {{ 'hello'.count('l') }}"), "2 2");
  EXPECT_EQ(RenderOk("{{ 'b' < 'c' }}"), "true");
  EXPECT_EQ(RenderOk("{% for c in 'ab' %}{{ c }}.{% endfor %}"), "a.b.");
}

TEST(Jinja, StrftimeNowIsFixedByOptions) {
  auto t = Template::Parse("{{ strftime_now('%Y-%m-%d %H:%M') }}");
  ASSERT_TRUE(t.ok());
  RenderOptions options;
  std::tm now{};
  now.tm_year = 125;
  now.tm_mon = 0;
  now.tm_mday = 2;
  now.tm_hour = 3;
  now.tm_min = 4;
  options.now = now;
  EXPECT_EQ(*t->Render(ordered_json::object(), options), "2025-01-02 03:04");
}

TEST(Jinja, BrokenUtf8PassesThrough) {
  const std::string bad =
      "a\xff\xfe"
      "b";
  EXPECT_EQ(RenderOk("{{ s }}|{{ s | upper }}", ordered_json{{"s", "x"}}), "x|X");
  EXPECT_EQ(RenderOk(bad + "{{ 1 }}"), bad + "1");
}

// ---- errors ------------------------------------------------------------------------------------

TEST(JinjaErrors, UnknownFilterNamesItAndTheLine) {
  EXPECT_EQ(RenderError("line one\n{{ 'x' | foo }}"), "template line 2: unknown filter 'foo'");
}

TEST(JinjaErrors, UnknownTest) {
  EXPECT_EQ(RenderError("{% if 1 is frob %}{% endif %}"), "template line 1: unknown test 'frob'");
}

TEST(JinjaErrors, UnclosedBlocksNameTheOpeningLine) {
  EXPECT_EQ(RenderError("a\n\n{% if x %}\nb"),
            "template line 3: unclosed 'if' block (missing {% endif %})");
  EXPECT_EQ(
      RenderError("{% for x in y %}\n{% if x %}\n{% endfor %}"),
      "template line 3: expected {% endif %} to close the 'if' on line 2, found {% endfor %}");
  EXPECT_EQ(RenderError("{% macro m() %}x"),
            "template line 1: unclosed 'macro' block (missing {% endmacro %})");
  EXPECT_EQ(RenderError("{% set x %}x"),
            "template line 1: unclosed 'set' block (missing {% endset %})");
}

TEST(JinjaErrors, StrayEndTag) {
  EXPECT_EQ(RenderError("x\n{% endfor %}"),
            "template line 2: '{% endfor %}' without a matching opening tag");
}

TEST(JinjaErrors, UnknownStatement) {
  EXPECT_EQ(RenderError("{% include 'x.j2' %}"), "template line 1: unknown statement 'include'");
}

TEST(JinjaErrors, BadSyntaxNamesTheLine) {
  EXPECT_EQ(RenderError("ok\nok\n{{ 1 + }}"),
            "template line 3: expected an expression, found '}}'");
  EXPECT_EQ(RenderError("{{ (1 }}"), "template line 1: expected ')', found '}}'");
  EXPECT_EQ(RenderError("{{ x !y }}"), "template line 1: unexpected character '!'");
  EXPECT_EQ(RenderError("{{ 'abc }}"), "template line 1: unterminated string literal");
  EXPECT_EQ(RenderError("{{ '\\q' }}"), "template line 1: unknown escape '\\q' in string literal");
  EXPECT_EQ(RenderError("{# open"), "template line 1: unclosed comment (missing '#}')");
  EXPECT_EQ(RenderError("{{ x"), "template line 1: expected '}}', found end of template");
}

TEST(JinjaErrors, LinesCountTrimmedNewlines) {
  // trim_blocks removes the newline after a tag; lines still count from the source as written.
  EXPECT_EQ(RenderError("{% if true %}\n{% if true %}\n{{ y | nope }}\n{% endif %}{% endif %}"),
            "template line 3: unknown filter 'nope'");
}

TEST(JinjaErrors, RaiseExceptionCarriesTheMessage) {
  EXPECT_EQ(RenderError("{{ raise_exception('Only user and assistant roles are supported!') }}"),
            "template raised: Only user and assistant roles are supported!");
  auto t = Template::Parse("{% if bad %}{{ raise_exception('nope: ' ~ bad) }}{% endif %}ok",
                           "chat template");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(*t->Render(ordered_json{{"bad", false}}), "ok");
  EXPECT_EQ(t->Render(ordered_json{{"bad", "x"}}).message(), "chat template raised: nope: x");
}

TEST(JinjaErrors, RuntimeErrorsNameTheOperands) {
  EXPECT_EQ(RenderError("{{ m.content + 1 }}", ordered_json{{"m", {{"content", nullptr}}}}),
            "template line 1: cannot apply '+': m.content is none");
  EXPECT_EQ(RenderError("\n{{ nope() }}"), "template line 2: 'nope' is undefined");
  EXPECT_EQ(RenderError("{{ 'a' + [1] }}"),
            "template line 1: cannot concatenate a string and a list with '+' ([...])");
  EXPECT_EQ(RenderError("{% set x.y = 1 %}"),
            "template line 1: cannot set attribute 'y' on a undefined; only a namespace() takes "
            "attributes");
  EXPECT_EQ(RenderError("{% for x in 5 %}{% endfor %}"),
            "template line 1: cannot iterate over a integer in 'for'");
  EXPECT_EQ(RenderError("{{ 1 // 0 }}"), "template line 1: division by zero");
}

TEST(JinjaErrors, RunawayTemplatesStop) {
  auto t = Template::Parse(
      "{% for i in range(1000) %}{% for j in range(1000) %}{% for k in "
      "range(1000) %}x{% endfor %}{% endfor %}{% endfor %}");
  ASSERT_TRUE(t.ok());
  RenderOptions options;
  options.limits.max_steps = 100000;
  auto out = t->Render(ordered_json::object(), options);
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.message().find("evaluation steps"), std::string::npos) << out.message();

  auto grow = Template::Parse(
      "{% set ns = namespace(s='x') %}{% for i in range(64) %}"
      "{% set ns.s = ns.s ~ ns.s %}{% endfor %}");
  ASSERT_TRUE(grow.ok());
  out = grow->Render(ordered_json::object());
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.message().find("output exceeds"), std::string::npos) << out.message();

  auto recurse = Template::Parse("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}");
  ASSERT_TRUE(recurse.ok());
  out = recurse->Render(ordered_json::object());
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.message().find("nested deeper"), std::string::npos) << out.message();

  EXPECT_NE(RenderError("{{ range(100000000) | length }}").find("list exceeds"), std::string::npos);
  std::string deep(5000, '(');
  EXPECT_NE(RenderError("{{ " + deep + " }}").find("expressions nest deeper"), std::string::npos);
}

// A namespace that holds itself (directly, or through a list) is a reference cycle of shared
// pointers; the interpreter empties every namespace when the render ends, so nothing leaks (the
// ASan+UBSan suite runs this test with LeakSanitizer, which the libFuzzer run first tripped on).
TEST(Jinja, NamespaceCyclesAreReleasedAfterTheRender) {
  EXPECT_EQ(RenderOk("{% set ns = namespace(a=1) %}{% set ns.self = ns %}{{ ns.self.self.a }}"),
            "1");
  EXPECT_EQ(RenderOk("{% set ns = namespace(l=[]) %}{% set ns.l = ns.l + [ns] %}"
                     "{{ ns.l[0].l | length }}"),
            "1");
  EXPECT_FALSE(
      Render("{% set ns = namespace() %}{% set ns.x = ns %}{{ raise_exception('x') }}").ok());
  // Printing one walks into itself: an error that says so, not a stack overflow.
  EXPECT_NE(RenderError("{% set ns = namespace(a=1) %}{% set ns.self = ns %}{{ ns }}")
                .find("nested deeper than"),
            std::string::npos);
}

// GCC 12 at -O2 with the sanitizers flags std::variant's move of the Values built below as
// "maybe uninitialized" (a false alarm of the same family as GCC bug 105593).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
// A template can nest lists 10^5 deep within its step limit; releasing such a value (when the
// namespace holding it is emptied at the end of the render, and when a Value goes away in C++)
// must not recurse once per level, which overflowed the stack.
TEST(Jinja, DeeplyNestedValuesAreReleasedWithoutRecursion) {
  EXPECT_EQ(RenderOk("{% set ns = namespace(l=[]) %}{% for i in range(100000) %}"
                     "{% set ns.l = [ns.l, {'d': ns.l}] %}{% endfor %}{{ ns.l | length }}"),
            "2");
  Value v = Value::List({});
  for (int i = 0; i < 1'000'000; ++i) {
    ValueDict d;
    d.Set("next", std::move(v));
    v = Value::List({Value::Dict(std::move(d)), Value::Int(i)});
  }
  Value copy = v;  // shared: releasing one reference must leave the other whole
  v = Value::None();
  EXPECT_EQ(copy.as_list().size(), 2u);
  EXPECT_EQ(copy.as_list()[1].as_int(), 999'999);
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

}  // namespace
}  // namespace moetier::text::jinja
