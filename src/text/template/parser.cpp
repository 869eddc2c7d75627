#include "text/template/parser.h"

#include <algorithm>
#include <cstdlib>
#include <initializer_list>
#include <string>

namespace moetier::text::jinja {
namespace {

using T = TokenType;

bool IsBlockEnd(const std::string& name) {
  return name == "endif" || name == "elif" || name == "else" || name == "endfor" ||
         name == "endset" || name == "endmacro" || name == "endcall" || name == "endfilter";
}

// Recursive descent, with the stack in mind: kMaxNestingDepth is sized by the stack one level of
// nesting takes, and a parenthesis passes through every function from ParseExpression down to
// ParsePrimary. So the functions on that path parse their first operand and return it unless an
// operator follows, which an out-of-line (noinline) *Rest function then handles: the strings,
// nodes and error messages of the rest stay out of the frames that pile up while recursing.
// Blocks are split the same way (ParseStatement dispatches to one function per statement).
class Parser {
 public:
  explicit Parser(const std::vector<Token>& tokens) : t_(tokens) {}

  Expected<Body> ParseProgram() {
    Body body;
    while (cur_ < t_.size()) {
      MT_ASSIGN_OR_RETURN(StmtPtr s, ParseAny());
      if (s) body.push_back(std::move(s));
    }
    return body;
  }

 private:
  // ---- token helpers -------------------------------------------------------------------------
  bool AtEnd() const { return cur_ >= t_.size(); }
  bool Is(T type, size_t ahead = 0) const {
    return cur_ + ahead < t_.size() && t_[cur_ + ahead].type == type;
  }
  bool IsName(const char* name, size_t ahead = 0) const {
    return Is(T::kName, ahead) && t_[cur_ + ahead].value == name;
  }
  bool IsStatement(std::initializer_list<const char*> names) const {
    if (!Is(T::kOpenStatement) || !Is(T::kName, 1)) return false;
    for (const char* n : names)
      if (t_[cur_ + 1].value == n) return true;
    return false;
  }
  int Line() const {
    if (t_.empty()) return 1;
    return t_[std::min(cur_, t_.size() - 1)].line;
  }
  [[gnu::noinline]] Status Error(const std::string& what) const {
    return Status::Error("line " + std::to_string(Line()) + ": " + what);
  }
  // "expected <what>, found <the token at the cursor>".
  [[gnu::noinline]] Status ErrorExpected(const std::string& what) const {
    return Error("expected " + what + ", found " +
                 (AtEnd() ? std::string("end of template") : Describe(t_[cur_])));
  }
  [[gnu::noinline]] static Status ErrorAtLine(int line, const std::string& what) {
    return Status::Error("line " + std::to_string(line) + ": " + what);
  }
  Status Expect(T type, const char* what) {
    if (!Is(type)) return ErrorExpected(what);
    ++cur_;
    return OkStatus();
  }
  Status ExpectName(const char* name) {
    if (!IsName(name)) return ErrorExpected(std::string("'") + name + "'");
    ++cur_;
    return OkStatus();
  }

  // ---- nesting -------------------------------------------------------------------------------
  // Nesting is counted two ways against the one limit. Recursion (a block, a parenthesis, an
  // operand of `not`) takes a NestingGuard on depth_ before it descends; the loops that build
  // left-associative chains (`a + b + c`, `x|f|g`, `a.b[0]`) do not recurse while building,
  // but make trees that evaluation and destruction will walk recursively, so each finished node
  // is also checked by height (Finish). Together: every node sits at most kMaxNestingDepth
  // levels from the top of the template.
  [[gnu::noinline]] Status TooDeep(const char* what) const {
    return Error(std::string(what) + " nest deeper than " + std::to_string(kMaxNestingDepth) +
                 " levels");
  }

  // A statement's expressions (a condition, an output) sit one level below it; refusing the
  // statement that has no room left for them names the blocks as what nests too deep, rather
  // than the expression that would overflow inside them.
  static constexpr int kMaxStatementDepth = kMaxNestingDepth - 1;

