// ParseBatchRequests: `moetier batch`'s JSONL requests. Every field reaches the request with its
// default when absent; every kind of bad line is one error naming the line and the field.
#include "cli/batch_requests.h"

#include <gtest/gtest.h>

#include <string>

namespace moetier::cli {
namespace {

std::vector<BatchRequest> Parse(const std::string& text) {
  auto r = ParseBatchRequests(text, "in.jsonl");
  EXPECT_TRUE(r.ok()) << r.message();
  return r.ok() ? *r : std::vector<BatchRequest>{};
}

std::string ErrorOf(const std::string& text) {
  auto r = ParseBatchRequests(text, "in.jsonl");
  EXPECT_FALSE(r.ok()) << text;
  return r.ok() ? "" : r.message();
}

TEST(BatchRequests, DefaultsWhenOnlyIdAndPromptAreGiven) {
  const auto rs = Parse(R"({"id": "a", "prompt": "Hello"})");
  ASSERT_EQ(rs.size(), 1u);
  const BatchRequest& r = rs[0];
  EXPECT_EQ(r.line, 1);
  EXPECT_EQ(r.id, "a");
  ASSERT_TRUE(r.prompt.has_value());
  EXPECT_EQ(*r.prompt, "Hello");
  EXPECT_TRUE(r.tokens.empty());
  EXPECT_FALSE(r.chat);
  EXPECT_EQ(r.max_new_tokens, 256);
  EXPECT_EQ(r.sampler.temperature, 0.0f);
  EXPECT_EQ(r.sampler.top_k, 0);
  EXPECT_EQ(r.sampler.top_p, 1.0f);
  EXPECT_EQ(r.sampler.min_p, 0.0f);
  EXPECT_EQ(r.sampler.repetition_penalty, 1.0f);
  EXPECT_FALSE(r.seed.has_value());
  EXPECT_TRUE(r.stop.empty());
  EXPECT_FALSE(r.ignore_eos);
  EXPECT_EQ(r.after, 0);
  EXPECT_EQ(r.logprobs, -1);
  EXPECT_FALSE(r.prompt_logprobs);
  EXPECT_TRUE(r.NeedsTokenizer());
}

TEST(BatchRequests, EveryFieldIsRead) {
  const auto rs = Parse(
      R"({"id": 7, "tokens": [3, 17, 42], "max_new_tokens": 9, "temperature": 0.7, "top_k": 40,)"
      R"( "top_p": 0.9, "min_p": 0.05, "repetition_penalty": 1.1, "seed": 18446744073709551615,)"
      R"( "stop": ["\n\n", "END"], "ignore_eos": true, "after": 12, "logprobs": 20,)"
      R"( "prompt_logprobs": true, "logit_bias": {"5": -100, "12": 2.5}})");
  ASSERT_EQ(rs.size(), 1u);
  const BatchRequest& r = rs[0];
  EXPECT_EQ(r.id, 7);
  EXPECT_FALSE(r.prompt.has_value());
  EXPECT_EQ(r.tokens, (std::vector<int32_t>{3, 17, 42}));
  EXPECT_EQ(r.max_new_tokens, 9);
  EXPECT_FLOAT_EQ(r.sampler.temperature, 0.7f);
  EXPECT_EQ(r.sampler.top_k, 40);
  EXPECT_FLOAT_EQ(r.sampler.top_p, 0.9f);
  EXPECT_FLOAT_EQ(r.sampler.min_p, 0.05f);
  EXPECT_FLOAT_EQ(r.sampler.repetition_penalty, 1.1f);
  ASSERT_TRUE(r.seed.has_value());
  EXPECT_EQ(*r.seed, 18446744073709551615ull);
  EXPECT_EQ(r.sampler.seed, 18446744073709551615ull);
  EXPECT_EQ(r.stop, (std::vector<std::string>{"\n\n", "END"}));
  EXPECT_TRUE(r.ignore_eos);
  EXPECT_EQ(r.after, 12);
  EXPECT_EQ(r.logprobs, 20);
  EXPECT_TRUE(r.prompt_logprobs);
  ASSERT_EQ(r.sampler.logit_bias.size(), 2u);
  EXPECT_EQ(r.sampler.logit_bias[0].id, 5);
  EXPECT_EQ(r.sampler.logit_bias[0].bias, -100.0f);
  EXPECT_EQ(r.sampler.logit_bias[1].id, 12);
  EXPECT_EQ(r.sampler.logit_bias[1].bias, 2.5f);
  EXPECT_TRUE(r.NeedsTokenizer());  // stop strings are text
}

TEST(BatchRequests, LinesKeepTheirNumbersAcrossBlankLinesCrlfAndABom) {
  const auto rs = Parse(
      "\xEF\xBB\xBF{\"id\": 1, \"tokens\": [1]}\r\n\r\n   \n{\"id\": \"1\", \"prompt\": \"x\", "
      "\"chat\": true, \"stop\": \"y\", \"seed\": -1}\n\t\n{\"id\": 1.5, \"tokens\": [2]}");
  ASSERT_EQ(rs.size(), 3u);
  EXPECT_EQ(rs[0].line, 1);
  EXPECT_FALSE(rs[0].NeedsTokenizer());
  EXPECT_EQ(rs[1].line, 4);
  EXPECT_EQ(rs[1].id, "1");  // the string "1" is not the number 1
  EXPECT_TRUE(rs[1].chat);
  EXPECT_EQ(rs[1].stop, (std::vector<std::string>{"y"}));
  EXPECT_FALSE(rs[1].seed.has_value());  // -1: random
  EXPECT_EQ(rs[2].line, 6);
}

TEST(BatchRequests, NullIsTheDefault) {
  const auto rs = Parse(
      R"({"id": 1, "tokens": [1], "temperature": null, "stop": null, "seed": null, "after": null})");
  ASSERT_EQ(rs.size(), 1u);
  EXPECT_EQ(rs[0].sampler.temperature, 0.0f);
  EXPECT_TRUE(rs[0].stop.empty());
  EXPECT_FALSE(rs[0].seed.has_value());
}

TEST(BatchRequests, BadLinesNameTheLineAndTheField) {
  struct Case {
    std::string line, want;
  };
  const std::string ok = "{\"id\": 0, \"tokens\": [1]}\n\n";  // the bad line is line 3
  const Case cases[] = {
      {"{\"id\": 1, \"tokens\": [1]", "in.jsonl:3: not valid JSON"},
      {"not json", "in.jsonl:3: not valid JSON"},
      {"[1, 2]", "in.jsonl:3: must be a JSON object"},
      {"\"text\"", "in.jsonl:3: must be a JSON object"},
      {R"({"tokens": [1]})", "in.jsonl:3: field 'id' is missing"},
      {R"({"id": null, "tokens": [1]})", "in.jsonl:3: field 'id' must be a string or a number"},
      {R"({"id": [1], "tokens": [1]})", "in.jsonl:3: field 'id' must be a string or a number"},
      {R"({"id": 0, "tokens": [2]})", "in.jsonl:3: field 'id': 0 is already the id of line 1"},
      {R"({"id": 0.0, "tokens": [2]})", "in.jsonl:3: field 'id': 0.0 is already the id of line 1"},
      {R"({"id": 1})", "in.jsonl:3: field 'prompt' (text) or 'tokens' (token ids) is missing"},
      {R"({"id": 1, "prompt": "a", "tokens": [1]})", "fields 'prompt' and 'tokens' are both"},
      {R"({"id": 1, "prompt": 5})", "in.jsonl:3: field 'prompt' must be a string, not 5"},
      {R"({"id": 1, "tokens": []})", "field 'tokens' must be a non-empty array"},
      {R"({"id": 1, "tokens": "1,2"})", "field 'tokens' must be a non-empty array"},
      {R"({"id": 1, "tokens": [1, -2]})", "field 'tokens' item 1 must be a token id"},
      {R"({"id": 1, "tokens": [1, 2.5]})", "field 'tokens' item 1 must be a token id"},
      {R"({"id": 1, "tokens": [2147483648]})", "field 'tokens' item 0 must be a token id"},
      {R"({"id": 1, "tokens": [1], "chat": true})", "field 'chat'"},
      {R"({"id": 1, "prompt": "a", "chat": 1})", "field 'chat' must be true or false, not 1"},
      {R"({"id": 1, "prompt": "a", "ignore_eos": "yes"})", "field 'ignore_eos' must be true"},
      {R"({"id": 1, "prompt": "a", "logprobs": 21})", "field 'logprobs' must be a whole number"},
      {R"({"id": 1, "prompt": "a", "logprobs": -1})", "field 'logprobs' must be a whole number"},
      {R"({"id": 1, "prompt": "a", "prompt_logprobs": true})",
       "in.jsonl:3: field 'prompt_logprobs' needs 'logprobs'"},
      {R"({"id": 1, "prompt": "a", "logprobs": 1, "prompt_logprobs": 1})",
       "field 'prompt_logprobs' must be true or false"},
      {R"({"id": 1, "prompt": "a", "logit_bias": [5]})", "field 'logit_bias' must be an object"},
      {R"({"id": 1, "prompt": "a", "logit_bias": {"x5": 1}})",
       "field 'logit_bias' key 'x5' must be a token id"},
      {R"({"id": 1, "prompt": "a", "logit_bias": {"5": 101}})",
       "field 'logit_bias' must be an object of token ids (as strings) to biases in [-100, 100]"},
      {R"({"id": 1, "prompt": "a", "temperature": -1})",
       "in.jsonl:3: field 'temperature' must be a number >= 0 (0: greedy), not -1"},
      {R"({"id": 1, "prompt": "a", "temperature": "hot"})", "field 'temperature' must be"},
      {R"({"id": 1, "prompt": "a", "temperature": 1e300})", "field 'temperature' must be"},
      {R"({"id": 1, "prompt": "a", "temperature": 1e999})",
       "in.jsonl:3: field 'temperature' must be a finite number"},
      {R"({"id": 1, "prompt": "a", "temperature": NaN})", "in.jsonl:3: not valid JSON"},
      {R"({"id": 1, "prompt": "a", "temperature": Infinity})", "in.jsonl:3: not valid JSON"},
      {R"({"id": 1, "prompt": "a", "top_k": -1})", "field 'top_k' must be a whole number"},
      {R"({"id": 1, "prompt": "a", "top_k": 1.5})", "field 'top_k' must be a whole number"},
      {R"({"id": 1, "prompt": "a", "top_p": 0})", "field 'top_p' must be a number in (0, 1]"},
      {R"({"id": 1, "prompt": "a", "top_p": 1.01})", "field 'top_p' must be a number in (0, 1]"},
      {R"({"id": 1, "prompt": "a", "min_p": -0.1})", "field 'min_p' must be a number in [0, 1]"},
      {R"({"id": 1, "prompt": "a", "repetition_penalty": 0})", "field 'repetition_penalty'"},
      {R"({"id": 1, "prompt": "a", "seed": -2})", "field 'seed' must be a whole number"},
      {R"({"id": 1, "prompt": "a", "seed": 1.5})", "field 'seed' must be a whole number"},
      {R"({"id": 1, "prompt": "a", "max_new_tokens": -1})", "field 'max_new_tokens' must be"},
      {R"({"id": 1, "prompt": "a", "max_new_tokens": 32.0})", "field 'max_new_tokens' must be"},
      {R"({"id": 1, "prompt": "a", "max_new_tokens": 9223372036854775808})",
       "field 'max_new_tokens' must be"},
      {R"({"id": 1, "prompt": "a", "after": -3})", "field 'after' must be a whole number >= 0"},
      {R"({"id": 1, "prompt": "a", "stop": ""})", "field 'stop' must be a non-empty string"},
      {R"({"id": 1, "prompt": "a", "stop": ["x", 3]})", "field 'stop' must be a non-empty"},
      {R"({"id": 1, "prompt": "a", "stop": {"s": 1}})", "field 'stop' must be a non-empty"},
      {R"({"id": 1, "prompt": "a", "temprature": 0.5})",
       "in.jsonl:3: unknown field 'temprature' (the fields are id, prompt, tokens,"},
      {R"({"id": 1, "prompt": "a", "prompt": "b"})", "in.jsonl:3: field 'prompt' is given twice"},
  };
  for (const Case& c : cases) {
    const std::string e = ErrorOf(ok + c.line + "\n{\"id\": 99, \"tokens\": [1]}\n");
    EXPECT_NE(e.find(c.want), std::string::npos) << c.line << "\n  got: " << e;
    EXPECT_EQ(e.find('\n'), std::string::npos) << e;
  }
}

TEST(BatchRequests, ErrorsStayOneShortPrintableLine) {
  // A key with control characters and a huge value are quoted escaped and cut short.
  const std::string huge(100000, 'x');
  std::string e = ErrorOf("{\"id\": 1, \"prompt\": \"a\", \"bad\\nkey\\u0000\": 1}");
  EXPECT_NE(e.find("unknown field 'bad\\nkey\\u0000'"), std::string::npos) << e;
  e = ErrorOf("{\"id\": 1, \"prompt\": \"a\", \"stop\": [\"" + huge + "\", 1]}");
  EXPECT_LT(e.size(), 400u) << e;
  // Raw control bytes and invalid UTF-8 in the line: the parser's message is made printable.
  e = ErrorOf(std::string("{\"id\": 1, \"prompt\": \"a\x01\xff\"}"));
  EXPECT_NE(e.find("in.jsonl:1: not valid JSON"), std::string::npos) << e;
  for (const char c : e) EXPECT_TRUE(c >= 0x20 && c < 0x7f) << e;
}

TEST(BatchRequests, AFileWithoutRequestsIsAnError) {
  EXPECT_NE(ErrorOf("").find("in.jsonl: no requests"), std::string::npos);
  EXPECT_NE(ErrorOf("\n  \n\r\n").find("in.jsonl: no requests"), std::string::npos);
}

TEST(BatchRequests, RequestWhereNamesTheLine) {
  const auto rs = Parse("\n\n{\"id\": \"x\", \"tokens\": [5]}");
  ASSERT_EQ(rs.size(), 1u);
  EXPECT_EQ(RequestWhere("in.jsonl", rs[0]), "in.jsonl:3");
}

}  // namespace
}  // namespace moetier::cli
