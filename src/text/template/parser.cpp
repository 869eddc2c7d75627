#include "text/template/parser.h"

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
  Status Error(const std::string& what) const {
    return Status::Error("line " + std::to_string(Line()) + ": " + what);
  }
  std::string Found() const { return AtEnd() ? "end of template" : Describe(t_[cur_]); }
  Status Expect(T type, const char* what) {
    if (!Is(type)) return Error(std::string("expected ") + what + ", found " + Found());
    ++cur_;
    return OkStatus();
  }
  Status ExpectName(const char* name) {
    if (!IsName(name)) return Error(std::string("expected '") + name + "', found " + Found());
    ++cur_;
    return OkStatus();
  }

  // Counts nesting on the way down, so a hostile template fails cleanly instead of overflowing.
  class DepthGuard {
   public:
    explicit DepthGuard(int* depth) : depth_(depth) { ++*depth_; }
    ~DepthGuard() { --*depth_; }
    DepthGuard(const DepthGuard&) = delete;
    DepthGuard& operator=(const DepthGuard&) = delete;

   private:
    int* depth_;
  };
  Status CheckDepth() const {
    if (depth_ > kMaxNestingDepth) {
      return Error("nesting deeper than " + std::to_string(kMaxNestingDepth) + " levels");
    }
    return OkStatus();
  }

  ExprPtr Node(ExprKind kind, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = line;
    return e;
  }

  // ---- statements ----------------------------------------------------------------------------
  Expected<StmtPtr> ParseAny() {
    DepthGuard guard(&depth_);
    MT_RETURN_IF_ERROR(CheckDepth());
    const Token& tok = t_[cur_];
    switch (tok.type) {
      case T::kComment:
        ++cur_;
        return StmtPtr();
      case T::kText: {
        auto s = std::make_unique<Stmt>();
        s->kind = StmtKind::kText;
        s->line = tok.line;
        s->text = tok.value;
        ++cur_;
        return s;
      }
      case T::kOpenExpression: {
        ++cur_;
        auto s = std::make_unique<Stmt>();
        s->kind = StmtKind::kOutput;
        s->line = tok.line;
        MT_ASSIGN_OR_RETURN(s->expr, ParseExpression());
        MT_RETURN_IF_ERROR(Expect(T::kCloseExpression, "'}}'"));
        return s;
      }
      case T::kOpenStatement:
        return ParseStatement();
      default:
        return Error("unexpected " + Describe(tok));
    }
  }

  // Parses statements until one of `ends` opens; `opener` names the block for the error.
  Expected<Body> ParseBodyUntil(std::initializer_list<const char*> ends, const char* opener,
                                int opener_line, const char* closer) {
    Body body;
    while (!IsStatement(ends)) {
      if (Is(T::kOpenStatement) && Is(T::kName, 1) && IsBlockEnd(t_[cur_ + 1].value)) {
        return Error("expected {% " + std::string(closer) + " %} to close the '" + opener +
                     "' on line " + std::to_string(opener_line) + ", found {% " +
                     t_[cur_ + 1].value + " %}");
      }
      if (AtEnd()) {
        return Status::Error("line " + std::to_string(opener_line) + ": unclosed '" + opener +
                             "' block (missing {% " + closer + " %})");
      }
      MT_ASSIGN_OR_RETURN(StmtPtr s, ParseAny());
      if (s) body.push_back(std::move(s));
    }
    return body;
  }
  Status ExpectEnd(const char* closer) {
    MT_RETURN_IF_ERROR(Expect(T::kOpenStatement, "'{%'"));
    MT_RETURN_IF_ERROR(ExpectName(closer));
    return Expect(T::kCloseStatement, "'%}'");
  }

  Expected<StmtPtr> ParseStatement() {
    const int line = t_[cur_].line;
    ++cur_;  // {%
    if (!Is(T::kName)) return Error("expected a statement name after '{%', found " + Found());
    const std::string name = t_[cur_].value;
    ++cur_;
    auto s = std::make_unique<Stmt>();
    s->line = line;
    if (name == "set") {
      MT_RETURN_IF_ERROR(ParseSet(s.get()));
    } else if (name == "if") {
      s->kind = StmtKind::kIf;
      MT_RETURN_IF_ERROR(ParseIfRest(s.get()));
      MT_RETURN_IF_ERROR(ExpectEnd("endif"));
    } else if (name == "for") {
      MT_RETURN_IF_ERROR(ParseFor(s.get()));
    } else if (name == "macro") {
      s->kind = StmtKind::kMacro;
      if (!Is(T::kName)) return Error("expected a macro name, found " + Found());
      s->text = t_[cur_++].value;
      MT_ASSIGN_OR_RETURN(s->params, ParseArgs(/*parameters=*/true));
      MT_RETURN_IF_ERROR(Expect(T::kCloseStatement, "'%}'"));
      MT_ASSIGN_OR_RETURN(s->body, ParseBodyUntil({"endmacro"}, "macro", line, "endmacro"));
      MT_RETURN_IF_ERROR(ExpectEnd("endmacro"));
    } else if (name == "call") {
      s->kind = StmtKind::kCallBlock;
      if (Is(T::kOpenParen)) {
        MT_ASSIGN_OR_RETURN(s->params, ParseArgs(/*parameters=*/true));
      }
      if (!Is(T::kName)) return Error("expected a macro name after 'call', found " + Found());
      auto callee = Node(ExprKind::kName, Line());
      callee->name = t_[cur_++].value;
      auto call = Node(ExprKind::kCall, line);
      call->a = std::move(callee);
      MT_ASSIGN_OR_RETURN(call->args, ParseArgs(/*parameters=*/false));
      s->expr = std::move(call);
      MT_RETURN_IF_ERROR(Expect(T::kCloseStatement, "'%}'"));
      MT_ASSIGN_OR_RETURN(s->body, ParseBodyUntil({"endcall"}, "call", line, "endcall"));
      MT_RETURN_IF_ERROR(ExpectEnd("endcall"));
    } else if (name == "filter") {
      s->kind = StmtKind::kFilterBlock;
      if (!Is(T::kName)) return Error("expected a filter name, found " + Found());
      auto f = Node(ExprKind::kFilter, Line());
      f->name = t_[cur_++].value;
      if (Is(T::kOpenParen)) {
        f->has_call = true;
        MT_ASSIGN_OR_RETURN(f->args, ParseArgs(/*parameters=*/false));
      }
      s->expr = std::move(f);
      MT_RETURN_IF_ERROR(Expect(T::kCloseStatement, "'%}'"));
      MT_ASSIGN_OR_RETURN(s->body, ParseBodyUntil({"endfilter"}, "filter", line, "endfilter"));
      MT_RETURN_IF_ERROR(ExpectEnd("endfilter"));
    } else if (name == "break" || name == "continue") {
      s->kind = name == "break" ? StmtKind::kBreak : StmtKind::kContinue;
      MT_RETURN_IF_ERROR(Expect(T::kCloseStatement, "'%}'"));
    } else if (IsBlockEnd(name)) {
      return Status::Error("line " + std::to_string(line) + ": '{% " + name +
                           " %}' without a matching opening tag");
    } else {
      return Status::Error("line " + std::to_string(line) + ": unknown statement '" + name + "'");
    }
    return s;
  }

  Status ParseSet(Stmt* s) {
    MT_ASSIGN_OR_RETURN(s->target, ParseExpressionSequence(false));
    if (Is(T::kEquals)) {
      ++cur_;
      s->kind = StmtKind::kSet;
      MT_ASSIGN_OR_RETURN(s->expr, ParseExpressionSequence(false));
    } else {
      s->kind = StmtKind::kSetBlock;
      MT_RETURN_IF_ERROR(Expect(T::kCloseStatement, "'=' or '%}'"));
      MT_ASSIGN_OR_RETURN(s->body, ParseBodyUntil({"endset"}, "set", s->line, "endset"));
      MT_RETURN_IF_ERROR(Expect(T::kOpenStatement, "'{%'"));
      MT_RETURN_IF_ERROR(ExpectName("endset"));
    }
    return Expect(T::kCloseStatement, "'%}'");
  }

  // After `if` / `elif`: the test, the body, then elif / else parts (not the endif).
  Status ParseIfRest(Stmt* s) {
    DepthGuard guard(&depth_);
    MT_RETURN_IF_ERROR(CheckDepth());
    MT_ASSIGN_OR_RETURN(s->expr, ParseExpression());
    MT_RETURN_IF_ERROR(Expect(T::kCloseStatement, "'%}'"));
    MT_ASSIGN_OR_RETURN(s->body, ParseBodyUntil({"elif", "else", "endif"}, "if", s->line, "endif"));
    if (IsStatement({"elif"})) {
      auto elif = std::make_unique<Stmt>();
      elif->kind = StmtKind::kIf;
      elif->line = t_[cur_].line;
      cur_ += 2;
      MT_RETURN_IF_ERROR(ParseIfRest(elif.get()));
      s->orelse.push_back(std::move(elif));
    } else if (IsStatement({"else"})) {
      cur_ += 2;
      MT_RETURN_IF_ERROR(Expect(T::kCloseStatement, "'%}'"));
      MT_ASSIGN_OR_RETURN(s->orelse, ParseBodyUntil({"endif"}, "if", s->line, "endif"));
    }
    return OkStatus();
  }

  Status ParseFor(Stmt* s) {
    s->kind = StmtKind::kFor;
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
    MT_ASSIGN_OR_RETURN(s->body, ParseBodyUntil({"endfor", "else"}, "for", s->line, "endfor"));
    if (IsStatement({"else"})) {
      cur_ += 2;
      MT_RETURN_IF_ERROR(Expect(T::kCloseStatement, "'%}'"));
      MT_ASSIGN_OR_RETURN(s->orelse, ParseBodyUntil({"endfor"}, "for", s->line, "endfor"));
    }
    return ExpectEnd("endfor");
  }

  // ---- expressions ---------------------------------------------------------------------------
  Expected<ExprPtr> ParseExpressionSequence(bool primary) {
    const int line = Line();
    MT_ASSIGN_OR_RETURN(ExprPtr first, primary ? ParsePrimary() : ParseExpression());
    if (!Is(T::kComma)) return first;
    auto tuple = Node(ExprKind::kTuple, line);
    tuple->items.push_back(std::move(first));
    while (Is(T::kComma)) {
      ++cur_;
      MT_ASSIGN_OR_RETURN(ExprPtr next, primary ? ParsePrimary() : ParseExpression());
      tuple->items.push_back(std::move(next));
    }
    return tuple;
  }

  Expected<ExprPtr> ParseExpression() {
    DepthGuard guard(&depth_);
    MT_RETURN_IF_ERROR(CheckDepth());
    const int line = Line();
    MT_ASSIGN_OR_RETURN(ExprPtr value, ParseOr());
    if (!IsName("if")) return value;
    ++cur_;
    MT_ASSIGN_OR_RETURN(ExprPtr test, ParseOr());
    if (IsName("else")) {
      ++cur_;
      auto t = Node(ExprKind::kTernary, line);
      t->a = std::move(test);
      t->b = std::move(value);
      MT_ASSIGN_OR_RETURN(t->c, ParseExpression());
      return t;
    }
    auto sel = Node(ExprKind::kSelect, line);
    sel->a = std::move(test);
    sel->b = std::move(value);
    return sel;
  }

  Expected<ExprPtr> Binary(std::string op, ExprPtr left, ExprPtr right, int line) {
    auto e = Node(ExprKind::kBinary, line);
    e->name = std::move(op);
    e->a = std::move(left);
    e->b = std::move(right);
    return e;
  }

  Expected<ExprPtr> ParseOr() {
    MT_ASSIGN_OR_RETURN(ExprPtr left, ParseAnd());
    while (IsName("or")) {
      const int line = Line();
      ++cur_;
      MT_ASSIGN_OR_RETURN(ExprPtr right, ParseAnd());
      MT_ASSIGN_OR_RETURN(left, Binary("or", std::move(left), std::move(right), line));
    }
    return left;
  }

  Expected<ExprPtr> ParseAnd() {
    MT_ASSIGN_OR_RETURN(ExprPtr left, ParseNot());
    while (IsName("and")) {
      const int line = Line();
      ++cur_;
      MT_ASSIGN_OR_RETURN(ExprPtr right, ParseNot());
      MT_ASSIGN_OR_RETURN(left, Binary("and", std::move(left), std::move(right), line));
    }
    return left;
  }

  Expected<ExprPtr> ParseNot() {
    if (!IsName("not")) return ParseComparison();
    DepthGuard guard(&depth_);
    MT_RETURN_IF_ERROR(CheckDepth());
    auto e = Node(ExprKind::kUnary, Line());
    e->name = "not";
    ++cur_;
    MT_ASSIGN_OR_RETURN(e->a, ParseNot());
    return e;
  }

  Expected<ExprPtr> ParseComparison() {
    MT_ASSIGN_OR_RETURN(ExprPtr left, ParseAdditive());
    while (true) {
      const int line = Line();
      std::string op;
      if (IsName("not") && IsName("in", 1)) {
        op = "not in";
        cur_ += 2;
      } else if (IsName("in")) {
        op = "in";
        ++cur_;
      } else if (Is(T::kCompare)) {
        op = t_[cur_++].value;
      } else {
        break;
      }
      MT_ASSIGN_OR_RETURN(ExprPtr right, ParseAdditive());
      MT_ASSIGN_OR_RETURN(left, Binary(op, std::move(left), std::move(right), line));
    }
    return left;
  }

  Expected<ExprPtr> ParseAdditive() {
    MT_ASSIGN_OR_RETURN(ExprPtr left, ParseMultiplicative());
    while (Is(T::kAdditive)) {
      const int line = Line();
      std::string op = t_[cur_++].value;
      MT_ASSIGN_OR_RETURN(ExprPtr right, ParseMultiplicative());
      MT_ASSIGN_OR_RETURN(left, Binary(op, std::move(left), std::move(right), line));
    }
    return left;
  }

  Expected<ExprPtr> ParseMultiplicative() {
    MT_ASSIGN_OR_RETURN(ExprPtr left, ParsePower());
    while (Is(T::kMultiplicative)) {
      const int line = Line();
      std::string op = t_[cur_++].value;
      MT_ASSIGN_OR_RETURN(ExprPtr right, ParsePower());
      MT_ASSIGN_OR_RETURN(left, Binary(op, std::move(left), std::move(right), line));
    }
    return left;
  }

  Expected<ExprPtr> ParsePower() {
    MT_ASSIGN_OR_RETURN(ExprPtr left, ParseTest());
    while (Is(T::kPower)) {  // left-associative in Jinja
      const int line = Line();
      ++cur_;
      MT_ASSIGN_OR_RETURN(ExprPtr right, ParseTest());
      MT_ASSIGN_OR_RETURN(left, Binary("**", std::move(left), std::move(right), line));
    }
    return left;
  }

  Expected<ExprPtr> ParseTest() {
    MT_ASSIGN_OR_RETURN(ExprPtr operand, ParseFilter());
    while (IsName("is")) {
      auto e = Node(ExprKind::kTest, Line());
      ++cur_;
      if (IsName("not")) {
        e->negate = true;
        ++cur_;
      }
      if (!Is(T::kName)) return Error("expected a test name after 'is', found " + Found());
      e->name = t_[cur_++].value;
      if (Is(T::kOpenParen)) {  // `is divisibleby(3)`: arguments, a Jinja2 form
        e->has_call = true;
        MT_ASSIGN_OR_RETURN(e->args, ParseArgs(false));
      }
      e->a = std::move(operand);
      operand = std::move(e);
    }
    return operand;
  }

  Expected<ExprPtr> ParseFilter() {
    MT_ASSIGN_OR_RETURN(ExprPtr operand, ParseUnarySign());
    while (Is(T::kPipe)) {
      auto e = Node(ExprKind::kFilter, Line());
      ++cur_;
      if (!Is(T::kName)) return Error("expected a filter name after '|', found " + Found());
      e->name = t_[cur_++].value;
      if (Is(T::kOpenParen)) {
        e->has_call = true;
        MT_ASSIGN_OR_RETURN(e->args, ParseArgs(false));
      }
      e->a = std::move(operand);
      operand = std::move(e);
    }
    return operand;
  }

  Expected<ExprPtr> ParseUnarySign() {
    if ((Is(T::kUnary) || Is(T::kAdditive)) && (t_[cur_].value == "-" || t_[cur_].value == "+")) {
      DepthGuard guard(&depth_);
      MT_RETURN_IF_ERROR(CheckDepth());
      auto e = Node(ExprKind::kUnary, Line());
      e->name = t_[cur_++].value;
      MT_ASSIGN_OR_RETURN(e->a, ParseUnarySign());
      return e;
    }
    return ParseCallMember();
  }

  Expected<ExprPtr> ParseCallMember() {
    MT_ASSIGN_OR_RETURN(ExprPtr e, ParsePrimary());
    while (true) {
      if (Is(T::kDot) || Is(T::kOpenBracket)) {
        MT_ASSIGN_OR_RETURN(e, ParseMember(std::move(e)));
      } else if (Is(T::kOpenParen)) {
        auto call = Node(ExprKind::kCall, Line());
        call->a = std::move(e);
        MT_ASSIGN_OR_RETURN(call->args, ParseArgs(false));
        e = std::move(call);
      } else {
        return e;
      }
    }
  }

  Expected<ExprPtr> ParseMember(ExprPtr object) {
    const int line = Line();
    if (Is(T::kDot)) {
      ++cur_;
      auto e = Node(ExprKind::kAttr, line);
      e->a = std::move(object);
      if (Is(T::kName)) {
        e->name = t_[cur_++].value;
      } else if (Is(T::kNumber) && t_[cur_].value.find('.') == std::string::npos) {
        e->name = t_[cur_++].value;
        e->attr_is_index = true;
      } else {
        return Error("expected an attribute name after '.', found " + Found());
      }
      return e;
    }
    ++cur_;  // [
    std::vector<ExprPtr> parts;
    bool is_slice = false;
    while (!Is(T::kCloseBracket)) {
      if (AtEnd()) return Error("expected ']', found end of template");
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
    if (parts.empty())
      return Status::Error("line " + std::to_string(line) + ": empty subscript []");
    if (!is_slice) {
      if (parts.size() != 1)
        return Status::Error("line " + std::to_string(line) + ": bad subscript");
      auto e = Node(ExprKind::kIndex, line);
      e->a = std::move(object);
      e->b = std::move(parts[0]);
      return e;
    }
    if (parts.size() > 3) {
      return Status::Error("line " + std::to_string(line) + ": a slice takes at most 3 parts");
    }
    auto e = Node(ExprKind::kSlice, line);
    e->a = std::move(object);
    parts.resize(3);
    e->b = std::move(parts[0]);
    e->c = std::move(parts[1]);
    e->d = std::move(parts[2]);
    return e;
  }

  Expected<std::vector<Arg>> ParseArgs(bool parameters) {
    MT_RETURN_IF_ERROR(Expect(T::kOpenParen, "'('"));
    std::vector<Arg> args;
    bool saw_keyword = false;
    while (!Is(T::kCloseParen)) {
      if (AtEnd()) return Error("expected ')', found end of template");
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
      } else {
        MT_ASSIGN_OR_RETURN(ExprPtr value, ParseExpression());
        if (Is(T::kEquals)) {
          ++cur_;
          if (value->kind != ExprKind::kName) return Error("expected a name before '='");
          arg.kind = ArgKind::kKeyword;
          arg.name = value->name;
          MT_ASSIGN_OR_RETURN(arg.value, ParseExpression());
          saw_keyword = true;
        } else if (parameters) {
          if (value->kind != ExprKind::kName) return Error("expected a parameter name");
          if (saw_keyword) return Error("a parameter without default follows one with a default");
          arg.kind = ArgKind::kPositional;
          arg.name = value->name;
        } else {
          if (saw_keyword) return Error("positional argument after a keyword argument");
          arg.value = std::move(value);
        }
      }
      if (parameters) {
        for (const Arg& a : args)
          if (a.name == arg.name) return Error("duplicate parameter '" + arg.name + "'");
      }
      args.push_back(std::move(arg));
      if (Is(T::kComma)) ++cur_;
    }
    ++cur_;  // )
    return args;
  }

  Expected<ExprPtr> ParsePrimary() {
    DepthGuard guard(&depth_);
    MT_RETURN_IF_ERROR(CheckDepth());
    if (AtEnd()) return Error("expected an expression, found end of template");
    const Token& tok = t_[cur_++];
    switch (tok.type) {
      case T::kNumber: {
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
        std::string value = tok.value;
        while (Is(T::kString)) value += t_[cur_++].value;  // adjacent literals concatenate
        auto e = Node(ExprKind::kLiteral, tok.line);
        e->literal = Value::String(std::move(value));
        return e;
      }
      case T::kName: {
        auto e = Node(ExprKind::kName, tok.line);
        e->name = tok.value;
        return e;
      }
      case T::kOpenParen: {
        MT_ASSIGN_OR_RETURN(ExprPtr inner, ParseExpressionSequence(false));
        MT_RETURN_IF_ERROR(Expect(T::kCloseParen, "')'"));
        return inner;
      }
      case T::kOpenBracket: {
        auto e = Node(ExprKind::kList, tok.line);
        while (!Is(T::kCloseBracket)) {
          if (AtEnd()) return Error("expected ']', found end of template");
          MT_ASSIGN_OR_RETURN(ExprPtr item, ParseExpression());
          e->items.push_back(std::move(item));
          if (Is(T::kComma)) ++cur_;
        }
        ++cur_;
        return e;
      }
      case T::kOpenBrace: {
        auto e = Node(ExprKind::kDict, tok.line);
        while (!Is(T::kCloseBrace)) {
          if (AtEnd()) return Error("expected '}', found end of template");
          MT_ASSIGN_OR_RETURN(ExprPtr key, ParseExpression());
          MT_RETURN_IF_ERROR(Expect(T::kColon, "':' in a dict literal"));
          MT_ASSIGN_OR_RETURN(ExprPtr value, ParseExpression());
          e->pairs.emplace_back(std::move(key), std::move(value));
          if (Is(T::kComma)) ++cur_;
        }
        ++cur_;
        return e;
      }
      default:
        --cur_;
        return Error("expected an expression, found " + Found());
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