  // Sets e->height from its children and refuses the node if, begun at the current depth, it
  // would reach past the limit.
  [[gnu::noinline]] Expected<ExprPtr> Finish(ExprPtr e) {
    int child = 0;
    auto see = [&child](const ExprPtr& c) {
      if (c) child = std::max(child, c->height);
    };
    for (const ExprPtr* c : {&e->a, &e->b, &e->c, &e->d}) see(*c);
    for (const ExprPtr& item : e->items) see(item);
    for (const auto& [k, v] : e->pairs) {
      see(k);
      see(v);
    }
    for (const Arg& arg : e->args) see(arg.value);
    e->height = child + 1;
    if (depth_ + e->height - 1 > kMaxNestingDepth) return TooDeep("expressions");
    return e;
  }

  [[gnu::noinline]] ExprPtr Node(ExprKind kind, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = line;
    return e;
  }
  [[gnu::noinline]] StmtPtr NewStmt(StmtKind kind, int line) {
    auto s = std::make_unique<Stmt>();
    s->kind = kind;
    s->line = line;
    return s;
  }

  // ---- statements ----------------------------------------------------------------------------
  Expected<StmtPtr> ParseAny() {
    NestingGuard level(&depth_, kMaxStatementDepth);
    if (level.exceeded()) return TooDeep("blocks");
    if (Is(T::kOpenStatement)) return ParseStatement();
    return ParseTextOrOutput();
  }

  // Text, a comment (no statement: null) or `{{ expr }}`.
  [[gnu::noinline]] Expected<StmtPtr> ParseTextOrOutput() {
    const Token& tok = t_[cur_];
    switch (tok.type) {
      case T::kComment:
        ++cur_;
        return StmtPtr();
      case T::kText: {
        auto s = NewStmt(StmtKind::kText, tok.line);
        s->text = tok.value;
        ++cur_;
        return s;
      }
      case T::kOpenExpression: {
        ++cur_;
        auto s = NewStmt(StmtKind::kOutput, tok.line);
        MT_ASSIGN_OR_RETURN(s->expr, ParseExpression());
        MT_RETURN_IF_ERROR(Expect(T::kCloseExpression, "'}}'"));
        return s;
      }
      default:
        return Error("unexpected " + Describe(tok));
    }
  }

  // Parses statements until one of `ends` opens; `opener` names the block for the error.
  Expected<Body> ParseBodyUntil(std::initializer_list<const char*> ends, const char* opener,
                                int opener_line, const char* closer) {
    Body body;
    while (!IsStatement(ends)) {
      if (AtEnd() || (Is(T::kOpenStatement) && Is(T::kName, 1) && IsBlockEnd(t_[cur_ + 1].value))) {
        return UnclosedBlock(opener, opener_line, closer);
      }
      MT_ASSIGN_OR_RETURN(StmtPtr s, ParseAny());
      if (s) body.push_back(std::move(s));
    }
    return body;
  }
  [[gnu::noinline]] Status UnclosedBlock(const char* opener, int opener_line,
                                         const char* closer) const {
    if (AtEnd()) {
      return ErrorAtLine(opener_line, std::string("unclosed '") + opener + "' block (missing {% " +
                                          closer + " %})");
    }
    return Error("expected {% " + std::string(closer) + " %} to close the '" + opener +
                 "' on line " + std::to_string(opener_line) + ", found {% " + t_[cur_ + 1].value +
                 " %}");
  }
  Status ExpectEnd(const char* closer) {
    MT_RETURN_IF_ERROR(Expect(T::kOpenStatement, "'{%'"));
    MT_RETURN_IF_ERROR(ExpectName(closer));
    return Expect(T::kCloseStatement, "'%}'");
  }

  Expected<StmtPtr> ParseStatement() {
    const int line = t_[cur_].line;
    ++cur_;  // {%
    if (!Is(T::kName)) return ErrorExpected("a statement name after '{%'");
    const std::string& name = t_[cur_++].value;
    if (name == "set") return ParseSet(line);
    if (name == "if") return ParseIf(line);
    if (name == "for") return ParseFor(line);
    if (name == "macro") return ParseMacro(line);
    if (name == "call") return ParseCallBlock(line);
    if (name == "filter") return ParseFilterBlock(line);
    if (name == "break" || name == "continue") return ParseLoopControl(name, line);
    if (IsBlockEnd(name)) {
      return ErrorAtLine(line, "'{% " + name + " %}' without a matching opening tag");
    }
    return ErrorAtLine(line, "unknown statement '" + name + "'");
  }

