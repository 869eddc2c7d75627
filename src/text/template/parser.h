// Jinja parser: tokens → syntax tree. The grammar and operator precedence are those of
// @huggingface/jinja (itself close to Jinja2), so templates parse the same way there and here.
#pragma once

#include <vector>

#include "core/status.h"
#include "text/template/ast.h"
#include "text/template/lexer.h"

namespace moetier::text::jinja {

// Nesting deeper than this (blocks inside blocks, parentheses inside parentheses) is refused, so
// that neither parsing nor rendering can exhaust the stack on a hostile template.
inline constexpr int kMaxNestingDepth = 128;

// Errors read "line N: <what>".
Expected<Body> Parse(const std::vector<Token>& tokens);

}  // namespace moetier::text::jinja
