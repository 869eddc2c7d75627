// Each pipeline component on small hand-built tokenizer.json files, against outputs worked out
// from Hugging Face's documented behaviour (tokenizers' own docs and tests).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <thread>

#include "text/tokenizer/byte_level.h"
#include "text/tokenizer/normalizer.h"
#include "text/tokenizer/pattern.h"
#include "text/tokenizer/pre_tokenizer.h"
#include "text/tokenizer/test_tokenizers.h"
#include "text/tokenizer/tokenizer.h"

namespace moetier::text::testing {
namespace {

using nlohmann::json;

std::vector<std::string> Cut(std::string_view text, const std::vector<Segment>& segments,
                             SplitBehavior behavior) {
  std::vector<std::pair<size_t, size_t>> pieces;
  ApplySplitBehavior(segments, behavior, pieces);
  std::vector<std::string> out;
  for (const auto& [b, e] : pieces) out.emplace_back(text.substr(b, e - b));
  return out;
}

using Strings = std::vector<std::string>;

// The example of tokenizers' SplitDelimiterBehavior documentation.
TEST(SplitBehaviorTest, MatchesTheDocumentedExample) {
  const std::string text = "the-final--countdown";
  std::vector<Segment> segments;
  Pattern::Literal("-").FindSegments(text, segments);
  EXPECT_EQ(Cut(text, segments, SplitBehavior::kRemoved), (Strings{"the", "final", "countdown"}));
  EXPECT_EQ(Cut(text, segments, SplitBehavior::kIsolated),
            (Strings{"the", "-", "final", "-", "-", "countdown"}));
  EXPECT_EQ(Cut(text, segments, SplitBehavior::kMergedWithPrevious),
            (Strings{"the-", "final-", "-", "countdown"}));
  EXPECT_EQ(Cut(text, segments, SplitBehavior::kMergedWithNext),
            (Strings{"the", "-final", "-", "-countdown"}));
  EXPECT_EQ(Cut(text, segments, SplitBehavior::kContiguous),
            (Strings{"the", "-", "final", "--", "countdown"}));
  std::vector<Segment> chars;
  FindCharSegments(
      text, [](char32_t c) { return c == '-'; }, chars);
  EXPECT_EQ(Cut(text, chars, SplitBehavior::kContiguous),
            (Strings{"the", "-", "final", "--", "countdown"}));
}

TEST(SplitBehaviorTest, EmptyRegexMatchesStillCut) {
  // Oniguruma reports an empty match at every position of "bcd" for a*, which cuts each char.
  auto pattern = Pattern::FromJson(json{{"Regex", "a*"}}, "p");
  ASSERT_TRUE(pattern.ok());
  std::vector<Segment> segments;
  pattern->FindSegments("bcd", segments);
  EXPECT_EQ(Cut("bcd", segments, SplitBehavior::kIsolated), (Strings{"b", "c", "d"}));
}

TEST(SplitBehaviorTest, UnknownBehaviorIsAnError) {
  auto b = ParseSplitBehavior(json("Sideways"), "pre_tokenizer.behavior");
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.message().find("pre_tokenizer.behavior"), std::string::npos);
}

std::string Normalize(const json& config, std::string_view text) {
  auto n = Normalizer::FromJson(config, "normalizer");
  EXPECT_TRUE(n.ok()) << n.message();
  return n.ok() ? n->Apply(text) : "";
}

TEST(NormalizerTest, UnicodeForms) {
  EXPECT_EQ(Normalize(json{{"type", "NFC"}}, "e\xCC\x81"), "\xC3\xA9");
  EXPECT_EQ(Normalize(json{{"type", "NFD"}}, "\xC3\xA9"), "e\xCC\x81");
  EXPECT_EQ(Normalize(json{{"type", "NFKC"}}, "\xEF\xAC\x81"), "fi");       // ﬁ
  EXPECT_EQ(Normalize(json{{"type", "NFKD"}}, "\xE2\x91\xA0"), "1");        // ①
  EXPECT_EQ(Normalize(json{{"type", "NFC"}}, "\xE2\x84\xAB"), "\xC3\x85");  // Å sign -> Å
  EXPECT_EQ(Normalize(json{{"type", "NFC"}}, "plain ascii"), "plain ascii");
}

TEST(NormalizerTest, LowercaseUsesFullMappingsWhereRustDoes) {
  const json lower = {{"type", "Lowercase"}};
  EXPECT_EQ(Normalize(lower, "HeLLo ÀÉ"), "hello àé");
  EXPECT_EQ(Normalize(lower, "\xC4\xB0"), "i\xCC\x87");  // İ -> i + U+0307
  // Σ is final sigma at the end of a word, σ elsewhere: ΟΔΟΣ ΣΑ -> οδος σα.
  EXPECT_EQ(Normalize(lower, "\xCE\x9F\xCE\x94\xCE\x9F\xCE\xA3 \xCE\xA3\xCE\x91"),
            "\xCE\xBF\xCE\xB4\xCE\xBF\xCF\x82 \xCF\x83\xCE\xB1");
}

TEST(NormalizerTest, PrependReplaceStripAndSequence) {
  const json llama = {
      {"type", "Sequence"},
      {"normalizers",
       {{{"type", "Prepend"}, {"prepend", "\xE2\x96\x81"}},
        {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\xE2\x96\x81"}}}}};
  EXPECT_EQ(Normalize(llama, "Hey friend"),
            "\xE2\x96\x81Hey\xE2\x96\x81"
            "friend");
  EXPECT_EQ(Normalize(llama, ""), "");  // Prepend leaves empty text alone
  EXPECT_EQ(Normalize({{"type", "Replace"}, {"pattern", {{"Regex", "[0-9]+"}}}, {"content", "#"}},
                      "a1b22c333"),
            "a#b#c#");
  EXPECT_EQ(Normalize({{"type", "Strip"}, {"strip_left", true}, {"strip_right", false}},
                      " \t\xE3\x80\x80x y "),
            "x y ");
  EXPECT_EQ(Normalize({{"type", "Strip"}, {"strip_left", true}, {"strip_right", true}}, "  x  "),
            "x");
}

TEST(NormalizerTest, UnknownTypeNamesThePath) {
  auto n = Normalizer::FromJson(
      {{"type", "Sequence"}, {"normalizers", {{{"type", "NFC"}}, {{"type", "Precompiled"}}}}},
      "normalizer");
  ASSERT_FALSE(n.ok());
  EXPECT_NE(n.message().find("normalizer.normalizers[1].type"), std::string::npos) << n.message();
  EXPECT_NE(n.message().find("Precompiled"), std::string::npos);
}

Strings PreTokenize(const json& config, std::string_view text, bool at_origin = true) {
  auto p = PreTokenizer::FromJson(config, "pre_tokenizer");
  EXPECT_TRUE(p.ok()) << p.message();
  if (!p.ok()) return {};
  PieceList words;
  words.text = std::string(text);
  words.pieces.push_back({0, static_cast<uint32_t>(text.size()), at_origin});
  p->Apply(words);
  Strings out;
  for (const auto& piece : words.pieces) out.emplace_back(words.View(piece));
  return out;
}

const std::string kMeta = "\xE2\x96\x81";

TEST(PreTokenizerTest, MetaspacePrependSchemes) {
  const json always = {{"type", "Metaspace"}, {"replacement", kMeta}, {"prepend_scheme", "always"}};
  EXPECT_EQ(PreTokenize(always, "Hey   friend!"),
            (Strings{kMeta + "Hey", kMeta, kMeta, kMeta + "friend!"}));
  EXPECT_EQ(PreTokenize(always, "Hey", /*at_origin=*/false), (Strings{kMeta + "Hey"}));
  json first = always;
  first["prepend_scheme"] = "first";
  EXPECT_EQ(PreTokenize(first, "Hey"), (Strings{kMeta + "Hey"}));
  EXPECT_EQ(PreTokenize(first, "Hey", /*at_origin=*/false), (Strings{"Hey"}));
  json never = always;
  never["prepend_scheme"] = "never";
  never["split"] = false;
  EXPECT_EQ(PreTokenize(never, "Hey you"), (Strings{"Hey" + kMeta + "you"}));
  // The older form: add_prefix_space without a scheme.
  EXPECT_EQ(
      PreTokenize({{"type", "Metaspace"}, {"replacement", kMeta}, {"add_prefix_space", false}},
                  "a b"),
      (Strings{"a", kMeta + "b"}));
}

TEST(PreTokenizerTest, DigitsWhitespaceAndSequence) {
  EXPECT_EQ(PreTokenize({{"type", "Digits"}, {"individual_digits", false}}, "Hey 123 friend!"),
            (Strings{"Hey ", "123", " friend!"}));
  EXPECT_EQ(PreTokenize({{"type", "Digits"}, {"individual_digits", true}}, "Hey 123"),
            (Strings{"Hey ", "1", "2", "3"}));
  EXPECT_EQ(PreTokenize({{"type", "Whitespace"}}, "Hey man!! How are you?"),
            (Strings{"Hey", "man", "!!", "How", "are", "you", "?"}));
  EXPECT_EQ(PreTokenize({{"type", "WhitespaceSplit"}}, " Hey  man!\tok "),
            (Strings{"Hey", "man!", "ok"}));
  EXPECT_EQ(
      PreTokenize(
          {{"type", "Sequence"},
           {"pretokenizers",
            {{{"type", "WhitespaceSplit"}}, {{"type", "Digits"}, {"individual_digits", true}}}}},
          "ab12 c3"),
      (Strings{"ab", "1", "2", "c", "3"}));
}

TEST(PreTokenizerTest, ByteLevelSpellsBytesAndSplitsLikeGpt2) {
  const ByteLevelAlphabet alphabet;
  EXPECT_EQ(alphabet.Encode(' '), "\xC4\xA0");   // Ġ
  EXPECT_EQ(alphabet.Encode('\n'), "\xC4\x8A");  // Ċ
  EXPECT_EQ(alphabet.Encode('A'), "A");
  EXPECT_EQ(alphabet.Decode(0x120), ' ');
  EXPECT_EQ(alphabet.Decode(0x4E2D), -1);
  const json gpt2 = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"use_regex", true}};
  EXPECT_EQ(PreTokenize(gpt2, "Hello  world's"),
            (Strings{"\xC4\xA0Hello", "\xC4\xA0", "\xC4\xA0world", "'s"}));
  const json no_regex = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}};
  EXPECT_EQ(PreTokenize(no_regex, "a b\xC3\xA9"), (Strings{"a\xC4\xA0"
                                                           "b\xC3\x83\xC2\xA9"}));
}

TEST(PreTokenizerTest, SplitInvertAndBadRegex) {
  const json keep_words = {{"type", "Split"},
                           {"pattern", {{"Regex", "\\p{L}+"}}},
                           {"behavior", "Removed"},
                           {"invert", true}};
  EXPECT_EQ(PreTokenize(keep_words, "héllo, wörld!"), (Strings{"héllo", "wörld"}));
  auto bad = PreTokenizer::FromJson(
      {{"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}},
      "pre_tokenizer");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("pre_tokenizer.pattern.Regex"), std::string::npos);
  EXPECT_NE(bad.message().find("missing closing parenthesis"), std::string::npos) << bad.message();
}

// A character-level BPE over `vocab` (ids in order) with `merges`, as a tokenizer.json text.
json TinyBpe(const Strings& vocab, const json& merges) {
  json v = json::object();
  for (size_t i = 0; i < vocab.size(); ++i) v[vocab[i]] = i;
  return {{"model", {{"type", "BPE"}, {"vocab", v}, {"merges", merges}}}};
}

Tokenizer Make(const json& tokenizer_json, const json& config = nullptr) {
  auto t = Tokenizer::FromJson(tokenizer_json.dump(), config.is_null() ? "" : config.dump(),
                               "test/tokenizer.json");
  EXPECT_TRUE(t.ok()) << t.message();
  if (!t.ok()) std::abort();
  return std::move(t).value();
}

using Ids = std::vector<int32_t>;

TEST(BpeModelTest, LowestRankFirstThenLeftmost) {
  // Ranks: "a b" (0) before "b c" (1): "abc" -> ab c. "aaa" with "a a": leftmost pair first.
  const Tokenizer t = Make(TinyBpe({"a", "b", "c", "ab", "bc", "aa"}, {"a b", "b c", "a a"}));
  EXPECT_EQ(t.Encode("abc", false), (Ids{3, 2}));
  EXPECT_EQ(t.Encode("bc", false), (Ids{4}));
  EXPECT_EQ(t.Encode("aaa", false), (Ids{5, 0}));
  // Merges given as pairs mean the same.
  const Tokenizer pairs = Make(TinyBpe(
      {"a", "b", "c", "ab", "bc", "aa"},
      json::array({json::array({"a", "b"}), json::array({"b", "c"}), json::array({"a", "a"})})));
  EXPECT_EQ(pairs.Encode("abcaaa", false), t.Encode("abcaaa", false));
}

TEST(BpeModelTest, UnknownCharactersFuseOrNot) {
  json j = TinyBpe({"<unk>", "a", "b"}, json::array());
  j["model"]["unk_token"] = "<unk>";
  EXPECT_EQ(Make(j).Encode("accb", false), (Ids{1, 0, 0, 2}));
  j["model"]["fuse_unk"] = true;
  EXPECT_EQ(Make(j).Encode("accb", false), (Ids{1, 0, 2}));
  j["model"].erase("unk_token");
  EXPECT_EQ(Make(j).Encode("accb", false), (Ids{1, 2}));  // no unk token: dropped, as in HF
}

TEST(BpeModelTest, ByteFallbackSpellsUnknownCharactersAsBytes) {
  Strings vocab = {"<unk>"};
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    vocab.push_back(name);
  }
  vocab.push_back("a");
  json j = TinyBpe(vocab, json::array());
  j["model"]["unk_token"] = "<unk>";
  j["model"]["byte_fallback"] = true;
  j["decoder"] = {{"type", "Sequence"},
                  {"decoders", {{{"type", "ByteFallback"}}, {{"type", "Fuse"}}}}};
  const Tokenizer t = Make(j);
  // é is C3 A9: ids 1 + byte.
  EXPECT_EQ(t.Encode("a\xC3\xA9", false), (Ids{257, 1 + 0xC3, 1 + 0xA9}));
  EXPECT_EQ(t.Decode(Ids{257, 1 + 0xC3, 1 + 0xA9}, false), "a\xC3\xA9");
  // An invalid run of byte tokens becomes one U+FFFD per token.
  EXPECT_EQ(t.Decode(Ids{1 + 0xC3, 257, 1 + 0xE4, 1 + 0xBD}, false),
            "\xEF\xBF\xBD"
            "a\xEF\xBF\xBD\xEF\xBF\xBD");
}

TEST(BpeModelTest, IgnoreMergesTakesWholeWordsFromTheVocabulary) {
  // "abc" is in the vocabulary but no merge path reaches it.
  json j = TinyBpe({"a", "b", "c", "ab", "abc"}, {"a b"});
  EXPECT_EQ(Make(j).Encode("abc", false), (Ids{3, 2}));
  j["model"]["ignore_merges"] = true;
  EXPECT_EQ(Make(j).Encode("abc", false), (Ids{4}));
}

TEST(BpeModelTest, ContinuingSubwordPrefixAndSuffix) {
  json j = TinyBpe({"a", "##b", "a##b", "ab", "c</w>", "ac</w>"}, {"a ##b", "a c</w>"});
  j["model"]["continuing_subword_prefix"] = "##";
  EXPECT_EQ(Make(j).Encode("ab", false), (Ids{3}));  // a + ##b -> "ab" (prefix dropped)
  json k = TinyBpe({"a", "c</w>", "ac</w>"}, {"a c</w>"});
  k["model"]["end_of_word_suffix"] = "</w>";
  EXPECT_EQ(Make(k).Encode("ac", false), (Ids{2}));
}

json WithAdded(json j, const std::vector<json>& added) {
  j["added_tokens"] = added;
  return j;
}

json Added(int id, const std::string& content, bool special, bool lstrip = false,
           bool rstrip = false, bool single_word = false, bool normalized = false) {
  return {{"id", id},
          {"content", content},
          {"special", special},
          {"lstrip", lstrip},
          {"rstrip", rstrip},
          {"single_word", single_word},
          {"normalized", normalized}};
}

TEST(AddedTokensTest, LeftmostLongestAndNeverSplit) {
  const json base = TinyBpe({"a", "b", " ", "<", ">", "x"}, json::array());
  const Tokenizer t = Make(
      WithAdded(base, {Added(10, "<x>", true), Added(11, "<x>>", false), Added(12, "x>", false)}));
  EXPECT_EQ(t.Encode("a<x>>b", false), (Ids{0, 11, 1}));
  EXPECT_EQ(t.Encode("a<x>b", false), (Ids{0, 10, 1}));
  EXPECT_EQ(t.Encode("x>", false), (Ids{12}));
  EXPECT_TRUE(t.IsSpecial(10));
  EXPECT_FALSE(t.IsSpecial(11));
  EXPECT_EQ(t.Decode(Ids{0, 10, 11, 1}, true), "a <x>> b");  // no decoder: joined by spaces
  EXPECT_EQ(t.TokenToId("<x>"), 10);
  EXPECT_EQ(t.vocab_size(), 13);
}

TEST(AddedTokensTest, LstripRstripAndSingleWord) {
  const json base = TinyBpe({"a", "b", " ", "T"}, json::array());
  const Tokenizer strip = Make(WithAdded(base, {Added(10, "T", true, true, true)}));
  EXPECT_EQ(strip.Encode("a  T  b", false), (Ids{0, 10, 1}));  // the spaces go with the token
  const Tokenizer word = Make(WithAdded(base, {Added(10, "ab", false, false, false, true)}));
  EXPECT_EQ(word.Encode("ab a ab", false), (Ids{10, 2, 0, 2, 10}));
  EXPECT_EQ(word.Encode("aab", false), (Ids{0, 0, 1}));  // inside a word: not matched
}

TEST(AddedTokensTest, NormalizedTokensMatchAfterNormalization) {
  json j = TinyBpe({"h", "i", " ", "x"}, json::array());
  j["normalizer"] = {{"type", "Lowercase"}};
  const Tokenizer t = Make(WithAdded(j, {Added(10, "HI", false, false, false, false, true),
                                         Added(11, "X", true, false, false, false, false)}));
  EXPECT_EQ(t.Encode("Hi hI X x", false), (Ids{10, 2, 10, 2, 11, 2, 3}));
}

TEST(PostProcessorTest, TemplateRobertaAndConfigOverride) {
  json j = TinyBpe({"<s>", "</s>", "a"}, json::array());
  j["added_tokens"] = json::array({Added(0, "<s>", true), Added(1, "</s>", true)});
  j["post_processor"] = {{"type", "TemplateProcessing"},
                         {"single",
                          {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                           {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
                           {{"SpecialToken", {{"id", "</s>"}, {"type_id", 0}}}}}},
                         {"pair", json::array()},
                         {"special_tokens",
                          {{"<s>", {{"id", "<s>"}, {"ids", {0}}, {"tokens", {"<s>"}}}},
                           {"</s>", {{"id", "</s>"}, {"ids", {1}}, {"tokens", {"</s>"}}}}}}};
  EXPECT_EQ(Make(j).Encode("a", true), (Ids{0, 2, 1}));
  EXPECT_EQ(Make(j).Encode("a", false), (Ids{2}));
  // transformers rebuilds the template from add_bos_token / add_eos_token when either is set.
  const json config = {{"bos_token", "<s>"},
                       {"eos_token", "</s>"},
                       {"add_bos_token", false},
                       {"add_eos_token", true}};
  EXPECT_EQ(Make(j, config).Encode("a", true), (Ids{2, 1}));
  EXPECT_EQ(Make(j, {{"bos_token", "<s>"}}).Encode("a", true), (Ids{0, 2, 1}));
  j["post_processor"] = {{"type", "RobertaProcessing"}, {"sep", {"</s>", 1}}, {"cls", {"<s>", 0}}};
  EXPECT_EQ(Make(j).Encode("aa", true), (Ids{0, 2, 2, 1}));
}

TEST(DecoderTest, MetaspaceStripReplaceAndByteLevel) {
  json j = TinyBpe({kMeta + "Hey", kMeta + "friend", kMeta, kMeta + kMeta, "!"}, json::array());
  j["decoder"] = {{"type", "Metaspace"}, {"replacement", kMeta}, {"prepend_scheme", "always"}};
  const Tokenizer m = Make(j);
  EXPECT_EQ(m.Decode(Ids{0, 1, 4}, false), "Hey friend!");
  EXPECT_EQ(m.Decode(Ids{3, 0}, false), " Hey");  // every '▁' of the first token goes, as in HF
  j["decoder"]["prepend_scheme"] = "never";
  EXPECT_EQ(Make(j).Decode(Ids{0, 1}, false), " Hey friend");
  j["decoder"] = {{"type", "Sequence"},
                  {"decoders",
                   {{{"type", "Replace"}, {"pattern", {{"String", kMeta}}}, {"content", " "}},
                    {{"type", "Fuse"}},
                    {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 1}}}}};
  EXPECT_EQ(Make(j).Decode(Ids{0, 1, 2}, false), "Hey friend");
  json b = TinyBpe({"\xC4\xA0hi", "\xC3\xA4", "<|x|>"}, json::array());
  b["decoder"] = {{"type", "ByteLevel"}};
  b["added_tokens"] = json::array({Added(2, "<|x|>", true)});
  const Tokenizer bl = Make(b);
  EXPECT_EQ(bl.Decode(Ids{0, 2}, false), " hi<|x|>");
  EXPECT_EQ(bl.Decode(Ids{0, 2}, true), " hi");
  EXPECT_EQ(bl.Decode(Ids{1}, false), "\xEF\xBF\xBD");  // byte E4 alone is lossy-decoded
  EXPECT_EQ(bl.Decode(Ids{0, 99, -5}, false), " hi");   // unknown ids are skipped
}

TEST(ConfigTest, ChatTemplateFormsAndNamedTokens) {
  const json j = WithAdded(TinyBpe({"a", "<e>"}, json::array()), {Added(1, "<e>", true)});
  const json list_form = {{"chat_template",
                           {{{"name", "default"}, {"template", "{{ x }}"}},
                            {{"name", "tool_use"}, {"template", "{{ y }}"}}}},
                          {"eos_token", {{"content", "<e>"}, {"__type", "AddedToken"}}}};
  const Tokenizer t = Make(j, list_form);
  EXPECT_EQ(t.config().chat_template, "{{ x }}");
  EXPECT_TRUE(json::parse(t.config().chat_template_json).is_array());
  EXPECT_EQ(t.config().eos_token, "<e>");
  EXPECT_EQ(t.config().eos_token_id, 1);
  // A named special token that is in the vocabulary but not an added token becomes one.
  const Tokenizer named =
      Make(TinyBpe({"a", "<e>", "<", "e", ">"}, json::array()), {{"eos_token", "<e>"}});
  EXPECT_EQ(named.Encode("a<e>", false), (Ids{0, 1}));
  EXPECT_TRUE(named.IsSpecial(1));
}

TEST(ConfigTest, LoadReadsChatTemplateJinjaBesideTheConfig) {
  const auto dir = std::filesystem::temp_directory_path() / "moetier_tokenizer_jinja_test";
  std::filesystem::create_directories(dir);
  {
    std::ofstream(dir / "tokenizer.json") << TinyBpe({"a"}, json::array()).dump();
    std::ofstream(dir / "tokenizer_config.json") << json{{"eos_token", "a"}}.dump();
    std::ofstream(dir / "chat_template.jinja") << "{% for m in messages %}{{ m }}{% endfor %}";
  }
  auto t = Tokenizer::Load(dir);
  ASSERT_TRUE(t.ok()) << t.message();
  EXPECT_EQ(t->config().chat_template, "{% for m in messages %}{{ m }}{% endfor %}");
  EXPECT_EQ(json::parse(t->config().chat_template_json), t->config().chat_template);
  std::filesystem::remove_all(dir);
}

TEST(TokenizerTest, ConcurrentEncodesAgreeWithSequentialOnes) {
  const auto lines = SplitLines(ReadFileOrDie(FixturesDir() / "text/tokenizer/corpus.txt"));
  std::vector<std::vector<int32_t>> expected;
  for (size_t i = 0; i < 400; ++i) expected.push_back(Qwen().Encode(lines[i], false));
  // A fresh copy shares the tables (and the word cache) but starts from the same state.
  const Tokenizer copy = Qwen();
  std::vector<int> failures(2, 0);
  std::vector<std::thread> threads;
  for (int w = 0; w < 2; ++w) {
    threads.emplace_back([&, w] {
      for (size_t i = w; i < 400; i += 1) {
        if (copy.Encode(lines[(i * 7 + w) % 400], false) != expected[(i * 7 + w) % 400]) {
          ++failures[w];
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures[0] + failures[1], 0);
}

}  // namespace
}  // namespace moetier::text::testing

namespace moetier::text::testing {
namespace {

TEST(TokenizerEdgeCases, EmptyNulAndLongInputs) {
  EXPECT_TRUE(Qwen().Encode("", false).empty());
  EXPECT_EQ(Mixtral().Encode("", true), (std::vector<int32_t>{1}));  // just BOS, as HF
  const std::string with_nul("a\0b", 3);
  EXPECT_EQ(Qwen().Decode(Qwen().Encode(with_nul, false), false), with_nul);
  EXPECT_EQ(Mixtral().Decode(Mixtral().Encode(with_nul, false), false), with_nul);
  // Megabyte-long runs: one regex match and one BPE word each; no JIT stack or time blow-up.
  for (const char c : {' ', 'a', '1', '\n'}) {
    const std::string text(1 << 20, c);
    EXPECT_EQ(Qwen().Decode(Qwen().Encode(text, false), false), text);
  }
  const std::string words(1 << 20, 'x');
  EXPECT_EQ(Mixtral().Decode(Mixtral().Encode(words, false), false), words);
}

}  // namespace
}  // namespace moetier::text::testing

namespace moetier::text::testing {
namespace {

// A GPT-2-style tokenizer (ByteLevel with its own regex as the only pre-tokenizer): the model
// spells the raw words itself, which must give what spelling them first would.
TEST(ByteLevelTokenizerTest, Gpt2StylePipelineEncodesAndDecodes) {
  const ByteLevelAlphabet alphabet;
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[std::string(alphabet.Encode(static_cast<uint8_t>(b)))] = b;
  vocab["\xC4\xA0w"] = 256;  // "Ġw"
  vocab["He"] = 257;
  const nlohmann::json j = {
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model",
       {{"type", "BPE"},
        {"vocab", vocab},
        {"merges", nlohmann::json::array({nlohmann::json::array({"\xC4\xA0", "w"}),
                                          nlohmann::json::array({"H", "e"})})}}}};
  auto t = Tokenizer::FromJson(j.dump(), "", "gpt2/tokenizer.json");
  ASSERT_TRUE(t.ok()) << t.message();
  EXPECT_EQ(t->Encode("Hello world", false),
            (std::vector<int32_t>{257, 'l', 'l', 'o', 256, 'o', 'r', 'l', 'd'}));
  for (int pass = 0; pass < 2; ++pass) {  // the second pass is served from the word cache
    EXPECT_EQ(t->Decode(t->Encode("Hello world \xC3\xA9\xF0\x9F\x8C\x8D\n\t x", false), false),
              "Hello world \xC3\xA9\xF0\x9F\x8C\x8D\n\t x");
  }
}

}  // namespace
}  // namespace moetier::text::testing
