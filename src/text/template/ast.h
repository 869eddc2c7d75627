// Syntax tree of a parsed Jinja template. Nodes own their children; the tree is immutable after
// parsing, so one parsed template can render concurrently from several threads.
//
// Depth: the parser builds no tree deeper than kMaxNestingDepth (nesting.h), statements and
// expressions counted together. Evaluating, printing and destroying a tree (the unique_ptr
// children) recurse once per level, so that bound is what keeps all of them off the end of the
// stack; a tree built any other way must respect it too.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "text/template/value.h"

namespace moetier::text::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;
struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

enum class ArgKind { kPositional, kKeyword, kSpread, kKeywordSpread };

struct Arg {
  ArgKind kind = ArgKind::kPositional;
  std::string name;  // kKeyword; also the parameter name in a macro signature
  ExprPtr value;     // the argument, or a parameter's default (null when it has none)
};

enum class ExprKind {
  kLiteral,  // literal
  kName,     // name
  kList,     // items
  kTuple,    // items
  kDict,     // pairs
  kAttr,     // a.name (name is the attribute; an integer after '.' is kept as text)
  kIndex,    // a[b]
  kSlice,    // a[b:c:d], each of b c d may be null
  kCall,     // a(args)
  kFilter,   // a | name(args)
  kTest,     // a is [not] name(args)
  kUnary,    // op a          (op: "not", "-", "+")
  kBinary,   // a op b
  kTernary,  // b if a else c
  kSelect,   // b if a        (undefined when a is false; a `for` filter)
};

struct Expr {
  ExprKind kind;
  int line = 0;
  int height = 1;  // levels of this subtree (1 for a leaf), set and bounded by the parser
  Value literal;
  std::string name;  // name, attribute, filter, test or operator
  bool negate = false;
  bool attr_is_index = false;  // kAttr written as `a.0`
  bool has_call = false;       // kFilter / kTest written with parentheses
  ExprPtr a, b, c, d;
  std::vector<ExprPtr> items;
  std::vector<std::pair<ExprPtr, ExprPtr>> pairs;
  std::vector<Arg> args;
};

enum class StmtKind {
  kText,         // text
  kOutput,       // {{ expr }}
  kIf,           // if expr: body else orelse (an elif is an If alone in orelse)
  kFor,          // for target in expr [if cond]: body else orelse
  kSet,          // set target = expr
  kSetBlock,     // set target %} body {% endset
  kMacro,        // macro name(params): body
  kCallBlock,    // call[(params)] expr: body
  kFilterBlock,  // filter expr(with a null operand): body
  kBreak,
  kContinue,
};

struct Stmt {
  StmtKind kind;
  int line = 0;
  std::string text;  // kText; macro name
  ExprPtr expr;
  ExprPtr target;
  ExprPtr cond;
  std::vector<Arg> params;
  Body body;
  Body orelse;
};

}  // namespace moetier::text::jinja
