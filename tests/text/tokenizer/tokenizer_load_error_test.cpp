// Broken tokenizer files give one line of error naming the file and the field — never a crash.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "text/tokenizer/test_tokenizers.h"

namespace moetier::text::testing {
namespace {

using nlohmann::json;

// The error for `tokenizer_json` (and optional config), which must fail.
std::string LoadError(const std::string& tokenizer_json, const std::string& config_json = "") {
  auto t = Tokenizer::FromJson(tokenizer_json, config_json, "models/x/tokenizer.json");
  EXPECT_FALSE(t.ok());
  if (t.ok()) return "";
  const std::string message = t.message();
  EXPECT_EQ(message.find('\n'), std::string::npos) << "not one line: " << message;
  return message;
}

json Minimal() {
  return {{"model",
           {{"type", "BPE"}, {"vocab", {{"a", 0}, {"b", 1}, {"ab", 2}}}, {"merges", {"a b"}}}}};
}

TEST(TokenizerLoadError, MinimalFileLoads) {
  auto t = Tokenizer::FromJson(Minimal().dump(), "", "x/tokenizer.json");
  ASSERT_TRUE(t.ok()) << t.message();
  EXPECT_EQ(t->Encode("ab", true), (std::vector<int32_t>{2}));
}

TEST(TokenizerLoadError, BadJsonSaysWhere) {
  const std::string m = LoadError("{\"model\": {\"type\": \"BPE\",, }");
  EXPECT_NE(m.find("models/x/tokenizer.json: bad JSON"), std::string::npos) << m;
  EXPECT_NE(m.find("line 1, column 26"), std::string::npos) << m;
  EXPECT_NE(LoadError("").find("bad JSON"), std::string::npos);
  EXPECT_NE(LoadError("{\"model\": \"\xFF\"}").find("bad JSON"), std::string::npos);
}

TEST(TokenizerLoadError, MissingModel) {
  const std::string m = LoadError(json{{"normalizer", nullptr}}.dump());
  EXPECT_EQ(m, "models/x/tokenizer.json: field `model`: missing");
  EXPECT_NE(LoadError("[1, 2]").find("expected a JSON object"), std::string::npos);
}

TEST(TokenizerLoadError, UnknownModelType) {
  json j = Minimal();
  j["model"]["type"] = "Unigram";
  const std::string m = LoadError(j.dump());
  EXPECT_EQ(m,
            "models/x/tokenizer.json: field `model.type`: unsupported model type \"Unigram\" "
            "(supported: BPE)");
}

TEST(TokenizerLoadError, VocabAndMerges) {
  json j = Minimal();
  j["model"].erase("vocab");
  EXPECT_NE(LoadError(j.dump()).find("field `model.vocab`: missing"), std::string::npos);
  j = Minimal();
  j["model"]["vocab"]["c"] = -3;
  EXPECT_NE(LoadError(j.dump()).find("field `model.vocab`"), std::string::npos);
  j = Minimal();
  j["model"]["merges"] = {"a b", "a c"};
  EXPECT_NE(LoadError(j.dump()).find("field `model.merges[1]`"), std::string::npos);
  j["model"]["merges"] = {"a b c"};
  EXPECT_NE(LoadError(j.dump()).find("field `model.merges[0]`"), std::string::npos);
  j["model"]["merges"] = json::array({json::array({"b", "a"})});  // "ba" is not in the vocab
  EXPECT_NE(LoadError(j.dump()).find("\"ba\" is not in the vocabulary"), std::string::npos);
  j = Minimal();
  j["model"]["unk_token"] = "<unk>";
  EXPECT_NE(LoadError(j.dump()).find("field `model.unk_token`"), std::string::npos);
  j = Minimal();
  j["model"]["dropout"] = 0.1;
  EXPECT_NE(LoadError(j.dump()).find("field `model.dropout`"), std::string::npos);
  j = Minimal();
  j["model"]["vocab"]["far"] = 2000000000;
  EXPECT_NE(LoadError(j.dump()).find("far from dense"), std::string::npos);
}

// An empty vocabulary would load and encode every text to nothing; added tokens do not make up
// for it (any other text would still vanish).
TEST(TokenizerLoadError, EmptyVocabulary) {
  json j = Minimal();
  j["model"]["vocab"] = json::object();
  j["model"]["merges"] = json::array();
  EXPECT_EQ(LoadError(j.dump()),
            "models/x/tokenizer.json: field `model.vocab`: is empty; a tokenizer needs at least "
            "one token");
  j["added_tokens"] = {{{"id", 0}, {"content", "<s>"}, {"special", true}}};
  EXPECT_NE(LoadError(j.dump()).find("field `model.vocab`: is empty"), std::string::npos);
  j["model"].erase("merges");
  EXPECT_NE(LoadError(j.dump()).find("field `model.vocab`: is empty"), std::string::npos);
}

TEST(TokenizerLoadError, BadRegexCarriesPcre2Message) {
  json j = Minimal();
  j["pre_tokenizer"] = {{"type", "Sequence"},
                        {"pretokenizers",
                         {{{"type", "Split"},
                           {"pattern", {{"Regex", "\\p{L}+|[a-"}}},
                           {"behavior", "Isolated"},
                           {"invert", false}}}}};
  const std::string m = LoadError(j.dump());
  EXPECT_NE(m.find("field `pre_tokenizer.pretokenizers[0].pattern.Regex`: bad regex at offset"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("missing terminating ] for character class"), std::string::npos) << m;
}

TEST(TokenizerLoadError, UnknownComponents) {
  for (const char* section : {"normalizer", "pre_tokenizer", "post_processor", "decoder"}) {
    json j = Minimal();
    j[section] = {{"type", "Bogus"}};
    const std::string m = LoadError(j.dump());
    EXPECT_NE(m.find(std::string("field `") + section + ".type`"), std::string::npos) << m;
    EXPECT_NE(m.find("\"Bogus\""), std::string::npos) << m;
  }
  json j = Minimal();
  j["decoder"] = {{"type", "Strip"}, {"content", "ab"}, {"start", 1}, {"stop", 0}};
  EXPECT_NE(LoadError(j.dump()).find("field `decoder.content`"), std::string::npos);
  j = Minimal();
  j["post_processor"] = {{"type", "TemplateProcessing"},
                         {"single", {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}}}},
                         {"special_tokens", json::object()}};
  EXPECT_NE(LoadError(j.dump()).find("has no entry for \"<s>\""), std::string::npos);
}

TEST(TokenizerLoadError, AddedTokens) {
  json j = Minimal();
  j["added_tokens"] = {{{"content", "<s>"}, {"special", true}}};
  EXPECT_NE(LoadError(j.dump()).find("field `added_tokens[0].id`"), std::string::npos);
  j["added_tokens"] = {{{"id", 5}, {"special", true}}};
  EXPECT_NE(LoadError(j.dump()).find("field `added_tokens[0].content`: missing"),
            std::string::npos);
}

TEST(TokenizerLoadError, ConfigErrorsNameTheConfigFile) {
  const std::string m = LoadError(Minimal().dump(), "{\"add_bos_token\": \"yes\"}");
  EXPECT_EQ(m, "models/x/tokenizer_config.json: field `add_bos_token`: expected true or false");
  EXPECT_NE(LoadError(Minimal().dump(), "{oops").find("models/x/tokenizer_config.json: bad JSON"),
            std::string::npos);
  EXPECT_NE(LoadError(Minimal().dump(), "{\"chat_template\": 3}").find("chat_template"),
            std::string::npos);
}

TEST(TokenizerLoadError, TooDeeplyNested) {
  std::string deep(5000, '[');
  deep += std::string(5000, ']');
  EXPECT_NE(LoadError(deep).find("nested deeper"), std::string::npos);
}

TEST(TokenizerLoadError, MissingDirectoryOrFile) {
  auto t = Tokenizer::Load("/nonexistent/model/dir");
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.message().find("/nonexistent/model/dir/tokenizer.json: not found"), std::string::npos)
      << t.message();
}

}  // namespace
}  // namespace moetier::text::testing
