// The output parser: reasoning, content and tool calls in the Hermes, Llama 3 and DeepSeek-V3
// formats, as whole texts and as streams cut at every point; format detection from templates.
#include "server/output_parser.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "support/seed.h"

namespace moetier::server {
namespace {

using Kind = ChatEvent::Kind;

OutputParserOptions Options(ToolCallFormat format, bool tools = true, bool in_reasoning = false) {
  OutputParserOptions o;
  o.format = format;
  o.tools_enabled = tools;
  o.starts_in_reasoning = in_reasoning;
  return o;
}

// What a stream said, with adjacent text of a kind merged (so streams cut differently compare).
struct Answer {
  std::string content;
  std::string reasoning;
  std::vector<ToolCall> calls;    // from kToolCallEnd
  std::vector<std::string> args;  // kToolCallArgs fragments joined, per call
  std::string trace;              // the events in order, text merged: "C(..)R(..)B(..)A(..)E(..)"
  int tool_calls = 0;
};

Answer Summarize(const std::vector<ChatEvent>& events, int tool_calls) {
  Answer a;
  a.tool_calls = tool_calls;
  char last = 0;
  for (const ChatEvent& e : events) {
    char tag = 0;
    switch (e.kind) {
      case Kind::kContent:
        a.content += e.text;
        tag = 'C';
        break;
      case Kind::kReasoning:
        a.reasoning += e.text;
        tag = 'R';
        break;
      case Kind::kToolCallBegin:
        EXPECT_EQ(e.tool_index, static_cast<int>(a.args.size()));
        a.args.emplace_back();
        a.trace += "B(" + e.tool_call.name + ")";
        break;
      case Kind::kToolCallArgs:
        EXPECT_EQ(e.tool_index + 1, static_cast<int>(a.args.size())) << "args of the open call";
        a.args.back() += e.text;
        tag = 'A';
        break;
      case Kind::kToolCallEnd:
        EXPECT_EQ(e.tool_index + 1, static_cast<int>(a.args.size()));
        a.calls.push_back(e.tool_call);
        a.trace += "E(" + e.tool_call.arguments + ")";
        break;
      case Kind::kLogprobs:
      case Kind::kFinished:
        ADD_FAILURE() << "the parser gives only text and calls";
        break;
    }
    if (tag != 0) {
      if (tag != last) a.trace += std::string(1, tag) + ":";
      a.trace += e.text;
    }
    last = tag;
  }
  return a;
}

Answer Parse(const OutputParserOptions& options, const std::vector<std::string>& pieces,
             uint64_t seed = 7) {
  auto parser = MakeOutputParser(options, seed);
  std::vector<ChatEvent> events;
  for (const std::string& piece : pieces) {
    for (ChatEvent& e : parser->Feed(piece)) events.push_back(std::move(e));
  }
  for (ChatEvent& e : parser->Finish()) events.push_back(std::move(e));
  return Summarize(events, parser->tool_calls());
}

Answer ParseWhole(const OutputParserOptions& options, const std::string& text) {
  return Parse(options, {text});
}

std::vector<std::string> Bytes(const std::string& text) {
  std::vector<std::string> pieces;
  for (char c : text) pieces.emplace_back(1, c);
  return pieces;
}

bool IsValidUtf8(const std::string& s) {
  try {
    (void)nlohmann::json(s).dump();  // throws on invalid UTF-8
    return true;
  } catch (const nlohmann::json::type_error&) {
    return false;
  }
}

// ---- format detection ----------------------------------------------------------------------

TEST(DetectToolCallFormat, Qwen3FixtureTemplateIsHermes) {
  std::ifstream in(std::string(MOETIER_FIXTURES_DIR) +
                   "/hf/realvocab/qwen3_moe_tiny/tokenizer_config.json");
  ASSERT_TRUE(in.good());
  const auto config = nlohmann::json::parse(in);
  const std::string source = config.at("chat_template").get<std::string>();
  EXPECT_EQ(DetectToolCallFormat(source), ToolCallFormat::kHermes);
}

TEST(DetectToolCallFormat, SyntheticTemplates) {
  EXPECT_EQ(DetectToolCallFormat("{{ '<tool_call>\\n' + call | tojson + '\\n</tool_call>' }}"),
            ToolCallFormat::kHermes);
  EXPECT_EQ(DetectToolCallFormat("{%- if message.role == 'ipython' %}{{ '{\"name\": \"' + "
                                 "tc.name + '\", \"parameters\": ' + tc.arguments | tojson }}"),
            ToolCallFormat::kLlama3Json);
  EXPECT_EQ(DetectToolCallFormat("{{ '<|python_tag|>' + tool_call.name }}"),
            ToolCallFormat::kLlama3Json);
  EXPECT_EQ(DetectToolCallFormat("{{'<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + "
                                 "tool['type'] + '<｜tool▁sep｜>' + tool['function']['name']}}"),
            ToolCallFormat::kDeepSeekV3);
  // "parameters" alone (a tool schema printed into the prompt) is not Llama 3's call format.
  EXPECT_EQ(DetectToolCallFormat("{{ tool.parameters | tojson }} \"parameters\""),
            ToolCallFormat::kNone);
  EXPECT_EQ(DetectToolCallFormat("{% for m in messages %}{{ m.content }}{% endfor %}"),
            ToolCallFormat::kNone);
  EXPECT_EQ(ToolCallFormatName(ToolCallFormat::kHermes), "hermes");
  EXPECT_EQ(ToolCallFormatName(ToolCallFormat::kLlama3Json), "llama3_json");
  EXPECT_EQ(ToolCallFormatName(ToolCallFormat::kDeepSeekV3), "deepseek_v3");
  EXPECT_EQ(ToolCallFormatName(ToolCallFormat::kNone), "none");
}

// ---- reasoning -----------------------------------------------------------------------------

TEST(OutputParserReasoning, QwenLineBreaksAroundThinkAreMarkup) {
  const Answer a = ParseWhole(Options(ToolCallFormat::kHermes),
                              "<think>\nFirst, add.\n\nThen check.\n</think>\n\nIt is 4.\n");
  EXPECT_EQ(a.reasoning, "First, add.\n\nThen check.");
  EXPECT_EQ(a.content, "It is 4.\n");
  EXPECT_EQ(a.trace, "R:First, add.\n\nThen check.C:It is 4.\n");
}

TEST(OutputParserReasoning, CloseWithoutOpenEndsReasoningTheTemplateOpened) {
  const Answer a = ParseWhole(Options(ToolCallFormat::kNone, false, /*in_reasoning=*/true),
                              "\nstill <b>thinking</b>\n</think>\n\nAnswer.");
  EXPECT_EQ(a.reasoning, "still <b>thinking</b>");
  EXPECT_EQ(a.content, "Answer.");
}

TEST(OutputParserReasoning, EmptyThinkBlockGivesNoReasoning) {
  const Answer a = ParseWhole(Options(ToolCallFormat::kHermes), "<think>\n\n</think>\n\nHi");
  EXPECT_EQ(a.reasoning, "");
  EXPECT_EQ(a.trace, "C:Hi");
}

TEST(OutputParserReasoning, ThinkAfterTextAndStrayCloseAreText) {
  EXPECT_EQ(ParseWhole(Options(ToolCallFormat::kHermes), "Hi <think>x</think>").content,
            "Hi <think>x</think>");
  EXPECT_EQ(ParseWhole(Options(ToolCallFormat::kHermes), "a </think> b").content, "a </think> b");
  // A second think block after the first is text too.
  const Answer a = ParseWhole(Options(ToolCallFormat::kNone), "<think>x</think><think>y</think>");
  EXPECT_EQ(a.reasoning, "x");
  EXPECT_EQ(a.content, "<think>y</think>");
}

TEST(OutputParserReasoning, UnclosedReasoningAtFinishIsReasoning) {
  const Answer a = ParseWhole(Options(ToolCallFormat::kHermes), "<think>\nhalf a thought</thi");
  EXPECT_EQ(a.reasoning, "half a thought</thi");
  EXPECT_EQ(a.content, "");
}

TEST(OutputParserReasoning, ToolCallMarkupInsideReasoningIsReasoning) {
  const Answer a = ParseWhole(Options(ToolCallFormat::kHermes),
                              "<think>maybe <tool_call>{}</tool_call></think>no call");
  EXPECT_EQ(a.reasoning, "maybe <tool_call>{}</tool_call>");
  EXPECT_EQ(a.content, "no call");
  EXPECT_EQ(a.tool_calls, 0);
}

// ---- holding back --------------------------------------------------------------------------

TEST(OutputParserHoldBack, PartialTagsWaitUntilDecided) {
  auto parser = MakeOutputParser(Options(ToolCallFormat::kHermes), 1);
  auto events = parser->Feed("Hello <tool_");
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].text, "Hello");  // the space may be markup before a tag
  events = parser->Feed("box> and more <thi");
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].text, " <tool_box> and more <thi");  // <think> only opens at the start
  events = parser->Finish();
  EXPECT_TRUE(events.empty());
}

