// A compiled PCRE2 pattern (UTF + UCP, JIT when the platform has it) used by Split
// pre-tokenizers and Replace normalizers/decoders in place of the Oniguruma engine that Hugging
// Face's Rust library uses. The tokenizer patterns in the wild (\p{L}, \p{N}, (?i:...),
// look-aheads such as \s+(?!\S)) mean the same in both, with one known difference: in UCP mode
// PCRE2's \s also matches U+180E MONGOLIAN VOWEL SEPARATOR, which is no longer White_Space.
//
// Ownership: move-only owner of the pcre2_code. Thread safety: const methods may run
// concurrently; each call makes its own match data.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/status.h"

struct pcre2_real_code_8;

namespace moetier::text {

class Regex {
 public:
  // Compiles `pattern`; a failure names PCRE2's message and the character offset.
  static Expected<Regex> Compile(std::string_view pattern);

  Regex(Regex&& other) noexcept;
  Regex& operator=(Regex&& other) noexcept;
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;
  ~Regex();

  // Appends (begin, end) byte offsets of every non-overlapping match from left to right, the
  // way Oniguruma's find_iter walks: after an empty match the search resumes one character
  // later. `text` must be valid UTF-8 (it is not re-checked, which keeps a scan linear). A match
  // that cannot finish within PCRE2's resource limits ends the scan early.
  void FindAll(std::string_view text, std::vector<std::pair<size_t, size_t>>& matches) const;

 private:
  explicit Regex(pcre2_real_code_8* code) : code_(code) {}
  pcre2_real_code_8* code_ = nullptr;
};

}  // namespace moetier::text