  [[gnu::noinline]] Expected<StmtPtr> ParseSet(int line) {
    auto s = NewStmt(StmtKind::kSet, line);
    MT_ASSIGN_OR_RETURN(s->target, ParseExpressionSequence(false));
    if (Is(T::kEquals)) {
      ++cur_;
      MT_ASSIGN_OR_RETURN(s->expr, ParseExpressionSequence(false));
    } else {
      s->kind = StmtKind::kSetBlock;
      MT_RETURN_IF_ERROR(Expect(T::kCloseStatement, "'=' or '%}'"));
      MT_ASSIGN_OR_RETURN(s->body, ParseBodyUntil({"endset"}, "set", line, "endset"));
      MT_RETURN_IF_ERROR(Expect(T::kOpenStatement, "'{%'"));
      MT_RETURN_IF_ERROR(ExpectName("endset"));
    }
    MT_RETURN_IF_ERROR(Expect(T::kCloseStatement, "'%}'"));
    return s;
  }

  [[gnu::noinline]] Expected<StmtPtr> ParseIf(int line) {
    auto s = NewStmt(StmtKind::kIf, line);
    MT_RETURN_IF_ERROR(ParseIfRest(s.get()));
    MT_RETURN_IF_ERROR(ExpectEnd("endif"));
    return s;
  }

  // After `if` / `elif`: the test, the body, then elif / else parts (not the endif).
  Status ParseIfRest(Stmt* s) {
    MT_ASSIGN_OR_RETURN(s->expr, ParseExpression());
    MT_RETURN_IF_ERROR(Expect(T::kCloseStatement, "'%}'"));
    MT_ASSIGN_OR_RETURN(s->body, ParseBodyUntil({"elif", "else", "endif"}, "if", s->line, "endif"));
    if (IsStatement({"elif"})) return ParseElif(s);
    if (IsStatement({"else"})) {
      cur_ += 2;
      MT_RETURN_IF_ERROR(Expect(T::kCloseStatement, "'%}'"));
      MT_ASSIGN_OR_RETURN(s->orelse, ParseBodyUntil({"endif"}, "if", s->line, "endif"));
    }
    return OkStatus();
  }

  // The elif becomes an If inside the else branch of `s`: one more level, for the parser here
  // and for whoever walks the tree.
  [[gnu::noinline]] Status ParseElif(Stmt* s) {
    NestingGuard level(&depth_, kMaxStatementDepth);
    if (level.exceeded()) return TooDeep("blocks");
    auto elif = NewStmt(StmtKind::kIf, t_[cur_].line);
    cur_ += 2;
    MT_RETURN_IF_ERROR(ParseIfRest(elif.get()));
    s->orelse.push_back(std::move(elif));
    return OkStatus();
  }

  [[gnu::noinline]] Expected<StmtPtr> ParseFor(int line) {
    auto s = NewStmt(StmtKind::kFor, line);
    MT_ASSIGN_OR_RETURN(s->target, ParseExpressionSequence(true));
    if (s->target->kind != ExprKind::kName && s->target->kind != ExprKind::kTuple) {
      return Error("expected a name or a tuple of names as the loop variable");
    }
    for (const auto& item : s->target->items) {
      if (item->kind != ExprKind::kName) return Error("loop variables must be names");
    }
    MT_RETURN_IF_ERROR(ExpectName("in"));
    MT_ASSIGN_OR_RETURN(ExprPtr iterable, ParseExpression());
    if (iterable->kind == ExprKind::kSelect) {  // `for x in xs if cond`
      s->cond = std::move(iterable->a);
      s->expr = std::move(iterable->b);
    } else {
      s->expr = std::move(iterable);
    }
    MT_RETURN_IF_ERROR(Expect(T::kCloseStatement, "'%}'"));
    MT_ASSIGN_OR_RETURN(s->body, ParseBodyUntil({"endfor", "else"}, "for", line, "endfor"));
    if (IsStatement({"else"})) {
      cur_ += 2;
      MT_RETURN_IF_ERROR(Expect(T::kCloseStatement, "'%}'"));
      MT_ASSIGN_OR_RETURN(s->orelse, ParseBodyUntil({"endfor"}, "for", line, "endfor"));
    }
    MT_RETURN_IF_ERROR(ExpectEnd("endfor"));
    return s;
  }