TEST(OutputParserHoldBack, MultiByteCharactersAreNeverSplit) {
  const std::string text =
      "<think>é—思考🙂</think>Grüße 🙂 <tool_call>\n{\"name\": \"f\", "
      "\"arguments\": {\"s\": \"€🙂é\"}}\n</tool_call>";
  const auto expected = ParseWhole(Options(ToolCallFormat::kHermes), text);
  EXPECT_EQ(expected.reasoning, "é—思考🙂");
  EXPECT_EQ(expected.content, "Grüße 🙂");
  auto parser = MakeOutputParser(Options(ToolCallFormat::kHermes), 1);
  for (const std::string& b : Bytes(text)) {
    for (const ChatEvent& e : parser->Feed(b)) {
      EXPECT_TRUE(IsValidUtf8(e.text)) << "event text cut inside a character: " << e.text;
    }
  }
}

// ---- Hermes / Qwen3 ------------------------------------------------------------------------

const std::string kTwoHermesCalls =
    "Let me check both.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
    "\"Paris\", \"days\": [1, 2]}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", "
    "\"arguments\": {\"tz\": \"CET\"}}\n</tool_call>";

TEST(OutputParserHermes, ContentThenTwoCalls) {
  const Answer a = ParseWhole(Options(ToolCallFormat::kHermes), kTwoHermesCalls);
  EXPECT_EQ(a.content, "Let me check both.");
  ASSERT_EQ(a.calls.size(), 2u);
  EXPECT_EQ(a.tool_calls, 2);
  EXPECT_EQ(a.calls[0].name, "get_weather");
  // Arguments as the model wrote them (streamed fragments and the end agree).
  EXPECT_EQ(a.calls[0].arguments, "{\"city\": \"Paris\", \"days\": [1, 2]}");
  EXPECT_EQ(a.args[0], a.calls[0].arguments);
  EXPECT_EQ(a.calls[1].name, "get_time");
  EXPECT_EQ(a.calls[1].arguments, "{\"tz\": \"CET\"}");
  EXPECT_NE(a.calls[0].id, a.calls[1].id);
}

