// Jinja lexer: template source → tokens, with the whitespace handling of transformers' chat
// templates (trim_blocks and lstrip_blocks on, `{% generation %}` tags removed) reproduced as
// @huggingface/jinja applies it, so text between tags comes out byte for byte the same.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace moetier::text::jinja {

enum class TokenType {
  kText,
  kComment,
  kOpenStatement,    // {%
  kCloseStatement,   // %}
  kOpenExpression,   // {{
  kCloseExpression,  // }}
  kNumber,
  kString,
  kName,
  kEquals,
  kOpenParen,
  kCloseParen,
  kOpenBracket,
  kCloseBracket,
  kOpenBrace,
  kCloseBrace,
  kComma,
  kDot,
  kColon,
  kPipe,
  kCompare,         // < > <= >= == !=
  kAdditive,        // + - ~
  kMultiplicative,  // * / // %
  kPower,           // **
  kUnary,           // a lone + or - before an operand
};

struct Token {
  TokenType type;
  std::string value;  // text, literal contents (escapes resolved), name or operator
  int line = 1;       // 1-based line of the token in the original source
};

// A readable name of a token for error messages ("'%}'", "name 'foo'", "end of template").
std::string Describe(const Token& token);

// Errors read "line N: <what>".
Expected<std::vector<Token>> Tokenize(std::string_view source);

}  // namespace moetier::text::jinja