  [[gnu::noinline]] Expected<StmtPtr> ParseMacro(int line) {
    auto s = NewStmt(StmtKind::kMacro, line);
    if (!Is(T::kName)) return ErrorExpected("a macro name");
    s->text = t_[cur_++].value;
    MT_ASSIGN_OR_RETURN(s->params, ParseArgs(/*parameters=*/true));
    MT_RETURN_IF_ERROR(Expect(T::kCloseStatement, "'%}'"));
    MT_ASSIGN_OR_RETURN(s->body, ParseBodyUntil({"endmacro"}, "macro", line, "endmacro"));
    MT_RETURN_IF_ERROR(ExpectEnd("endmacro"));
    return s;
  }

  [[gnu::noinline]] Expected<StmtPtr> ParseCallBlock(int line) {
    auto s = NewStmt(StmtKind::kCallBlock, line);
    if (Is(T::kOpenParen)) {
      MT_ASSIGN_OR_RETURN(s->params, ParseArgs(/*parameters=*/true));
    }
    if (!Is(T::kName)) return ErrorExpected("a macro name after 'call'");
    auto callee = Node(ExprKind::kName, Line());
    callee->name = t_[cur_++].value;
    auto call = Node(ExprKind::kCall, line);
    call->a = std::move(callee);
    MT_ASSIGN_OR_RETURN(call->args, ParseArgs(/*parameters=*/false));
    MT_ASSIGN_OR_RETURN(s->expr, Finish(std::move(call)));
    MT_RETURN_IF_ERROR(Expect(T::kCloseStatement, "'%}'"));
    MT_ASSIGN_OR_RETURN(s->body, ParseBodyUntil({"endcall"}, "call", line, "endcall"));
    MT_RETURN_IF_ERROR(ExpectEnd("endcall"));
    return s;
  }

  [[gnu::noinline]] Expected<StmtPtr> ParseFilterBlock(int line) {
    auto s = NewStmt(StmtKind::kFilterBlock, line);
    if (!Is(T::kName)) return ErrorExpected("a filter name");
    auto f = Node(ExprKind::kFilter, Line());
    f->name = t_[cur_++].value;
    if (Is(T::kOpenParen)) {
      f->has_call = true;
      MT_ASSIGN_OR_RETURN(f->args, ParseArgs(/*parameters=*/false));
    }
    MT_ASSIGN_OR_RETURN(s->expr, Finish(std::move(f)));
    MT_RETURN_IF_ERROR(Expect(T::kCloseStatement, "'%}'"));
    MT_ASSIGN_OR_RETURN(s->body, ParseBodyUntil({"endfilter"}, "filter", line, "endfilter"));
    MT_RETURN_IF_ERROR(ExpectEnd("endfilter"));
    return s;
  }

  [[gnu::noinline]] Expected<StmtPtr> ParseLoopControl(const std::string& name, int line) {
    auto s = NewStmt(name == "break" ? StmtKind::kBreak : StmtKind::kContinue, line);
    MT_RETURN_IF_ERROR(Expect(T::kCloseStatement, "'%}'"));
    return s;
  }

  // ---- expressions ---------------------------------------------------------------------------
  Expected<ExprPtr> ParseExpressionSequence(bool primary) {
    const int line = Line();
    MT_ASSIGN_OR_RETURN(ExprPtr first, primary ? ParsePrimary() : ParseExpression());
    if (!Is(T::kComma)) return first;
    return ParseTupleRest(std::move(first), primary, line);
  }
  [[gnu::noinline]] Expected<ExprPtr> ParseTupleRest(ExprPtr first, bool primary, int line) {
    auto tuple = Node(ExprKind::kTuple, line);
    tuple->items.push_back(std::move(first));
    while (Is(T::kComma)) {
      ++cur_;
      MT_ASSIGN_OR_RETURN(ExprPtr next, primary ? ParsePrimary() : ParseExpression());
      tuple->items.push_back(std::move(next));
    }
    return Finish(std::move(tuple));
  }