TEST(OutputParserHermes, BeginAndArgumentsStreamBeforeTheClosingTag) {
  auto parser = MakeOutputParser(Options(ToolCallFormat::kHermes), 1);
  EXPECT_TRUE(parser->Feed("<tool_call>\n{\"name\": \"get_weather\"").empty())
      << "the call is announced with its arguments' start";
  auto events = parser->Feed(", \"arguments\": {\"city\": \"Par");
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].kind, Kind::kToolCallBegin);
  EXPECT_EQ(events[0].tool_call.name, "get_weather");
  EXPECT_EQ(events[0].tool_index, 0);
  const std::string id = events[0].tool_call.id;
  EXPECT_EQ(events[1].kind, Kind::kToolCallArgs);
  EXPECT_EQ(events[1].text, "{\"city\": \"Par");
  events = parser->Feed("is\", \"unit\": tr");  // a literal is held until complete
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].text, "is\"");
  events = parser->Feed("ue}}\n</tool_call>");
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].text, ", \"unit\": true}");
  EXPECT_EQ(events[1].kind, Kind::kToolCallEnd);
  EXPECT_EQ(events[1].tool_call.arguments, "{\"city\": \"Paris\", \"unit\": true}");
  EXPECT_EQ(events[1].tool_call.id, id);
  EXPECT_EQ(parser->tool_calls(), 1);
}

