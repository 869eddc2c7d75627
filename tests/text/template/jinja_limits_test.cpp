// Nesting limits of the Jinja interpreter: a template or its data nested past kMaxNestingDepth
// fails with one clean error that names the depth, whatever builds the nesting (a chain of one
// operator, a postfix chain, prefix operators, parentheses, literals, blocks, elifs, macro calls,
// data), where the same shape nested just below the limit renders correctly. Chains are 10^4 and
// 10^5 long: far past the limit, and long enough that any recursion once per link (parsing,
// evaluating, printing, destroying the syntax tree) would overflow the stack, in the Release and
// the ASan build alike. The last tests measure the stack a render at the limit takes.
#include <gtest/gtest.h>
#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "text/template/chat_template.h"
#include "text/template/jinja.h"
#include "text/template/nesting.h"

namespace moetier::text::jinja {
namespace {

using nlohmann::ordered_json;

const std::string kLimit = std::to_string(kMaxNestingDepth);
const std::string kExpressionsTooDeep = "expressions nest deeper than " + kLimit + " levels";
const std::string kBlocksTooDeep = "blocks nest deeper than " + kLimit + " levels";
const std::string kDataTooDeep = "nested deeper than " + kLimit + " levels";
constexpr int kLengths[] = {10'000, 100'000};

std::string Repeat(std::string_view s, int n) {
  std::string out;
  out.reserve(s.size() * static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) out += s;
  return out;
}

// `first` then n-1 times `sep first`: an operator chain of n operands.
std::string Chain(const std::string& first, const std::string& sep, int n) {
  return first + Repeat(sep + first, n - 1);
}

// The context is passed on, never copied: copying an nlohmann::json recurses once per level,
// and the contexts here nest 10^5 deep.
Expected<std::string> Render(const std::string& source, const ordered_json& context = {}) {
  MT_ASSIGN_OR_RETURN(Template t, Template::Parse(source));
  return t.Render(context);
}

// The output, or "error: " and the message: comparable in one EXPECT_EQ.
std::string Rendered(const std::string& source, const ordered_json& context = {}) {
  auto out = Render(source, context);
  return out.ok() ? *out : "error: " + out.message();
}

// The message of a parse that must fail.
std::string ParseError(const std::string& source) {
  auto t = Template::Parse(source);
  EXPECT_FALSE(t.ok()) << "parsed: " << source.substr(0, 80) << "...";
  return t.ok() ? std::string() : t.message();
}

// One shape of nesting: a template nesting it n times, and what that renders to.
struct Shape {
  const char* name;
  std::function<std::string(int n)> source;
  std::function<std::string(int n)> rendered;
  const std::string& error = kExpressionsTooDeep;
  int levels_per_step = 1;  // levels each of the n steps nests
};

std::string Const(const char* s, int) {
  return s;
}

// Every way a template can nest, each written n levels deep.
std::vector<Shape> Shapes() {
  using std::placeholders::_1;
  auto same = [](const char* s) { return std::bind(Const, s, _1); };
  auto chain = [](std::string first, std::string sep) {
    return [=](int n) { return "{{ " + Chain(first, sep, n) + " }}"; };
  };
  return {
      {"plus", chain("1", " + "), [](int n) { return std::to_string(n); }},
      {"minus", chain("1", " - "), [](int n) { return std::to_string(2 - n); }},
      {"times", chain("1", " * "), same("1")},
      {"power", chain("1", " ** "), same("1")},
      {"modulo", chain("7", " % "), same("0")},
      {"concat", chain("'a'", " ~ "),
       [](int n) { return std::string(static_cast<size_t>(n), 'a'); }},
      {"and", chain("true", " and "), same("true")},
      {"or", chain("false", " or "), same("false")},
      {"equals", chain("1", " == "), same("true")},  // (1 == 1) == 1, and so on
      {"test", [](int n) { return "{{ 1" + Repeat(" is defined", n - 1) + " }}"; }, same("true")},
      {"filter", [](int n) { return "{{ ' x '" + Repeat("|trim", n - 1) + " }}"; }, same("x")},
      {"attribute", [](int n) { return "{{ a" + Repeat(".b", n - 1) + " }}"; }, same("")},
      {"index", [](int n) { return "{{ 'a'" + Repeat("[0]", n - 1) + " }}"; }, same("a")},
      {"slice", [](int n) { return "{{ 'ab'" + Repeat("[:]", n - 1) + " }}"; }, same("ab")},
      {"method call", [](int n) { return "{{ 'a'" + Repeat(".upper()", n - 1) + " }}"; }, same("A"),
       kExpressionsTooDeep, 2},
      {"not", [](int n) { return "{{ " + Repeat("not ", n - 1) + "true }}"; },
       [](int n) { return n % 2 == 1 ? "true" : "false"; }},
      {"negate", [](int n) { return "{{ " + Repeat("- ", n - 1) + "1 }}"; },
       [](int n) { return n % 2 == 1 ? "1" : "-1"; }},
      {"parentheses",
       [](int n) { return "{{ " + Repeat("(", n - 1) + "1" + Repeat(")", n - 1) + " }}"; },
       same("1")},
      {"list", [](int n) { return "{{ " + Repeat("[", n - 1) + Repeat("]", n - 1) + " }}"; },
       [](int n) { return Repeat("[", n - 1) + Repeat("]", n - 1); }},
      {"dict",
       [](int n) { return "{{ " + Repeat("{'a': ", n - 1) + "1" + Repeat("}", n - 1) + " }}"; },
       [](int n) { return Repeat("{\"a\": ", n - 1) + "1" + Repeat("}", n - 1); }},
      {"subscript",
       [](int n) { return "{{ " + Repeat("[0][", n - 1) + "0" + Repeat("]", n - 1) + " }}"; },
       same("0")},
      {"arguments",
       [](int n) { return "{{ " + Repeat("x|default(", n - 1) + "1" + Repeat(")", n - 1) + " }}"; },
       same("1")},
      {"ternary", [](int n) { return "{{ " + Repeat("1 if false else ", n - 1) + "2 }}"; },
       same("2")},
      {"if",
       [](int n) { return Repeat("{% if true %}", n - 1) + "x" + Repeat("{% endif %}", n - 1); },
       same("x"), kBlocksTooDeep},
      {"for",
       [](int n) {
         return Repeat("{% for i in 'a' %}", n - 1) + "x" + Repeat("{% endfor %}", n - 1);
       },
       same("x"), kBlocksTooDeep},
      {"elif",
       [](int n) {
         std::string s = "{% if false %}";
         for (int i = 1; i < n - 1; ++i) s += "{% elif false %}";
         return s + "{% else %}x{% endif %}";
       },
       same("x"), kBlocksTooDeep},
      {"set block",
       [](int n) {
         return Repeat("{% set s %}", n - 1) + "x" + Repeat("{% endset %}", n - 1) + "{{ s }}";
       },
       [](int n) { return n > 1 ? "" : "x"; }, kBlocksTooDeep},
      {"filter block",
       [](int n) {
         return Repeat("{% filter upper %}", n - 1) + "x" + Repeat("{% endfilter %}", n - 1);
       },
       same("X"), kBlocksTooDeep},
      {"macro",
       [](int n) {
         return Repeat("{% macro m() %}", n - 1) + "x" + Repeat("{% endmacro %}", n - 1) +
                "{{ m() }}";
       },
       [](int n) { return n > 1 ? "" : "x"; }, kBlocksTooDeep},
  };
}

// The largest n for which shape.source(n) parses: where the limit falls for this shape.
int DeepestAccepted(const Shape& shape) {
  for (int n = kMaxNestingDepth + 2; n > 1; --n) {
    if (Template::Parse(shape.source(n)).ok()) return n;
  }
  return 1;
}

TEST(JinjaLimits, LongChainsFailCleanly) {
  for (const Shape& shape : Shapes()) {
    for (const int n : kLengths) {
      SCOPED_TRACE(std::string(shape.name) + " x" + std::to_string(n));
      EXPECT_NE(ParseError(shape.source(n)).find(shape.error), std::string::npos);
    }
  }
}

// A dead branch is parsed all the same: the limit holds before anything runs. (10^4 only: the
// parse that fails is the one above, and lexing 10^5-long chains again costs half a minute in
// the ASan build.)
TEST(JinjaLimits, LongChainsFailInsideIfFalse) {
  for (const Shape& shape : Shapes()) {
    for (const int n : {10'000}) {
      SCOPED_TRACE(std::string(shape.name) + " x" + std::to_string(n));
      const std::string source = "{% if false %}" + shape.source(n) + "{% endif %}";
      EXPECT_NE(ParseError(source).find(shape.error), std::string::npos);
    }
  }
}

// Each shape nested as deep as the parser accepts renders what it should, and one level more
// is refused: the limit sits within a few levels of kMaxNestingDepth for every shape.
TEST(JinjaLimits, NestingJustBelowTheLimitRenders) {
  for (const Shape& shape : Shapes()) {
    SCOPED_TRACE(shape.name);
    const int n = DeepestAccepted(shape);
    EXPECT_GE(n * shape.levels_per_step, kMaxNestingDepth - 4);
    EXPECT_LE(n * shape.levels_per_step, kMaxNestingDepth + 2);
    auto out = Render(shape.source(n));
    ASSERT_TRUE(out.ok()) << out.message();
    EXPECT_EQ(*out, shape.rendered(n));
    EXPECT_NE(ParseError(shape.source(n + 1)).find(shape.error), std::string::npos);
  }
}

TEST(JinjaLimits, ErrorNamesTheTemplateAndLine) {
  auto t = ChatTemplate::FromSource("a\nb\n{{ " + Chain("1", "+", 10'000) + " }}", nullptr);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.message(), "chat template line 3: " + kExpressionsTooDeep);
}

// Nesting inside blocks counts: an expression that fits alone is refused deep inside blocks.
TEST(JinjaLimits, BlocksAndExpressionsCountTogether) {
  const int half = kMaxNestingDepth / 2;
  const std::string blocks_open = Repeat("{% if true %}", half);
  const std::string blocks_close = Repeat("{% endif %}", half);
  EXPECT_TRUE(Template::Parse("{{ " + Chain("1", "+", half) + " }}").ok());
  EXPECT_NE(ParseError(blocks_open + "{{ " + Chain("1", "+", half + 2) + " }}" + blocks_close)
                .find(kExpressionsTooDeep),
            std::string::npos);
}

// ---- data ----------------------------------------------------------------------------------

// "[[[...]]]" nested n levels (n >= 1).
std::string NestedListJson(int n) {
  return Repeat("[", n) + Repeat("]", n);
}

ordered_json MessagesWithContent(const std::string& content_json) {
  return ordered_json::parse(R"({"messages": [{"role": "user", "content": )" + content_json +
                             "}]}");
}

TEST(JinjaLimits, DeeplyNestedContextFailsCleanly) {
  for (const int n : kLengths) {
    SCOPED_TRACE(n);
    const ordered_json context = MessagesWithContent(NestedListJson(n));
    for (const char* source : {"{{ messages[0].content | tojson }}", "{{ messages[0].content }}",
                               "{{ messages[0].content | tojson(indent=2) }}", "plain text"}) {
      auto out = Render(source, context);
      ASSERT_FALSE(out.ok()) << source;
      EXPECT_EQ(out.message(), "template: \"messages\" " + kDataTooDeep) << source;
    }
  }
}

TEST(JinjaLimits, DeeplyNestedMessagesFailInTheChatTemplate) {
  auto t = ChatTemplate::FromSource("{{ messages[0].content | tojson }}", nullptr);
  ASSERT_TRUE(t.ok()) << t.message();
  for (const int n : kLengths) {
    ChatTemplateInputs in;
    in.messages = std::move(MessagesWithContent(NestedListJson(n))["messages"]);
    auto out = t->Render(in);
    ASSERT_FALSE(out.ok());
    EXPECT_EQ(out.message(), "\"messages\" " + kDataTooDeep);
    in.messages = ordered_json::array();
    in.tools = ordered_json::array();
    in.tools.push_back(ordered_json::parse(NestedListJson(n)));
    out = t->Render(in);
    ASSERT_FALSE(out.ok());
    EXPECT_EQ(out.message(), "\"tools\" " + kDataTooDeep);
  }
}

// Data at the limit still renders: "messages" is level 1, its message 2, the content 3.
TEST(JinjaLimits, ContextJustBelowTheLimitRenders) {
  const int content_levels = kMaxNestingDepth - 2;
  const ordered_json context = MessagesWithContent(NestedListJson(content_levels));
  auto out = Render("{{ messages[0].content | tojson }}", context);
  ASSERT_TRUE(out.ok()) << out.message();
  EXPECT_EQ(*out, NestedListJson(content_levels));
  EXPECT_EQ(Rendered("{{ messages[0].content }}", context), NestedListJson(content_levels));
  auto deeper = Render("{{ messages }}", MessagesWithContent(NestedListJson(content_levels + 1)));
  ASSERT_FALSE(deeper.ok());
  EXPECT_NE(deeper.message().find(kDataTooDeep), std::string::npos);
}

// A loop can build a value as deep as the step limit allows; printing it stops at the limit.
TEST(JinjaLimits, DeepValuesBuiltByTheTemplateFailToPrint) {
  for (const int n : kLengths) {
    SCOPED_TRACE(n);
    const std::string build = "{% set ns = namespace(l=[]) %}{% for i in range(" +
                              std::to_string(n) + ") %}{% set ns.l = [ns.l] %}{% endfor %}";
    for (const char* print : {"{{ ns.l | tojson }}", "{{ ns.l }}", "{{ ns.l | string }}"}) {
      auto out = Render(build + print);
      ASSERT_FALSE(out.ok()) << print;
      EXPECT_NE(out.message().find("value nested deeper than " + kLimit + " levels"),
                std::string::npos)
          << print << ": " << out.message();
    }
    EXPECT_EQ(Rendered(build + "{{ ns.l | length }}"), "1");
  }
}

// ---- nesting at run time -------------------------------------------------------------------

// Macro calls add the nesting of the macro's body to the caller's; the render stops at
// RenderLimits::max_depth, before the call limit, when each call nests deep enough.
TEST(JinjaLimits, MacroRecursionThroughDeepBodiesStops) {
  // f(calls - 1) recurses `calls` times, each call nesting a quarter of the limit more.
  auto recursion = [](int calls) {
    const int body = kMaxNestingDepth / 4;
    return "{% macro f(n) %}" + Repeat("{% if true %}", body) +
           "{% if n > 0 %}{{ f(n - 1) }}{% else %}done{% endif %}" + Repeat("{% endif %}", body) +
           "{% endmacro %}{{ f(" + std::to_string(calls - 1) + ") }}";
  };
  const RenderLimits defaults;
  ASSERT_LT(50, defaults.max_call_depth);
  auto out = Render(recursion(50));
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.message().find("the render nests deeper than " +
                               std::to_string(defaults.max_depth) + " levels"),
            std::string::npos)
      << out.message();
  EXPECT_EQ(Rendered(recursion(3)), "done");
}

// `map('map', 'map', ..., 'length')` applies filters from inside a filter, once per argument.
TEST(JinjaLimits, MapOfMapStops) {
  // Each level holds a copy of the arguments left, so this stays at a few times the limit (the
  // argument list is long, not deep; the value mapped over is what nests).
  for (const int n : {4 * kMaxNestingDepth}) {
    SCOPED_TRACE(n);
    const std::string build = "{% set ns = namespace(l=[]) %}{% for i in range(" +
                              std::to_string(n) + ") %}{% set ns.l = [ns.l] %}{% endfor %}";
    const std::string maps = "'map', " + Repeat("'map', ", n - 2) + "'length'";
    auto out = Render(build + "{{ ns.l | map(" + maps + ") | list | length }}");
    ASSERT_FALSE(out.ok());
    EXPECT_NE(out.message().find("the render nests deeper than"), std::string::npos)
        << out.message();
  }
  EXPECT_EQ(Rendered("{{ [[[1, 2]]] | map('map', 'length') | list }}"), "[[2]]");
}

// ---- stack ---------------------------------------------------------------------------------

// Runs `fn` on a thread whose stack is `stack_bytes` of fresh memory above a guard page, painted
// beforehand so that the deepest byte it touched can be found; returns that depth in bytes.
// (glibc keeps the thread's descriptor and static TLS at the top of a given stack, so the figure
// includes a few KiB of those.)
size_t PeakStackBytes(size_t stack_bytes, const std::function<void()>& fn) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  void* region =
      mmap(nullptr, stack_bytes + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (region == MAP_FAILED) return SIZE_MAX;
  mprotect(region, page, PROT_NONE);  // an overflow faults here instead of corrupting memory
  auto* stack = static_cast<unsigned char*>(region) + page;
  constexpr unsigned char kPaint = 0xA5;
  std::memset(stack, kPaint, stack_bytes);
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstack(&attr, stack, stack_bytes);
  pthread_t thread;
  auto run = [](void* f) -> void* {
    (*static_cast<const std::function<void()>*>(f))();
    return nullptr;
  };
  const bool started =
      pthread_create(&thread, &attr, run, const_cast<std::function<void()>*>(&fn)) == 0;
  pthread_attr_destroy(&attr);
  if (started) pthread_join(thread, nullptr);
  size_t untouched = 0;
  while (untouched < stack_bytes && stack[untouched] == kPaint) ++untouched;
  munmap(region, stack_bytes + page);
  return started ? stack_bytes - untouched : SIZE_MAX;
}

// What the comment on kMaxNestingDepth promises: everything at the limit (parsing, rendering,
// printing, failing one level past it, macro recursion up to RenderLimits::max_depth) fits a
// 1 MiB thread stack, also in the ASan build. The figures printed are the ones that comment
// quotes.
TEST(JinjaLimits, RenderAtTheLimitFitsOneMebibyteOfStack) {
  constexpr size_t kStack = size_t{1} << 20;
  std::vector<std::pair<std::string, std::function<void()>>> cases;
  const std::vector<Shape> shapes = Shapes();
  for (const Shape& shape : shapes) {
    const int n = DeepestAccepted(shape);
    cases.emplace_back(shape.name, [&shape, n] {
      EXPECT_TRUE(Render(shape.source(n)).ok());
      EXPECT_FALSE(Template::Parse(shape.source(n + 1)).ok());
    });
  }
  // Endless recursion stopped by max_depth: through shallow bodies (many calls, each with
  // frames of its own) and deep ones.
  for (const int body : {2, kMaxNestingDepth / 4, kMaxNestingDepth - 8}) {
    cases.emplace_back("macro recursion, body " + std::to_string(body), [body] {
      EXPECT_FALSE(Render("{% macro f() %}" + Repeat("{% if true %}", body) + "{{ f() }}" +
                          Repeat("{% endif %}", body) + "{% endmacro %}{{ f() }}")
                       .ok());
    });
  }
  cases.emplace_back("data", [] {
    const ordered_json context = MessagesWithContent(NestedListJson(kMaxNestingDepth - 2));
    EXPECT_TRUE(Render("{{ messages | tojson(indent=1) }}", context).ok());
  });
  size_t worst = 0;
  std::string worst_name;
  for (const auto& [name, fn] : cases) {
    const size_t peak = PeakStackBytes(kStack, fn);
    ASSERT_NE(peak, SIZE_MAX) << name << ": could not start a thread";
    EXPECT_LT(peak, kStack) << name;
    if (peak > worst) {
      worst = peak;
      worst_name = name;
    }
  }
  std::printf("[ stack ] deepest: %zu KiB (%s) of %zu KiB\n", worst >> 10, worst_name.c_str(),
              kStack >> 10);
}

}  // namespace
}  // namespace moetier::text::jinja
