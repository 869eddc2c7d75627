// Renders the chat templates of real checkpoints (Qwen3, Llama 3, DeepSeek-V3, Gemma 3) for the
// conversations in tests/fixtures/text/template/conversations and compares byte for byte with
// @huggingface/jinja's renderings (expected/hf, made by tests/tools/template/render_expected.mjs),
// except the documented deviations, which must match Python Jinja2's (expected/jinja2).
#include "text/template/chat_template.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>

namespace moetier::text {
namespace {

namespace fs = std::filesystem;
using nlohmann::ordered_json;

const fs::path kFixtures = fs::path(MOETIER_FIXTURES_DIR);
const fs::path kTemplateFixtures = kFixtures / "text" / "template";

ordered_json ReadJson(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in) << "cannot open " << path;
  std::stringstream buf;
  buf << in.rdbuf();
  return ordered_json::parse(buf.str());
}

fs::path TemplateDir(const std::string& name) {
  if (name == "qwen3_moe_tiny") return kFixtures / "hf" / "realvocab" / "qwen3_moe_tiny";
  return kTemplateFixtures / name;
}

std::string Escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else {
      out.push_back(c);
    }
  }
  return out;
}

// Where two renderings first differ, with some context on each side, escaped onto one line.
std::string DescribeMismatch(const std::string& expected, const std::string& actual) {
  size_t i = 0;
  while (i < expected.size() && i < actual.size() && expected[i] == actual[i]) ++i;
  const size_t from = i > 60 ? i - 60 : 0;
  std::ostringstream out;
  out << "first difference at byte " << i << " (expected " << expected.size() << " bytes, got "
      << actual.size() << ")\n  expected: ..." << Escape(expected.substr(from, 120))
      << "\n  actual:   ..." << Escape(actual.substr(from, 120));
  return out.str();
}

ChatTemplateInputs InputsFor(const ordered_json& conversation, bool add_generation_prompt) {
  ChatTemplateInputs in;
  in.messages = conversation.at("messages");
  in.tools = conversation.value("tools", ordered_json());
  in.add_generation_prompt = add_generation_prompt;
  in.extra = conversation.value("extra", ordered_json());
  return in;
}

std::map<std::string, ordered_json> Conversations() {
  std::map<std::string, ordered_json> out;
  for (const auto& entry : fs::directory_iterator(kTemplateFixtures / "conversations")) {
    if (entry.path().extension() == ".json")
      out[entry.path().stem().string()] = ReadJson(entry.path());
  }
  return out;
}

std::set<std::pair<std::string, std::string>> Deviations() {
  std::set<std::pair<std::string, std::string>> out;
  const ordered_json doc = ReadJson(kTemplateFixtures / "deviations.json");
  for (const auto& c : doc.at("cases")) {
    for (const auto& t : c.at("templates")) {
      out.emplace(t.get<std::string>(), c.at("conversation").get<std::string>());
    }
  }
  return out;
}

class ChatTemplateFixtureTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ChatTemplateFixtureTest, MatchesReferenceRenderings) {
  const std::string name = GetParam();
  auto tmpl = ChatTemplate::Load(TemplateDir(name));
  ASSERT_TRUE(tmpl.ok()) << tmpl.message();
  const auto conversations = Conversations();
  const auto deviations = Deviations();
  const ordered_json hf = ReadJson(kTemplateFixtures / "expected" / "hf" / (name + ".json"));
  const ordered_json j2 = ReadJson(kTemplateFixtures / "expected" / "jinja2" / (name + ".json"));
  ASSERT_EQ(hf.at("cases").size(), j2.at("cases").size());
  ASSERT_EQ(hf.at("cases").size(), conversations.size() * 2) << "fixtures out of date: rerun "
                                                                "tests/tools/template scripts";
  int matched = 0;
  int raised = 0;
  int deviating = 0;
  for (size_t i = 0; i < hf.at("cases").size(); ++i) {
    const std::string conv = hf["cases"][i].at("conversation");
    const bool agp = hf["cases"][i].at("add_generation_prompt");
    const bool deviation = deviations.count({name, conv}) > 0;
    const ordered_json& expected = deviation ? j2["cases"][i] : hf["cases"][i];
    ASSERT_EQ(j2["cases"][i].at("conversation"), conv);
    SCOPED_TRACE(name + " × " + conv + " × add_generation_prompt=" + (agp ? "true" : "false") +
                 (deviation ? " (deviation: compared with Jinja2)" : ""));
    auto it = conversations.find(conv);
    ASSERT_NE(it, conversations.end()) << "no conversation " << conv;
    auto out = tmpl->Render(InputsFor(it->second, agp));
    if (expected.contains("rendered")) {
      const std::string want = expected["rendered"];
      if (!out.ok()) {
        ADD_FAILURE() << "render failed: " << out.message();
        continue;
      }
      if (*out != want) {
        ADD_FAILURE() << DescribeMismatch(want, *out);
        continue;
      }
    } else if (expected.at("raised").get<bool>()) {
      const std::string want = "chat template raised: " + expected["error"].get<std::string>();
      if (out.ok()) {
        ADD_FAILURE() << "rendered, but the reference raised: " << want;
        continue;
      }
      EXPECT_EQ(out.message(), want);
      if (out.message() != want) continue;
      ++raised;
    } else if (out.ok()) {
      // The reference renderer failed (a template bug for this input); so must we.
      ADD_FAILURE() << "rendered, but the reference failed with: " << expected["error"];
      continue;
    }
    ++matched;
    deviating += deviation ? 1 : 0;
  }
  std::printf("[ %s ] %d/%zu cases match (%d raise_exception, %d documented deviations)\n",
              name.c_str(), matched, hf["cases"].size(), raised, deviating);
}

INSTANTIATE_TEST_SUITE_P(Checkpoints, ChatTemplateFixtureTest,
                         ::testing::Values("qwen3", "llama3", "deepseek_v3", "gemma3",
                                           "qwen3_moe_tiny"));

// transformers itself rendered this one (tests/fixtures/hf/realvocab/qwen3_moe_tiny).
TEST(ChatTemplate, MatchesTransformersRenderingOfQwen3) {
  const fs::path dir = kFixtures / "hf" / "realvocab" / "qwen3_moe_tiny";
  const ordered_json chat = ReadJson(dir / "reference_text.json").at("chat");
  auto tmpl = ChatTemplate::Load(dir);
  ASSERT_TRUE(tmpl.ok()) << tmpl.message();
  ChatTemplateInputs in;
  in.messages = chat.at("messages");
  in.add_generation_prompt = chat.at("add_generation_prompt");
  auto out = tmpl->Render(in);
  ASSERT_TRUE(out.ok()) << out.message();
  EXPECT_EQ(*out, chat.at("rendered").get<std::string>());
}

TEST(ChatTemplate, ReadsAddedTokenObjects) {
  auto tmpl = ChatTemplate::Load(kTemplateFixtures / "deepseek_v3");
  ASSERT_TRUE(tmpl.ok()) << tmpl.message();
  EXPECT_EQ(tmpl->special_tokens().value("bos_token", ""), "<｜begin▁of▁sentence｜>");
  EXPECT_FALSE(tmpl->special_tokens().contains("unk_token"));  // null in the config
}

class TempDir {
 public:
  TempDir() {
    path_ = fs::temp_directory_path() /
            ("moetier_tpl_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) +
             "_" + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  const fs::path& path() const { return path_; }
  void Write(const std::string& name, const std::string& text) const {
    std::ofstream(path_ / name, std::ios::binary) << text;
  }

 private:
  fs::path path_;
};

TEST(ChatTemplate, JinjaFileTakesPrecedence) {
  TempDir dir;
  dir.Write("tokenizer_config.json",
            R"({"chat_template": "config", "eos_token": {"content": "</s>"}})");
  dir.Write("chat_template.jinja", "file {{ eos_token }}\n");
  auto tmpl = ChatTemplate::Load(dir.path());
  ASSERT_TRUE(tmpl.ok()) << tmpl.message();
  ChatTemplateInputs in;
  in.messages = ordered_json::array();
  auto out = tmpl->Render(in);
  ASSERT_TRUE(out.ok()) << out.message();
  EXPECT_EQ(*out, "file </s>");
}

TEST(ChatTemplate, NamedTemplatesPickToolUseWhenToolsAreGiven) {
  TempDir dir;
  dir.Write("tokenizer_config.json",
            R"({"chat_template": [{"name": "default", "template": "plain"},
                                  {"name": "tool_use", "template": "tools={{ tools|length }}"}]})");
  auto tmpl = ChatTemplate::Load(dir.path());
  ASSERT_TRUE(tmpl.ok()) << tmpl.message();
  ChatTemplateInputs in;
  in.messages = ordered_json::array();
  EXPECT_EQ(*tmpl->Render(in), "plain");
  in.tools = ordered_json::array({ordered_json::object()});
  EXPECT_EQ(*tmpl->Render(in), "tools=1");
}