TEST(OutputParserHermes, MalformedCallsAreContentByteForByte) {
  for (const std::string body :
       {"not json at all", "{\"name\": 3, \"arguments\": {}}", "{\"arguments\": {}}",
        "{\"name\": \"f\", \"arguments\": [1]}", "{\"name\": \"\", \"arguments\": {}}",
        "{\"name\": \"f\" \"arguments\": {}}", "{\"name\": \"f\", \"arguments\": \"nope\"}"}) {
    const std::string text = "Hi <tool_call>\n" + body + "\n</tool_call> after";
    const Answer a = ParseWhole(Options(ToolCallFormat::kHermes), text);
    EXPECT_EQ(a.content, text) << body;
    EXPECT_EQ(a.tool_calls, 0) << body;
  }
}

TEST(OutputParserHermes, OtherLayoutsAreParsedWhole) {
  const Answer a =
      ParseWhole(Options(ToolCallFormat::kHermes),
                 "<tool_call>{\"arguments\": {\"b\": [1, 2.5]}, \"name\": \"first\"}</tool_call>"
                 "<tool_call>{\"name\": \"second\", \"arguments\": \"{\\\"x\\\": 1}\"}</tool_call>"
                 "<tool_call>{\"name\": \"third\"}</tool_call>");
  ASSERT_EQ(a.calls.size(), 3u);
  EXPECT_EQ(a.calls[0].name, "first");
  EXPECT_EQ(a.calls[0].arguments, "{\"b\":[1,2.5]}");  // re-serialized compactly
  EXPECT_EQ(a.calls[1].arguments, "{\"x\": 1}");       // the string's JSON, as written
  EXPECT_EQ(a.calls[2].arguments, "{}");
  for (int i = 0; i < 3; ++i) EXPECT_EQ(a.args[i], a.calls[i].arguments);
  EXPECT_EQ(a.content, "");
}

