// The safetensors header parser on its own: what it accepts and each way it refuses.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include "io/safetensors.h"
#include "support/test_support.h"

namespace moetier {
namespace {

std::string File(const std::string& header, const std::string& data, uint64_t len = UINT64_MAX) {
  const uint64_t n = len == UINT64_MAX ? header.size() : len;
  std::string f;
  for (int i = 0; i < 8; ++i) f.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  return f + header + data;
}

Expected<SafetensorsHeader> Parse(const std::string& f) {
  return ParseSafetensorsHeader(reinterpret_cast<const uint8_t*>(f.data()), f.size());
}

TEST(Safetensors, ParsesTensorsMetadataAndEmptyTensors) {
  auto h = Parse(File(R"({"__metadata__":{"format":"pt"},)"
                      R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]},)"
                      R"("a":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]},)"
                      R"("z":{"dtype":"F32","shape":[0],"data_offsets":[12,12]}})",
                      std::string(12, 'x')));
  ASSERT_TRUE(h.ok()) << h.message();
  ASSERT_EQ(h->tensors.size(), 3u);
  EXPECT_EQ(h->tensors[0].name, "a");  // sorted by offset
  EXPECT_EQ(h->tensors[1].shape, (std::vector<int64_t>{2}));
  EXPECT_EQ(h->metadata.at("format"), "pt");
}

TEST(Safetensors, RefusesEachMalformation) {
  const std::string ok_entry = R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
  struct Case {
    std::string file;
    const char* needle;
  };
  const Case cases[] = {
      {"", "shorter than the 8-byte"},
      {File(ok_entry, "xxxx", 1000), "runs past the end"},
      {File("[1,2]", ""), "not an object"},
      {File("{\"a\":", ""), "not valid JSON"},
      {File(R"({"a":{"shape":[1],"data_offsets":[0,4]}})", "xxxx"), "missing string 'dtype'"},
      {File(R"({"a":{"dtype":"F32","data_offsets":[0,4]}})", "xxxx"), "missing array 'shape'"},
      {File(R"({"a":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})", "xxxx"),
       "not a non-negative integer"},
      {File(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0]}})", "xxxx"),
       "'data_offsets' must be two"},
      {File(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}})", "xxxx"),
       "end 0 < begin 4"},
      {File(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", "xxxx"), "needs 8 bytes"},
      {File(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", "xxxx"), "truncated"},
      {File(R"({"a":{"dtype":"F64","shape":[4294967296,4294967296,16],"data_offsets":[0,0]}})", ""),
       "overflows"},
      {File(R"({"__metadata__":{"k":1}})", ""), "not a string"},
      {File(
           R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[2],"data_offsets":[3,5]}})",
           "xxxxx"),
       "overlap"},
  };
  for (const auto& c : cases) {
    auto h = Parse(c.file);
    ASSERT_FALSE(h.ok()) << c.needle;
    EXPECT_NE(h.message().find(c.needle), std::string::npos) << h.message();
  }
}

// The tensors must tile the data section: a hole, trailing bytes or a header length that is a
// few bytes short (the JSON still parses, padded with spaces, and every tensor would be read
// shifted) are each refused.
TEST(Safetensors, TensorsMustCoverTheDataExactly) {
  const std::string two = R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                          R"("b":{"dtype":"U8","shape":[2],"data_offsets":[6,8]}})";
  auto hole = Parse(File(two, "xxxxxxxx"));
  ASSERT_FALSE(hole.ok());
  EXPECT_NE(hole.message().find("data bytes 4..6 belong to no tensor"), std::string::npos)
      << hole.message();

  const std::string one = R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})";
  auto trailing = Parse(File(one, "xxxxyy"));
  ASSERT_FALSE(trailing.ok());
  EXPECT_NE(trailing.message().find("2 data bytes after the last tensor"), std::string::npos)
      << trailing.message();

  auto late_start = Parse(File(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}})", "xxxx"));
  ASSERT_FALSE(late_start.ok());
  EXPECT_NE(late_start.message().find("data bytes 0..2 belong to no tensor"), std::string::npos);

  // A real header is padded with spaces to 8 bytes; saying 3 bytes fewer still parses as JSON.
  const std::string padded = one + "        ";
  ASSERT_TRUE(Parse(File(padded, "xxxx")).ok());
  for (uint64_t shorter = 1; shorter <= 8; ++shorter) {
    auto shifted = Parse(File(padded, "xxxx", padded.size() - shorter));
    ASSERT_FALSE(shifted.ok()) << shorter;
    EXPECT_NE(shifted.message().find("after the last tensor"), std::string::npos)
        << shifted.message();
  }
}

// A FIFO (or any file that is not regular) is refused at once, not read: opening a FIFO for
// reading would wait forever for a writer.
TEST(Safetensors, RefusesAFifoWithoutBlocking) {
  testing::TempDir tmp;
  const auto path = tmp.path() / "model.safetensors";
  ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0);
  auto f = SafetensorsFile::Open(path);
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.message().find("not a regular file"), std::string::npos) << f.message();
  auto text = ReadTextFile(path);
  ASSERT_FALSE(text.ok());
  EXPECT_NE(text.message().find("not a regular file"), std::string::npos) << text.message();
  auto dir = ReadTextFile(tmp.path());
  ASSERT_FALSE(dir.ok());
  EXPECT_NE(dir.message().find("is a directory"), std::string::npos) << dir.message();
}

TEST(Safetensors, OpenNamesTheFile) {
  testing::TempDir tmp;
  const auto path = tmp.path() / "w.safetensors";
  testing::WriteFile(path, "12345");
  auto f = SafetensorsFile::Open(path);
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.message().rfind(path.string() + ": ", 0), 0u) << f.message();
  auto missing = SafetensorsFile::Open(tmp.path() / "nope.safetensors");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.message().find("nope.safetensors: cannot open"), std::string::npos);
}

TEST(Safetensors, ViewsPointIntoTheMap) {
  testing::TempDir tmp;
  const auto path = tmp.path() / "w.safetensors";
  const float vals[2] = {1.5f, -2.0f};
  testing::WriteSafetensors(
      path, {{"t", {"F32", {2}, std::string(reinterpret_cast<const char*>(vals), 8)}}});
  auto f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.message();
  const TensorView* v = f->Find("t");
  ASSERT_NE(v, nullptr);
  EXPECT_EQ(v->as<float>()[1], -2.0f);
  EXPECT_EQ(f->Find("u"), nullptr);
}

}  // namespace
}  // namespace moetier
