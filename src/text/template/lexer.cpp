#include "text/template/lexer.h"

#include <array>
#include <utility>

#include "text/template/utf8.h"

namespace moetier::text::jinja {
namespace {

// Text together with the source line of each byte: the whitespace rewriting below removes
// newlines, and errors must still name lines of the template as written.
struct LinedText {
  std::string text;
  std::vector<int> line;

  void Push(char c, int l) {
    text.push_back(c);
    line.push_back(l);
  }
  void PushRange(const LinedText& from, size_t begin, size_t end) {
    text.append(from.text, begin, end - begin);
    line.insert(line.end(), from.line.begin() + static_cast<std::ptrdiff_t>(begin),
                from.line.begin() + static_cast<std::ptrdiff_t>(end));
  }
};

LinedText WithLines(std::string_view source) {
  LinedText t;
  int l = 1;
  for (char c : source) {
    t.Push(c, l);
    if (c == '\n') ++l;
  }
  return t;
}

bool IsLineTerminatorEnd(const std::string& s, size_t i) {
  // JavaScript's `^` in multiline mode follows \n, \r, U+2028 and U+2029.
  if (i == 0) return true;
  const char p = s[i - 1];
  if (p == '\n' || p == '\r') return true;
  return i >= 3 && s[i - 3] == '\xE2' && s[i - 2] == '\x80' && (p == '\xA8' || p == '\xA9');
}

// lstrip_blocks: spaces and tabs from the start of a line up to `{%`, `{#` (or `{-`) go.
LinedText LstripBlocks(const LinedText& in) {
  LinedText out;
  const std::string& s = in.text;
  for (size_t i = 0; i < s.size();) {
    if (IsLineTerminatorEnd(s, i)) {
      size_t j = i;
      while (j < s.size() && (s[j] == ' ' || s[j] == '\t')) ++j;
      if (j > i && j + 1 < s.size() && s[j] == '{' &&
          (s[j + 1] == '#' || s[j + 1] == '%' || s[j + 1] == '-')) {
        i = j;
      }
    }
    out.Push(s[i], in.line[i]);
    ++i;
  }
  return out;
}

// trim_blocks: the first newline after `%}` or `#}` (or `-}`) goes.
LinedText TrimBlocks(const LinedText& in) {
  LinedText out;
  const std::string& s = in.text;
  for (size_t i = 0; i < s.size();) {
    if (i + 2 < s.size() && (s[i] == '#' || s[i] == '%' || s[i] == '-') && s[i + 1] == '}' &&
        s[i + 2] == '\n') {
      out.Push(s[i], in.line[i]);
      out.Push(s[i + 1], in.line[i + 1]);
      i += 3;
      continue;
    }
    out.Push(s[i], in.line[i]);
    ++i;
  }
  return out;
}

size_t SkipSpaces(const std::string& s, size_t i) {
  while (i < s.size()) {
    size_t next = i;
    if (!utf8::IsSpace(utf8::Next(s, &next))) break;
    i = next;
  }
  return i;
}

// Matches `{%-? (end)?generation -?%}` at i; returns the end and the two strip flags.
bool MatchGenerationTag(const std::string& s, size_t i, size_t* end, bool* lstrip, bool* rstrip) {
  if (s.compare(i, 2, "{%") != 0) return false;
  size_t j = i + 2;
  *lstrip = j < s.size() && s[j] == '-';
  if (*lstrip) ++j;
  j = SkipSpaces(s, j);
  if (s.compare(j, 3, "end") == 0 && s.compare(j + 3, 10, "generation") == 0) j += 3;
  if (s.compare(j, 10, "generation") != 0) return false;
  j = SkipSpaces(s, j + 10);
  *rstrip = j < s.size() && s[j] == '-';
  if (*rstrip) ++j;
  if (s.compare(j, 2, "%}") != 0) return false;
  *end = j + 2;
  return true;
}

// transformers' `{% generation %}` marks assistant text for its token mask; for rendering it is
// a no-op, so the tag goes, and with `-` the whitespace on that side goes too.
LinedText RemoveGenerationTags(const LinedText& in) {
  LinedText out;
  const std::string& s = in.text;
  size_t copied = 0;
  size_t ws_start = std::string::npos;
  for (size_t i = 0; i < s.size();) {
    size_t tag_end = 0;
    bool lstrip = false;
    bool rstrip = false;
    if (s[i] == '{' && MatchGenerationTag(s, i, &tag_end, &lstrip, &rstrip)) {
      const size_t before = ws_start == std::string::npos ? i : ws_start;
      out.PushRange(in, copied, before);
      if (!lstrip) out.PushRange(in, before, i);
      const size_t after = SkipSpaces(s, tag_end);
      if (!rstrip) out.PushRange(in, tag_end, after);
      copied = i = after;
      ws_start = std::string::npos;
      continue;
    }
    size_t next = i;
    const bool space = utf8::IsSpace(utf8::Next(s, &next));
    if (!space) {
      ws_start = std::string::npos;
    } else if (ws_start == std::string::npos) {
      ws_start = i;
    }
    i = next;
  }
  out.PushRange(in, copied, s.size());
  return out;
}

LinedText Preprocess(std::string_view source) {
  LinedText t = WithLines(source);
  if (!t.text.empty() && t.text.back() == '\n') {  // one trailing newline is dropped, as Jinja does
    t.text.pop_back();
    t.line.pop_back();
  }
  return RemoveGenerationTags(TrimBlocks(LstripBlocks(t)));
}

bool IsWordChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}
bool IsDigit(char c) {
  return c >= '0' && c <= '9';
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

class Lexer {
 public:
  explicit Lexer(LinedText src) : src_(std::move(src)), s_(src_.text) {}

  Expected<std::vector<Token>> Run();

 private:
  int LineAt(size_t i) const {
    if (src_.line.empty()) return 1;
    return src_.line[std::min(i, src_.line.size() - 1)];
  }
  Status Error(size_t at, const std::string& what) const {
    return Status::Error("line " + std::to_string(LineAt(at)) + ": " + what);
  }
  bool StartsWith(std::string_view p) const { return s_.compare(pos_, p.size(), p) == 0; }
  void Push(TokenType type, std::string value, size_t at) {
    tokens_.push_back(Token{type, std::move(value), LineAt(at)});
  }
  TokenType LastType() const { return tokens_.back().type; }

  // `{%-`, `{{-` and `{#-` strip the whitespace before them from the preceding text.
  void StripTrailingWhitespace() {
    if (tokens_.empty() || tokens_.back().type != TokenType::kText) return;
    tokens_.back().value = utf8::Trim(tokens_.back().value, utf8::TrimSide::kRight);
    if (tokens_.back().value.empty()) tokens_.pop_back();
  }
  void SkipLeadingWhitespace() { pos_ = SkipSpaces(s_, pos_); }

  Status LexString(char quote);
  void LexNumber(std::string prefix);

  LinedText src_;
  const std::string& s_;
  size_t pos_ = 0;
  std::vector<Token> tokens_;
};

Status Lexer::LexString(char quote) {
  const size_t start = pos_;
  ++pos_;  // opening quote
  std::string value;
  while (true) {
    if (pos_ >= s_.size()) return Error(start, "unterminated string literal");
    const char c = s_[pos_];
    if (c == quote) break;
    if (c != '\\') {
      value.push_back(c);
      ++pos_;
      continue;
    }
    if (pos_ + 1 >= s_.size()) return Error(start, "unterminated string literal");
    const char e = s_[pos_ + 1];
    pos_ += 2;
    switch (e) {
      case 'n':
        value.push_back('\n');
        break;
      case 't':
        value.push_back('\t');
        break;
      case 'r':
        value.push_back('\r');
        break;
      case 'b':
        value.push_back('\b');
        break;
      case 'f':
        value.push_back('\f');
        break;
      case 'v':
        value.push_back('\v');
        break;
      case '\'':
        value.push_back('\'');
        break;
      case '"':
        value.push_back('"');
        break;
      case '\\':
        value.push_back('\\');
        break;
      case 'x':
      case 'u': {
        const size_t n = e == 'x' ? 2 : 4;
        char32_t cp = 0;
        for (size_t k = 0; k < n; ++k) {
          const int h = pos_ + k < s_.size() ? HexValue(s_[pos_ + k]) : -1;
          if (h < 0)
            return Error(pos_, std::string("invalid \\") + e + " escape in string literal");
          cp = cp * 16 + static_cast<char32_t>(h);
        }
        pos_ += n;
        utf8::Append(&value, cp);
        break;
      }
      default:
        return Error(pos_ - 1, std::string("unknown escape '\\") + e + "' in string literal");
    }
  }
  ++pos_;  // closing quote
  Push(TokenType::kString, std::move(value), start);
  return OkStatus();
}

void Lexer::LexNumber(std::string prefix) {
  const size_t start = pos_;
  std::string num = std::move(prefix);
  while (pos_ < s_.size() && IsDigit(s_[pos_])) num.push_back(s_[pos_++]);
  // `x.0.1` is two attribute lookups, not a float.
  const bool after_dot = !tokens_.empty() && LastType() == TokenType::kDot;
  if (!after_dot && pos_ + 1 < s_.size() && s_[pos_] == '.' && IsDigit(s_[pos_ + 1])) {
    num.push_back(s_[pos_++]);
    while (pos_ < s_.size() && IsDigit(s_[pos_])) num.push_back(s_[pos_++]);
  }
  Push(TokenType::kNumber, std::move(num), start);
}

Expected<std::vector<Token>> Lexer::Run() {
  static constexpr std::array<std::pair<std::string_view, TokenType>, 28> kSymbols = {{
      {"{%", TokenType::kOpenStatement},  {"%}", TokenType::kCloseStatement},
      {"{{", TokenType::kOpenExpression}, {"}}", TokenType::kCloseExpression},
      {"(", TokenType::kOpenParen},       {")", TokenType::kCloseParen},
      {"{", TokenType::kOpenBrace},       {"}", TokenType::kCloseBrace},
      {"[", TokenType::kOpenBracket},     {"]", TokenType::kCloseBracket},
      {",", TokenType::kComma},           {".", TokenType::kDot},
      {":", TokenType::kColon},           {"|", TokenType::kPipe},
      {"<=", TokenType::kCompare},        {">=", TokenType::kCompare},
      {"==", TokenType::kCompare},        {"!=", TokenType::kCompare},
      {"<", TokenType::kCompare},         {">", TokenType::kCompare},
      {"+", TokenType::kAdditive},        {"-", TokenType::kAdditive},
      {"~", TokenType::kAdditive},        {"**", TokenType::kPower},
      {"*", TokenType::kMultiplicative},  {"//", TokenType::kMultiplicative},
      {"/", TokenType::kMultiplicative},  {"%", TokenType::kMultiplicative},
  }};
  int brace_depth = 0;  // inside `{ ... }` of a dict literal, `}}` is two closing braces
  while (pos_ < s_.size()) {
    const bool outside = tokens_.empty() || LastType() == TokenType::kCloseStatement ||
                         LastType() == TokenType::kCloseExpression ||
                         LastType() == TokenType::kComment;
    if (outside) {
      const size_t start = pos_;
      while (pos_ < s_.size() &&
             !(s_[pos_] == '{' && pos_ + 1 < s_.size() &&
               (s_[pos_ + 1] == '%' || s_[pos_ + 1] == '{' || s_[pos_ + 1] == '#'))) {
        ++pos_;
      }
      if (pos_ > start) {
        Push(TokenType::kText, s_.substr(start, pos_ - start), start);
        continue;
      }
    }
    if (StartsWith("{#")) {
      const size_t start = pos_;
      pos_ += 2;
      const bool strip_before = pos_ < s_.size() && s_[pos_] == '-';
      if (strip_before) ++pos_;
      const size_t close = s_.find("#}", pos_);
      if (close == std::string::npos) return Error(start, "unclosed comment (missing '#}')");
      std::string comment = s_.substr(pos_, close - pos_);
      const bool strip_after = !comment.empty() && comment.back() == '-';
      if (strip_after) comment.pop_back();
      if (strip_before) StripTrailingWhitespace();
      Push(TokenType::kComment, std::move(comment), start);
      pos_ = close + 2;
      if (strip_after) SkipLeadingWhitespace();
      continue;
    }
    if (StartsWith("{%-")) {
      StripTrailingWhitespace();
      Push(TokenType::kOpenStatement, "{%", pos_);
      pos_ += 3;
      continue;
    }
    if (StartsWith("{{-")) {
      StripTrailingWhitespace();
      Push(TokenType::kOpenExpression, "{{", pos_);
      brace_depth = 0;
      pos_ += 3;
      continue;
    }
    SkipLeadingWhitespace();
    if (pos_ >= s_.size()) break;
    if (StartsWith("-%}")) {
      Push(TokenType::kCloseStatement, "%}", pos_);
      pos_ += 3;
      SkipLeadingWhitespace();
      continue;
    }
    if (StartsWith("-}}")) {
      Push(TokenType::kCloseExpression, "}}", pos_);
      pos_ += 3;
      SkipLeadingWhitespace();
      continue;
    }
    const char c = s_[pos_];
    if (c == '-' || c == '+') {
      if (tokens_.empty() || LastType() == TokenType::kText) {
        return Error(pos_, std::string("unexpected '") + c + "'");
      }
      const TokenType last = LastType();
      const bool binary = last == TokenType::kName || last == TokenType::kNumber ||
                          last == TokenType::kString || last == TokenType::kCloseParen ||
                          last == TokenType::kCloseBracket;
      if (!binary) {
        const size_t start = pos_++;
        if (pos_ < s_.size() && IsDigit(s_[pos_])) {
          LexNumber(std::string(1, c));
        } else {
          Push(TokenType::kUnary, std::string(1, c), start);
        }
        continue;
      }
    }
    bool matched = false;
    for (const auto& [seq, type] : kSymbols) {
      if (seq == "}}" && brace_depth > 0) continue;
      if (!StartsWith(seq)) continue;
      Push(type, std::string(seq), pos_);
      if (type == TokenType::kOpenExpression) brace_depth = 0;
      if (type == TokenType::kOpenBrace) ++brace_depth;
      if (type == TokenType::kCloseBrace) --brace_depth;
      pos_ += seq.size();
      matched = true;
      break;
    }
    if (matched) continue;
    if (c == '=') {  // after `==` had its chance above
      Push(TokenType::kEquals, "=", pos_++);
      continue;
    }
    if (c == '\'' || c == '"') {
      MT_RETURN_IF_ERROR(LexString(c));
      continue;
    }
    if (IsDigit(c)) {
      LexNumber("");
      continue;
    }
    if (IsWordChar(c)) {
      const size_t start = pos_;
      while (pos_ < s_.size() && IsWordChar(s_[pos_])) ++pos_;
      Push(TokenType::kName, s_.substr(start, pos_ - start), start);
      continue;
    }
    size_t next = pos_;
    std::string ch;
    utf8::Append(&ch, utf8::Next(s_, &next));
    return Error(pos_, "unexpected character '" + ch + "'");
  }
  return std::move(tokens_);
}

}  // namespace

std::string Describe(const Token& token) {
  switch (token.type) {
    case TokenType::kText:
      return "text";
    case TokenType::kComment:
      return "comment";
    case TokenType::kNumber:
      return "number " + token.value;
    case TokenType::kString:
      return "string literal";
    case TokenType::kName:
      return "'" + token.value + "'";
    default:
      return "'" + token.value + "'";
  }
}

Expected<std::vector<Token>> Tokenize(std::string_view source) {
  return Lexer(Preprocess(source)).Run();
}

}  // namespace moetier::text::jinja
