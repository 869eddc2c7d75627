#define PCRE2_CODE_UNIT_WIDTH 8
#include "text/tokenizer/regex.h"

#include <pcre2.h>

#include <memory>
#include <utility>

#include "text/tokenizer/utf8.h"

namespace moetier::text {
namespace {

// The JIT stack PCRE2 uses by default is 32 KiB on the machine stack; patterns with nested
// repeats can need more on long inputs. On that error a match is retried once with this much.
constexpr size_t kLargeJitStackBytes = size_t{64} << 20;

struct MatchDataDeleter {
  void operator()(pcre2_match_data* md) const { pcre2_match_data_free(md); }
};
struct MatchContextDeleter {
  void operator()(pcre2_match_context* mc) const { pcre2_match_context_free(mc); }
};
struct JitStackDeleter {
  void operator()(pcre2_jit_stack* js) const { pcre2_jit_stack_free(js); }
};

}  // namespace

Expected<Regex> Regex::Compile(std::string_view pattern) {
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_UTF | PCRE2_UCP, &error_code, &error_offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error_code, message, sizeof(message));
    return Status::Error("bad regex at offset " + std::to_string(error_offset) + ": " +
                         reinterpret_cast<const char*>(message));
  }
  Regex regex(code);
  // JIT is an optimisation only: without it (unsupported CPU, no executable memory) the
  // interpreter gives the same matches.
  (void)pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  return regex;
}

Regex::Regex(Regex&& other) noexcept : code_(std::exchange(other.code_, nullptr)) {}

Regex& Regex::operator=(Regex&& other) noexcept {
  if (this != &other) {
    if (code_ != nullptr) pcre2_code_free(code_);
    code_ = std::exchange(other.code_, nullptr);
  }
  return *this;
}

Regex::~Regex() {
  if (code_ != nullptr) pcre2_code_free(code_);
}

void Regex::FindAll(std::string_view text, std::vector<std::pair<size_t, size_t>>& matches) const {
  if (code_ == nullptr) return;
  std::unique_ptr<pcre2_match_data, MatchDataDeleter> md(
      pcre2_match_data_create_from_pattern(code_, nullptr));
  if (!md) return;
  std::unique_ptr<pcre2_match_context, MatchContextDeleter> large_ctx;
  std::unique_ptr<pcre2_jit_stack, JitStackDeleter> large_stack;
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t offset = 0;
  while (offset <= text.size()) {
    int rc = pcre2_match(code_, subject, text.size(), offset, PCRE2_NO_UTF_CHECK, md.get(),
                         large_ctx.get());
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT && !large_ctx) {
      large_ctx.reset(pcre2_match_context_create(nullptr));
      large_stack.reset(pcre2_jit_stack_create(32 * 1024, kLargeJitStackBytes, nullptr));
      if (!large_ctx || !large_stack) return;
      pcre2_jit_stack_assign(large_ctx.get(), nullptr, large_stack.get());
      continue;
    }
    if (rc < 0) return;  // no match (or a resource limit): nothing more to report
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
    const size_t begin = ov[0];
    const size_t end = ov[1];
    if (end < begin) return;  // \K tricks can report these; no tokenizer pattern uses them
    matches.emplace_back(begin, end);
    if (end > begin) {
      offset = end;
    } else {
      if (end >= text.size()) break;
      offset = end + Utf8SequenceLength(static_cast<unsigned char>(text[end]));
    }
  }
}

}  // namespace moetier::text