TEST(OutputParserHermes, CallCutShortAfterItsNameIsClosedValid) {
  const Answer a = ParseWhole(Options(ToolCallFormat::kHermes),
                              "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": [1, \"x\\n");
  ASSERT_EQ(a.calls.size(), 1u);
  EXPECT_EQ(a.calls[0].arguments, "{\"a\": [1, \"x\\n\"]}");
  EXPECT_TRUE(nlohmann::json::accept(a.calls[0].arguments));
  // Broken JSON after the call was announced: closed at its last valid point.
  const Answer b = ParseWhole(Options(ToolCallFormat::kHermes),
                              "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": 1, \"b\": tru}"
                              "</tool_call>then");
  ASSERT_EQ(b.calls.size(), 1u);
  EXPECT_EQ(b.calls[0].arguments, "{\"a\": 1}");
  EXPECT_EQ(b.content, "then");
}

TEST(OutputParserHermes, CallCutShortBeforeItsNameIsContent) {
  const Answer a = ParseWhole(Options(ToolCallFormat::kHermes), "Sure.\n<tool_call>\n{\"na");
  EXPECT_EQ(a.content, "Sure.\n<tool_call>\n{\"na");
  EXPECT_EQ(a.tool_calls, 0);
}

TEST(OutputParserHermes, WithoutToolsTheMarkupIsContent) {
  const Answer a = ParseWhole(Options(ToolCallFormat::kHermes, /*tools=*/false), kTwoHermesCalls);
  EXPECT_EQ(a.content, kTwoHermesCalls);
  EXPECT_EQ(a.tool_calls, 0);
}

TEST(OutputParserHermes, ReasoningThenCall) {
  const Answer a = ParseWhole(Options(ToolCallFormat::kHermes),
                              "<think>\nNeed weather.\n</think>\n\n<tool_call>\n{\"name\": \"w\", "
                              "\"arguments\": {}}\n</tool_call>");
  EXPECT_EQ(a.reasoning, "Need weather.");
  EXPECT_EQ(a.content, "");
  ASSERT_EQ(a.calls.size(), 1u);
  EXPECT_EQ(a.calls[0].arguments, "{}");
}

TEST(OutputParserIds, CallIdsComeFromTheSeed) {
  const Answer a = Parse(Options(ToolCallFormat::kHermes), {kTwoHermesCalls}, 42);
  const Answer b = Parse(Options(ToolCallFormat::kHermes), {kTwoHermesCalls}, 42);
  const Answer c = Parse(Options(ToolCallFormat::kHermes), {kTwoHermesCalls}, 43);
  ASSERT_EQ(a.calls.size(), 2u);
  for (const ToolCall& call : a.calls) {
    ASSERT_EQ(call.id.size(), 5u + 24u) << call.id;
    EXPECT_EQ(call.id.substr(0, 5), "call_");
    for (char ch : call.id.substr(5)) EXPECT_TRUE(std::isalnum(static_cast<unsigned char>(ch)));
  }
  EXPECT_EQ(a.calls[0].id, b.calls[0].id);
  EXPECT_NE(a.calls[0].id, c.calls[0].id);
}

// ---- Llama 3 -------------------------------------------------------------------------------

TEST(OutputParserLlama3, WholeAnswerCalls) {
  const Answer a = ParseWhole(Options(ToolCallFormat::kLlama3Json),
                              " {\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}");
  ASSERT_EQ(a.calls.size(), 1u);
  EXPECT_EQ(a.calls[0].name, "get_weather");
  EXPECT_EQ(a.calls[0].arguments, "{\"city\": \"Oslo\"}");
  EXPECT_EQ(a.content, "");

  const Answer b = ParseWhole(Options(ToolCallFormat::kLlama3Json),
                              "<|python_tag|>{\"name\": \"a\", \"parameters\": {}}; "
                              "{\"name\": \"b\", \"parameters\": {\"n\": 2}}");
  ASSERT_EQ(b.calls.size(), 2u);
  EXPECT_EQ(b.calls[1].name, "b");
  EXPECT_EQ(b.calls[1].arguments, "{\"n\": 2}");
  EXPECT_EQ(b.content, "");
}

TEST(OutputParserLlama3, TextAfterTheCallsIsContent) {
  const Answer a = ParseWhole(Options(ToolCallFormat::kLlama3Json),
                              "{\"name\": \"a\", \"parameters\": {}}\n\nDone.");
  ASSERT_EQ(a.calls.size(), 1u);
  EXPECT_EQ(a.content, "Done.");
}

TEST(OutputParserLlama3, OtherAnswersAreContent) {
  for (const std::string text :
       {"{\"answer\": 42}", "{\"name\": \"x\", \"age\": 3} and more", "Plain {\"name\": \"f\"}",
        "{not json", "<|python_tag|>brave_search.call(query=\"x\")"}) {
    const Answer a = ParseWhole(Options(ToolCallFormat::kLlama3Json), text);
    EXPECT_EQ(a.content, text) << text;
    EXPECT_EQ(a.tool_calls, 0) << text;
  }
  const std::string call = "{\"name\": \"a\", \"parameters\": {}}";
  EXPECT_EQ(ParseWhole(Options(ToolCallFormat::kLlama3Json, /*tools=*/false), call).content, call);
}

TEST(OutputParserLlama3, ReasoningThenCall) {
  const Answer a =
      ParseWhole(Options(ToolCallFormat::kLlama3Json),
                 "<think>hm</think>\n{\"name\": \"a\", \"parameters\": {\"k\": null}}");
  EXPECT_EQ(a.reasoning, "hm");
  ASSERT_EQ(a.calls.size(), 1u);
  EXPECT_EQ(a.calls[0].arguments, "{\"k\": null}");
}

// ---- DeepSeek-V3 ---------------------------------------------------------------------------

const std::string kDsCallsBegin = "<｜tool▁calls▁begin｜>";
const std::string kDsCallBegin = "<｜tool▁call▁begin｜>";
const std::string kDsSep = "<｜tool▁sep｜>";
const std::string kDsCallEnd = "<｜tool▁call▁end｜>";
const std::string kDsCallsEnd = "<｜tool▁calls▁end｜>";

std::string DeepSeekCall(const std::string& name, const std::string& args) {
  return kDsCallBegin + "function" + kDsSep + name + "\n```json\n" + args + "\n```" + kDsCallEnd;
}

const std::string kTwoDeepSeekCalls = "I'll look.\n" + kDsCallsBegin +
                                      DeepSeekCall("get_weather", "{\"city\": \"北京\"}") + "\n" +
                                      DeepSeekCall("get_time", "{}") + kDsCallsEnd;

TEST(OutputParserDeepSeek, ContentThenTwoCalls) {
  const Answer a = ParseWhole(Options(ToolCallFormat::kDeepSeekV3), kTwoDeepSeekCalls);
  EXPECT_EQ(a.content, "I'll look.");
  ASSERT_EQ(a.calls.size(), 2u);
  EXPECT_EQ(a.calls[0].name, "get_weather");
  EXPECT_EQ(a.calls[0].arguments, "{\"city\": \"北京\"}");
  EXPECT_EQ(a.calls[1].name, "get_time");
  EXPECT_EQ(a.calls[1].arguments, "{}");
  EXPECT_EQ(a.tool_calls, 2);
}

TEST(OutputParserDeepSeek, MalformedCallIsContent) {
  const std::string bad = kDsCallBegin + "function" + kDsSep + "f\nnot json" + kDsCallEnd;
  const Answer a =
      ParseWhole(Options(ToolCallFormat::kDeepSeekV3), kDsCallsBegin + bad + kDsCallsEnd);
  EXPECT_EQ(a.content, bad);
  EXPECT_EQ(a.tool_calls, 0);
}

TEST(OutputParserDeepSeek, WithoutToolsTheMarkupIsContent) {
  const Answer a = ParseWhole(Options(ToolCallFormat::kDeepSeekV3, false), kTwoDeepSeekCalls);
  EXPECT_EQ(a.content, kTwoDeepSeekCalls);
}

// ---- streams cut anywhere ------------------------------------------------------------------

struct StreamCase {
  OutputParserOptions options;
  std::string text;
};

std::vector<StreamCase> StreamCases() {
  return {
      {Options(ToolCallFormat::kHermes), kTwoHermesCalls},
      {Options(ToolCallFormat::kHermes),
       "<think>\nA 🙂 plan.\n</think>\n\nText <b>é</b>\n<tool_call>\n{\"name\": \"f\", "
       "\"arguments\": {\"s\": \"a\\\"<\\u00e9\\ud83d\\ude42\", \"n\": -1.5e3, \"l\": [true, "
       "null, {}]}}\n</tool_call>\n<tool_call>{\"arguments\": {}, \"name\": \"g\"}</tool_call>"},
      {Options(ToolCallFormat::kHermes),
       "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1, \"b\": tru}\n</tool_call>x"},
      {Options(ToolCallFormat::kHermes), "Hi <tool_call>\nbroken {\n</tool_call> <tool_cal"},
      {Options(ToolCallFormat::kNone, false, true), "\nmulling\n</think>\n\nok </think>"},
      {Options(ToolCallFormat::kLlama3Json),
       "\n<|python_tag|>{\"name\": \"a\", \"parameters\": {\"x\": [1, 2]}} ; {\"parameters\": "
       "{\"y\": \"é\"}, \"name\": \"b\"}\nthanks"},
      {Options(ToolCallFormat::kLlama3Json), "{\"name\": \"x\", \"age\": 3} is JSON"},
      {Options(ToolCallFormat::kDeepSeekV3), kTwoDeepSeekCalls + "\nDone."},
  };
}

TEST(OutputParserStream, EverySplitGivesTheSameAnswer) {
  for (const StreamCase& c : StreamCases()) {
    const Answer whole = ParseWhole(c.options, c.text);
    for (size_t cut = 0; cut <= c.text.size(); ++cut) {
      const Answer split = Parse(c.options, {c.text.substr(0, cut), c.text.substr(cut)});
      ASSERT_EQ(split.trace, whole.trace) << "cut at " << cut << " of: " << c.text;
    }
    EXPECT_EQ(Parse(c.options, Bytes(c.text)).trace, whole.trace) << c.text;
  }
}

TEST(OutputParserStream, RandomPiecesGiveTheSameAnswer) {
  std::mt19937 rng(testing::TestSeed());
  for (const StreamCase& c : StreamCases()) {
    const Answer whole = ParseWhole(c.options, c.text);
    for (int round = 0; round < 50; ++round) {
      std::vector<std::string> pieces;
      for (size_t at = 0; at < c.text.size();) {
        const size_t n = std::uniform_int_distribution<size_t>(1, 12)(rng);
        pieces.push_back(c.text.substr(at, n));
        at += n;
      }
      ASSERT_EQ(Parse(c.options, pieces).trace, whole.trace) << c.text;
    }
  }
}

TEST(OutputParserStream, FragmentsAddUpToTheArgumentsAndAreValidJson) {
  for (const StreamCase& c : StreamCases()) {
    const Answer a = Parse(c.options, Bytes(c.text));
    ASSERT_EQ(a.calls.size(), a.args.size()) << c.text;
    EXPECT_EQ(a.tool_calls, static_cast<int>(a.calls.size()));
    for (size_t i = 0; i < a.calls.size(); ++i) {
      EXPECT_EQ(a.args[i], a.calls[i].arguments.substr(0, a.args[i].size())) << c.text;
      const auto parsed = nlohmann::json::parse(a.calls[i].arguments, nullptr, false);
      EXPECT_TRUE(parsed.is_object()) << a.calls[i].arguments;
    }
  }
}

TEST(OutputParserStream, TextWithoutMarkupPassesUnchanged) {
  const std::string text = "Plain answer: 1 < 2, {braces} and ünïcödé 🙂  \n";
  for (ToolCallFormat f : {ToolCallFormat::kNone, ToolCallFormat::kHermes,
                           ToolCallFormat::kDeepSeekV3, ToolCallFormat::kLlama3Json}) {
    EXPECT_EQ(Parse(Options(f), Bytes(text)).content, text) << ToolCallFormatName(f);
  }
}

TEST(OutputParserStream, NothingAfterFinish) {
  auto parser = MakeOutputParser(Options(ToolCallFormat::kHermes), 1);
  EXPECT_FALSE(parser->Feed("abc").empty());
  parser->Finish();
  EXPECT_TRUE(parser->Feed("more").empty());
  EXPECT_TRUE(parser->Finish().empty());
}

}  // namespace
}  // namespace moetier::server