TEST(ChatTemplate, ToolsAndDocumentsAreNoneWhenAbsent) {
  auto tmpl = ChatTemplate::FromSource(
      "{{ tools is none }} {{ documents is none }} {{ add_generation_prompt }} {{ bos_token }}",
      ordered_json{{"bos_token", "<s>"}, {"unk_token", nullptr}});
  ASSERT_TRUE(tmpl.ok()) << tmpl.message();
  ChatTemplateInputs in;
  in.messages = ordered_json::array();
  auto out = tmpl->Render(in);
  ASSERT_TRUE(out.ok()) << out.message();
  EXPECT_EQ(*out, "true true false <s>");
}

TEST(ChatTemplate, ExtraVariablesReachTheTemplate) {
  auto tmpl = ChatTemplate::FromSource("{{ enable_thinking }}", ordered_json::object());
  ASSERT_TRUE(tmpl.ok());
  ChatTemplateInputs in;
  in.messages = ordered_json::array();
  in.extra = ordered_json{{"enable_thinking", false}};
  EXPECT_EQ(*tmpl->Render(in), "false");
  in.extra = ordered_json{{"messages", 1}};
  EXPECT_FALSE(tmpl->Render(in).ok());
}

TEST(ChatTemplate, StrftimeNowUsesTheGivenTime) {
  auto tmpl = ChatTemplate::FromSource("{{ strftime_now('%d %b %Y') }}", ordered_json::object());
  ASSERT_TRUE(tmpl.ok());
  ChatTemplateInputs in;
  in.messages = ordered_json::array();
  std::tm now{};
  now.tm_year = 2024 - 1900;
  now.tm_mon = 6;
  now.tm_mday = 26;
  in.now = now;
  EXPECT_EQ(*tmpl->Render(in), "26 Jul 2024");
}

TEST(ChatTemplate, MissingTemplateNamesTheDirectory) {
  TempDir dir;
  dir.Write("tokenizer_config.json", R"({"eos_token": "</s>"})");
  auto tmpl = ChatTemplate::Load(dir.path());
  ASSERT_FALSE(tmpl.ok());
  EXPECT_NE(tmpl.message().find(dir.path().string()), std::string::npos) << tmpl.message();
  EXPECT_NE(tmpl.message().find("no chat template"), std::string::npos) << tmpl.message();
  auto missing = ChatTemplate::Load(dir.path() / "absent");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.message().find("not a directory"), std::string::npos) << missing.message();
}

TEST(ChatTemplate, SyntaxErrorNamesTheFileAndLine) {
  TempDir dir;
  dir.Write("chat_template.jinja", "ok\n{% for m in messages %}\n{{ m.content }}\n");
  auto tmpl = ChatTemplate::Load(dir.path());
  ASSERT_FALSE(tmpl.ok());
  EXPECT_EQ(tmpl.message(),
            (dir.path() / "chat_template.jinja").string() +
                ": chat template line 2: unclosed 'for' block (missing {% endfor %})");
}

TEST(ChatTemplate, BadConfigIsAnError) {
  TempDir dir;
  dir.Write("tokenizer_config.json", R"({"chat_template": 5})");
  EXPECT_FALSE(ChatTemplate::Load(dir.path()).ok());
  dir.Write("tokenizer_config.json", "{not json");
  auto bad = ChatTemplate::Load(dir.path());
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("not valid JSON"), std::string::npos) << bad.message();
}

TEST(ChatTemplate, MessagesMustBeAList) {
  auto tmpl = ChatTemplate::FromSource("x", ordered_json::object());
  ASSERT_TRUE(tmpl.ok());
  ChatTemplateInputs in;
  in.messages = ordered_json::object();
  auto out = tmpl->Render(in);
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.message().find("messages"), std::string::npos);
}

}  // namespace
}  // namespace moetier::text