  Expected<ExprPtr> ParseExpression() {
    NestingGuard level(&depth_, kMaxNestingDepth);
    if (level.exceeded()) return TooDeep("expressions");
    const int line = Line();
    MT_ASSIGN_OR_RETURN(ExprPtr value, ParseBinary(Level::kOr));
    if (!IsName("if")) return value;
    return ParseConditionalRest(std::move(value), line);
  }
  // `value if test [else other]`, the `if` at the cursor.
  [[gnu::noinline]] Expected<ExprPtr> ParseConditionalRest(ExprPtr value, int line) {
    ++cur_;
    MT_ASSIGN_OR_RETURN(ExprPtr test, ParseBinary(Level::kOr));
    if (IsName("else")) {
      ++cur_;
      auto t = Node(ExprKind::kTernary, line);
      t->a = std::move(test);
      t->b = std::move(value);
      MT_ASSIGN_OR_RETURN(t->c, ParseExpression());
      return Finish(std::move(t));
    }
    auto sel = Node(ExprKind::kSelect, line);
    sel->a = std::move(test);
    sel->b = std::move(value);
    return Finish(std::move(sel));
  }

  // Binary operators by precedence, loosest first. `not`, a prefix, sits between `and` and the
  // comparisons; tests, filters, signs and postfix operators bind tighter than all of them.
  enum class Level { kOr, kAnd, kNot, kComparison, kAdditive, kMultiplicative, kPower, kNone };

  // The level of the binary operator at the cursor, kNone when there is none.
  Level OperatorLevel() const {
    if (IsName("or")) return Level::kOr;
    if (IsName("and")) return Level::kAnd;
    if ((IsName("not") && IsName("in", 1)) || IsName("in") || Is(T::kCompare)) {
      return Level::kComparison;
    }
    if (Is(T::kAdditive)) return Level::kAdditive;
    if (Is(T::kMultiplicative)) return Level::kMultiplicative;
    if (Is(T::kPower)) return Level::kPower;
    return Level::kNone;
  }
  static bool Binds(Level op, Level min) { return op != Level::kNone && op >= min; }

  // Operands joined by the binary operators of level `min` and tighter, each level
  // left-associative (`**` included, as in Jinja). Precedence climbing: one call per operator
  // met, rather than one per precedence level on the way down to every operand.
  Expected<ExprPtr> ParseBinary(Level min) {
    MT_ASSIGN_OR_RETURN(ExprPtr left,
                        min <= Level::kNot && IsName("not") ? ParseNotRest() : ParseTest());
    if (!Binds(OperatorLevel(), min)) return left;
    return ParseBinaryRest(min, std::move(left));
  }
  [[gnu::noinline]] Expected<ExprPtr> ParseBinaryRest(Level min, ExprPtr left) {
    for (Level level = OperatorLevel(); Binds(level, min); level = OperatorLevel()) {
      const int line = Line();
      std::string op;
      if (IsName("not")) {  // `not in`, the one operator of two tokens
        op = "not in";
        cur_ += 2;
      } else {
        op = t_[cur_++].value;
      }
      const Level tighter = static_cast<Level>(static_cast<int>(level) + 1);
      MT_ASSIGN_OR_RETURN(ExprPtr right, ParseBinary(tighter));
      auto e = Node(ExprKind::kBinary, line);
      e->name = std::move(op);
      e->a = std::move(left);
      e->b = std::move(right);
      MT_ASSIGN_OR_RETURN(left, Finish(std::move(e)));
    }
    return left;
  }

  // `not x`, the `not` at the cursor; x is a comparison or tighter, or another `not`.
  [[gnu::noinline]] Expected<ExprPtr> ParseNotRest() {
    NestingGuard level(&depth_, kMaxNestingDepth);
    if (level.exceeded()) return TooDeep("expressions");
    auto e = Node(ExprKind::kUnary, Line());
    e->name = "not";
    ++cur_;
    MT_ASSIGN_OR_RETURN(e->a, ParseBinary(Level::kNot));
    return Finish(std::move(e));
  }

