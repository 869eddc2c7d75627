#include "text/tokenizer/test_tokenizers.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>

namespace moetier::text::testing {
namespace {

Tokenizer LoadOrDie(const std::filesystem::path& dir) {
  auto t = Tokenizer::Load(dir);
  if (!t.ok()) {
    std::cerr << "cannot load test tokenizer: " << t.message() << "\n";
    std::abort();
  }
  return std::move(t).value();
}

}  // namespace

std::filesystem::path FixturesDir() {
  return MOETIER_FIXTURES_DIR;
}
std::filesystem::path QwenDir() {
  return FixturesDir() / "hf/realvocab/qwen3_moe_tiny";
}
std::filesystem::path MixtralDir() {
  return FixturesDir() / "hf/realvocab/mixtral_tiny";
}

const Tokenizer& Qwen() {
  static const Tokenizer tokenizer = LoadOrDie(QwenDir());
  return tokenizer;
}

const Tokenizer& Mixtral() {
  static const Tokenizer tokenizer = LoadOrDie(MixtralDir());
  return tokenizer;
}

std::string ReadFileOrDie(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::cerr << "cannot read " << path << "\n";
    std::abort();
  }
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<std::string> SplitLines(const std::string& text) {
  std::vector<std::string> lines;
  size_t start = 0;
  while (start < text.size()) {
    const size_t nl = text.find('\n', start);
    if (nl == std::string::npos) {
      lines.push_back(text.substr(start));
      break;
    }
    lines.push_back(text.substr(start, nl - start));
    start = nl + 1;
  }
  return lines;
}

std::string JoinIds(const std::vector<int32_t>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i > 0) s += ',';
    s += std::to_string(ids[i]);
  }
  return s;
}

std::vector<int32_t> ParseIds(std::string_view line) {
  std::vector<int32_t> ids;
  size_t pos = 0;
  while (pos < line.size()) {
    size_t comma = line.find(',', pos);
    if (comma == std::string_view::npos) comma = line.size();
    ids.push_back(static_cast<int32_t>(std::stol(std::string(line.substr(pos, comma - pos)))));
    pos = comma + 1;
  }
  return ids;
}

}  // namespace moetier::text::testing
