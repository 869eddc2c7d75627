// The two real tokenizers the tests run against, loaded once per test binary (loading the
// 151k-entry Qwen3 vocabulary takes a moment), plus small helpers.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "text/tokenizer/tokenizer.h"

namespace moetier::text::testing {

std::filesystem::path FixturesDir();
std::filesystem::path QwenDir();     // hf/realvocab/qwen3_moe_tiny: byte-level BPE, 151k
std::filesystem::path MixtralDir();  // hf/realvocab/mixtral_tiny: SentencePiece BPE, 32k

// Loaded on first use; the test fails (and aborts) if loading fails.
const Tokenizer& Qwen();
const Tokenizer& Mixtral();

std::string ReadFileOrDie(const std::filesystem::path& path);
// Splits on '\n' only; a final empty line after a trailing '\n' is not returned.
std::vector<std::string> SplitLines(const std::string& text);
std::string JoinIds(const std::vector<int32_t>& ids);
// Parses "1,2,3" (an empty line is no ids).
std::vector<int32_t> ParseIds(std::string_view line);

}  // namespace moetier::text::testing