  Expected<ExprPtr> ParseTest() {
    MT_ASSIGN_OR_RETURN(ExprPtr operand, ParseFilter());
    if (!IsName("is")) return operand;
    return ParseTestRest(std::move(operand));
  }
  [[gnu::noinline]] Expected<ExprPtr> ParseTestRest(ExprPtr operand) {
    while (IsName("is")) {
      auto e = Node(ExprKind::kTest, Line());
      ++cur_;
      if (IsName("not")) {
        e->negate = true;
        ++cur_;
      }
      if (!Is(T::kName)) return ErrorExpected("a test name after 'is'");
      e->name = t_[cur_++].value;
      if (Is(T::kOpenParen)) {  // `is divisibleby(3)`: arguments, a Jinja2 form
        e->has_call = true;
        MT_ASSIGN_OR_RETURN(e->args, ParseArgs(false));
      }
      e->a = std::move(operand);
      MT_ASSIGN_OR_RETURN(operand, Finish(std::move(e)));
    }
    return operand;
  }

  Expected<ExprPtr> ParseFilter() {
    MT_ASSIGN_OR_RETURN(ExprPtr operand, ParseUnarySign());
    if (!Is(T::kPipe)) return operand;
    return ParseFilterRest(std::move(operand));
  }
  [[gnu::noinline]] Expected<ExprPtr> ParseFilterRest(ExprPtr operand) {
    while (Is(T::kPipe)) {
      auto e = Node(ExprKind::kFilter, Line());
      ++cur_;
      if (!Is(T::kName)) return ErrorExpected("a filter name after '|'");
      e->name = t_[cur_++].value;
      if (Is(T::kOpenParen)) {
        e->has_call = true;
        MT_ASSIGN_OR_RETURN(e->args, ParseArgs(false));
      }
      e->a = std::move(operand);
      MT_ASSIGN_OR_RETURN(operand, Finish(std::move(e)));
    }
    return operand;
  }

  Expected<ExprPtr> ParseUnarySign() {
    if ((Is(T::kUnary) || Is(T::kAdditive)) && (t_[cur_].value == "-" || t_[cur_].value == "+")) {
      return ParseUnarySignRest();
    }
    return ParseCallMember();
  }
  [[gnu::noinline]] Expected<ExprPtr> ParseUnarySignRest() {
    NestingGuard level(&depth_, kMaxNestingDepth);
    if (level.exceeded()) return TooDeep("expressions");
    auto e = Node(ExprKind::kUnary, Line());
    e->name = t_[cur_++].value;
    MT_ASSIGN_OR_RETURN(e->a, ParseUnarySign());
    return Finish(std::move(e));
  }

  Expected<ExprPtr> ParseCallMember() {
    MT_ASSIGN_OR_RETURN(ExprPtr e, ParsePrimary());
    if (!Is(T::kDot) && !Is(T::kOpenBracket) && !Is(T::kOpenParen)) return e;
    return ParseCallMemberRest(std::move(e));
  }
  [[gnu::noinline]] Expected<ExprPtr> ParseCallMemberRest(ExprPtr e) {
    while (true) {
      if (Is(T::kDot) || Is(T::kOpenBracket)) {
        MT_ASSIGN_OR_RETURN(e, ParseMember(std::move(e)));
      } else if (Is(T::kOpenParen)) {
        auto call = Node(ExprKind::kCall, Line());
        call->a = std::move(e);
        MT_ASSIGN_OR_RETURN(call->args, ParseArgs(false));
        MT_ASSIGN_OR_RETURN(e, Finish(std::move(call)));
      } else {
        return e;
      }
    }
  }

  Expected<ExprPtr> ParseMember(ExprPtr object) {
    if (Is(T::kDot)) return ParseAttribute(std::move(object));
    return ParseSubscript(std::move(object));
  }

