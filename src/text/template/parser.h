// Jinja parser: tokens → syntax tree. The grammar and operator precedence are those of
// @huggingface/jinja (itself close to Jinja2), so templates parse the same way there and here.
#pragma once

#include <vector>

#include "core/status.h"
#include "text/template/ast.h"
#include "text/template/lexer.h"
#include "text/template/nesting.h"

namespace moetier::text::jinja {

// Errors read "line N: <what>". A template nested deeper than kMaxNestingDepth is refused
// ("line N: expressions nest deeper than 128 levels", or "blocks nest ..."), so no tree the
// parser returns is deeper than that.
Expected<Body> Parse(const std::vector<Token>& tokens);

}  // namespace moetier::text::jinja