  // `object.name`, or `object.0`; the '.' at the cursor.
  [[gnu::noinline]] Expected<ExprPtr> ParseAttribute(ExprPtr object) {
    auto e = Node(ExprKind::kAttr, Line());
    ++cur_;
    e->a = std::move(object);
    if (Is(T::kName)) {
      e->name = t_[cur_++].value;
    } else if (Is(T::kNumber) && t_[cur_].value.find('.') == std::string::npos) {
      e->name = t_[cur_++].value;
      e->attr_is_index = true;
    } else {
      return ErrorExpected("an attribute name after '.'");
    }
    return Finish(std::move(e));
  }

  // `object[i]` or a slice `object[a:b:c]`; the '[' at the cursor.
  [[gnu::noinline]] Expected<ExprPtr> ParseSubscript(ExprPtr object) {
    const int line = Line();
    ++cur_;  // [
    std::vector<ExprPtr> parts;
    bool is_slice = false;
    while (!Is(T::kCloseBracket)) {
      if (AtEnd()) return ErrorExpected("']'");
      if (Is(T::kColon)) {
        parts.push_back(nullptr);
        ++cur_;
        is_slice = true;
      } else {
        MT_ASSIGN_OR_RETURN(ExprPtr part, ParseExpression());
        parts.push_back(std::move(part));
        if (Is(T::kColon)) {
          ++cur_;
          is_slice = true;
        }
      }
    }
    ++cur_;  // ]
    return MakeSubscript(std::move(object), std::move(parts), is_slice, line);
  }
  [[gnu::noinline]] Expected<ExprPtr> MakeSubscript(ExprPtr object, std::vector<ExprPtr> parts,
                                                    bool is_slice, int line) {
    if (parts.empty()) return ErrorAtLine(line, "empty subscript []");
    if (!is_slice) {
      if (parts.size() != 1) return ErrorAtLine(line, "bad subscript");
      auto e = Node(ExprKind::kIndex, line);
      e->a = std::move(object);
      e->b = std::move(parts[0]);
      return Finish(std::move(e));
    }
    if (parts.size() > 3) return ErrorAtLine(line, "a slice takes at most 3 parts");
    auto e = Node(ExprKind::kSlice, line);
    e->a = std::move(object);
    parts.resize(3);
    e->b = std::move(parts[0]);
    e->c = std::move(parts[1]);
    e->d = std::move(parts[2]);
    return Finish(std::move(e));
  }

  // `(args)` of a call, filter or test, or `(params)` of a macro or call block.
  Expected<std::vector<Arg>> ParseArgs(bool parameters) {
    MT_RETURN_IF_ERROR(Expect(T::kOpenParen, "'('"));
    std::vector<Arg> args;
    while (!Is(T::kCloseParen)) {
      if (AtEnd()) return ErrorExpected("')'");
      MT_ASSIGN_OR_RETURN(Arg arg, ParseArg(parameters));
      MT_RETURN_IF_ERROR(CheckArgOrder(parameters, args, arg));
      args.push_back(std::move(arg));
      if (Is(T::kComma)) ++cur_;
    }
    ++cur_;  // )
    return args;
  }

  // One argument: `value`, `name=value`, `*list` or `**dict`; in a parameter list, `name` or
  // `name=default`.
  [[gnu::noinline]] Expected<Arg> ParseArg(bool parameters) {
    Arg arg;
    const bool kw_spread = Is(T::kPower);
    const bool spread = Is(T::kMultiplicative) && t_[cur_].value == "*";
    if (parameters && (kw_spread || spread)) {
      return Error("argument unpacking is not allowed in a parameter list");
    }
    if (kw_spread || spread) {
      ++cur_;
      arg.kind = kw_spread ? ArgKind::kKeywordSpread : ArgKind::kSpread;
      MT_ASSIGN_OR_RETURN(arg.value, ParseExpression());
      return arg;
    }
    MT_ASSIGN_OR_RETURN(ExprPtr value, ParseExpression());
    if (Is(T::kEquals)) {
      ++cur_;
      if (value->kind != ExprKind::kName) return Error("expected a name before '='");
      arg.kind = ArgKind::kKeyword;
      arg.name = value->name;
      MT_ASSIGN_OR_RETURN(arg.value, ParseExpression());
    } else if (parameters) {
      if (value->kind != ExprKind::kName) return Error("expected a parameter name");
      arg.kind = ArgKind::kPositional;
      arg.name = value->name;
    } else {
      arg.value = std::move(value);
    }
    return arg;
  }

  // Positional arguments (and parameters without a default) come before keyword ones, and a
  // parameter is named once.
  [[gnu::noinline]] Status CheckArgOrder(bool parameters, const std::vector<Arg>& before,
                                         const Arg& arg) const {
    const bool saw_keyword = std::any_of(before.begin(), before.end(),
                                         [](const Arg& a) { return a.kind == ArgKind::kKeyword; });
    if (arg.kind == ArgKind::kPositional && saw_keyword) {
      return Error(parameters ? "a parameter without default follows one with a default"
                              : "positional argument after a keyword argument");
    }
    if (parameters) {
      for (const Arg& a : before)
        if (a.name == arg.name) return Error("duplicate parameter '" + arg.name + "'");
    }
    return OkStatus();
  }

  // Parentheses, lists and dicts recurse through ParseExpression, which counts the level.
  Expected<ExprPtr> ParsePrimary() {
    if (Is(T::kOpenParen)) {
      ++cur_;
      MT_ASSIGN_OR_RETURN(ExprPtr inner, ParseExpressionSequence(false));
      MT_RETURN_IF_ERROR(Expect(T::kCloseParen, "')'"));
      return inner;
    }
    if (Is(T::kOpenBracket)) return ParseList();
    if (Is(T::kOpenBrace)) return ParseDict();
    return ParseAtom();
  }

  [[gnu::noinline]] Expected<ExprPtr> ParseList() {
    auto e = Node(ExprKind::kList, t_[cur_++].line);
    while (!Is(T::kCloseBracket)) {
      if (AtEnd()) return ErrorExpected("']'");
      MT_ASSIGN_OR_RETURN(ExprPtr item, ParseExpression());
      e->items.push_back(std::move(item));
      if (Is(T::kComma)) ++cur_;
    }
    ++cur_;
    return Finish(std::move(e));
  }

  [[gnu::noinline]] Expected<ExprPtr> ParseDict() {
    auto e = Node(ExprKind::kDict, t_[cur_++].line);
    while (!Is(T::kCloseBrace)) {
      if (AtEnd()) return ErrorExpected("'}'");
      MT_ASSIGN_OR_RETURN(ExprPtr key, ParseExpression());
      MT_RETURN_IF_ERROR(Expect(T::kColon, "':' in a dict literal"));
      MT_ASSIGN_OR_RETURN(ExprPtr value, ParseExpression());
      e->pairs.emplace_back(std::move(key), std::move(value));
      if (Is(T::kComma)) ++cur_;
    }
    ++cur_;
    return Finish(std::move(e));
  }

  // A number, string or name.
  [[gnu::noinline]] Expected<ExprPtr> ParseAtom() {
    if (AtEnd()) return ErrorExpected("an expression");
    const Token& tok = t_[cur_];
    switch (tok.type) {
      case T::kNumber: {
        ++cur_;
        auto e = Node(ExprKind::kLiteral, tok.line);
        if (tok.value.find('.') != std::string::npos) {
          e->literal = Value::Float(std::strtod(tok.value.c_str(), nullptr));
        } else {
          errno = 0;
          const long long v = std::strtoll(tok.value.c_str(), nullptr, 10);
          e->literal = errno == ERANGE ? Value::Float(std::strtod(tok.value.c_str(), nullptr))
                                       : Value::Int(v);
        }
        return e;
      }
      case T::kString: {
        ++cur_;
        std::string value = tok.value;
        while (Is(T::kString)) value += t_[cur_++].value;  // adjacent literals concatenate
        auto e = Node(ExprKind::kLiteral, tok.line);
        e->literal = Value::String(std::move(value));
        return e;
      }
      case T::kName: {
        ++cur_;
        auto e = Node(ExprKind::kName, tok.line);
        e->name = tok.value;
        return e;
      }
      default:
        return ErrorExpected("an expression");
    }
  }

  const std::vector<Token>& t_;
  size_t cur_ = 0;
  int depth_ = 0;
};

}  // namespace

Expected<Body> Parse(const std::vector<Token>& tokens) {
  return Parser(tokens).ParseProgram();
}

}  // namespace moetier::text::jinja
