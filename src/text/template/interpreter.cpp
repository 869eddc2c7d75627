#include "text/template/interpreter.h"

#include <cmath>
#include <utility>

#include "text/template/builtins.h"
#include "text/template/utf8.h"

namespace moetier::text::jinja {

[[gnu::noinline]] Status ErrorAt(int line, const std::string& message) {
  return Status::Error("line " + std::to_string(line) + ": " + message);
}

Status AtLine(int line, const Status& status) {
  if (status.ok() || status.message().rfind("line ", 0) == 0) return status;
  return ErrorAt(line, status.message());
}

Status Interpreter::CheckString(size_t bytes) const {
  if (bytes <= limits_.max_output_bytes) return OkStatus();
  return Status::Error("output exceeds the limit of " + std::to_string(limits_.max_output_bytes) +
                       " bytes");
}

Status Interpreter::CheckList(size_t items) const {
  if (items <= limits_.max_list_items) return OkStatus();
  return Status::Error("list exceeds the limit of " + std::to_string(limits_.max_list_items) +
                       " items");
}

Status Interpreter::Step() {
  if (++steps_ <= limits_.max_steps) return OkStatus();
  return Status::Error("template exceeded the limit of " + std::to_string(limits_.max_steps) +
                       " evaluation steps (a runaway loop?)");
}

Status Interpreter::NestingError() const {
  return Status::Error("the render nests deeper than " + std::to_string(limits_.max_depth) +
                       " levels (statements and expressions, counting through macro calls)");
}

Status Interpreter::Raise(std::string message) {
  raised_ = std::move(message);
  return Status::Error("raise_exception: " + *raised_);
}

std::tm Interpreter::Now() const {
  if (now_) return *now_;
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  return tm;
}

Expected<Value> Interpreter::Call(const Value& fn, CallArgs& args, const CallSite& site) {
  if (!fn.is_function()) return Status::Error(std::string("cannot call a ") + TypeName(fn));
  return fn.as_function().call(args, site);
}

Expected<std::string> Interpreter::Render(const Body& body, std::shared_ptr<Scope> globals) {
  std::string out;
  Expected<Flow> flow = Exec(body, globals, &out);
  for (Value& ns : namespaces_) ns.namespace_dict() = ValueDict();  // breaks any cycle
  namespaces_.clear();
  if (!flow.ok()) return flow.status();
  if (*flow != Flow::kNormal) return Status::Error("'break' or 'continue' outside a for loop");
  return out;
}

Status Interpreter::Append(std::string* out, std::string_view text) const {
  MT_RETURN_IF_ERROR(CheckString(out->size() + text.size()));
  out->append(text);
  return OkStatus();
}

Expected<std::string> Interpreter::RenderBlock(const Body& body,
                                               const std::shared_ptr<Scope>& scope) {
  std::string out;
  MT_ASSIGN_OR_RETURN(Flow flow, Exec(body, scope, &out));
  if (flow != Flow::kNormal) return Status::Error("'break' or 'continue' outside a for loop");
  return out;
}

// ---- statements ----------------------------------------------------------------------------

Expected<Interpreter::Flow> Interpreter::Exec(const Body& body, const std::shared_ptr<Scope>& scope,
                                              std::string* out) {
  for (const StmtPtr& s : body) {
    MT_ASSIGN_OR_RETURN(Flow flow, ExecOne(*s, scope, out));
    if (flow != Flow::kNormal) return flow;
  }
  return Flow::kNormal;
}

Expected<Interpreter::Flow> Interpreter::ExecOne(const Stmt& s, const std::shared_ptr<Scope>& scope,
                                                 std::string* out) {
  MT_RETURN_IF_ERROR(AtLine(s.line, Step()));
  NestingGuard level = Nest();
  if (level.exceeded()) return AtLine(s.line, NestingError());
  switch (s.kind) {
    case StmtKind::kIf:
      return ExecIf(s, scope, out);
    case StmtKind::kFor:
      return ExecFor(s, scope, out);
    case StmtKind::kBreak:
      return Flow::kBreak;
    case StmtKind::kContinue:
      return Flow::kContinue;
    default:
      MT_RETURN_IF_ERROR(ExecSimple(s, scope, out));
      return Flow::kNormal;
  }
}

[[gnu::noinline]] Expected<Interpreter::Flow> Interpreter::ExecIf(
    const Stmt& s, const std::shared_ptr<Scope>& scope, std::string* out) {
  MT_ASSIGN_OR_RETURN(const bool yes, EvalTruth(*s.expr, scope));
  return Exec(yes ? s.body : s.orelse, scope, out);
}

[[gnu::noinline]] Expected<bool> Interpreter::EvalTruth(const Expr& e,
                                                        const std::shared_ptr<Scope>& scope) {
  MT_ASSIGN_OR_RETURN(Value v, Eval(e, scope));
  return Truthy(v);
}

// Every statement but if, for, break and continue: those that produce no control flow. Each
// kind has its own function, so that the blocks among them (set and filter blocks) recurse
// through small frames.
[[gnu::noinline]] Status Interpreter::ExecSimple(const Stmt& s, const std::shared_ptr<Scope>& scope,
                                                 std::string* out) {
  switch (s.kind) {
    case StmtKind::kText:
      return AtLine(s.line, Append(out, s.text));
    case StmtKind::kOutput:
      return ExecOutput(s, scope, out);
    case StmtKind::kSet:
    case StmtKind::kSetBlock:
      return ExecSetStatement(s, scope);
    case StmtKind::kMacro:
      return ExecMacroDefinition(s, scope);
    case StmtKind::kCallBlock:
      return ExecCallBlock(s, scope, out);
    case StmtKind::kFilterBlock:
      return ExecFilterBlock(s, scope, out);
    default:
      return ErrorAt(s.line, "internal error: not a simple statement");
  }
}

[[gnu::noinline]] Status Interpreter::ExecOutput(const Stmt& s, const std::shared_ptr<Scope>& scope,
                                                 std::string* out) {
  MT_ASSIGN_OR_RETURN(Value v, Eval(*s.expr, scope));
  auto text = ToOutputString(v);
  if (!text.ok()) return ErrorAt(s.line, text.message());
  return AtLine(s.line, Append(out, *text));
}

// `set target = expr`, or the block form `set target %}body{% endset`.
[[gnu::noinline]] Status Interpreter::ExecSetStatement(const Stmt& s,
                                                       const std::shared_ptr<Scope>& scope) {
  if (s.kind == StmtKind::kSetBlock) {
    MT_ASSIGN_OR_RETURN(std::string text, RenderBlock(s.body, scope));
    return ExecSet(s, scope, Value::String(std::move(text)));
  }
  MT_ASSIGN_OR_RETURN(Value v, Eval(*s.expr, scope));
  return ExecSet(s, scope, std::move(v));
}

[[gnu::noinline]] Status Interpreter::ExecMacroDefinition(const Stmt& s,
                                                          const std::shared_ptr<Scope>& scope) {
  scope->vars[s.text] = MakeMacro(s, "'" + s.text + "'", &s.params, &s.body, nullptr);
  return OkStatus();
}

[[gnu::noinline]] Status Interpreter::ExecFilterBlock(const Stmt& s,
                                                      const std::shared_ptr<Scope>& scope,
                                                      std::string* out) {
  MT_ASSIGN_OR_RETURN(std::string text, RenderBlock(s.body, scope));
  MT_ASSIGN_OR_RETURN(CallArgs args, EvalArgs(s.expr->args, scope));
  auto v = ApplyFilter(s.expr->name, Value::String(std::move(text)), args,
                       CallSite{this, scope, s.line});
  if (!v.ok()) return AtLine(s.line, v.status());
  auto printed = ToOutputString(*v);
  if (!printed.ok()) return ErrorAt(s.line, printed.message());
  return AtLine(s.line, Append(out, *printed));
}

namespace {

Status BindLoopTarget(const Expr& target, const Value& item, Scope* scope, int line) {
  if (target.kind == ExprKind::kName) {
    scope->vars[target.name] = item;
    return OkStatus();
  }
  if (!item.is_list()) {
    return ErrorAt(line, std::string("cannot unpack a ") + TypeName(item) + " into " +
                             std::to_string(target.items.size()) + " loop variables");
  }
  const ValueList& parts = item.as_list();
  if (parts.size() != target.items.size()) {
    return ErrorAt(line, "cannot unpack " + std::to_string(parts.size()) + " values into " +
                             std::to_string(target.items.size()) + " loop variables");
  }
  for (size_t i = 0; i < parts.size(); ++i) scope->vars[target.items[i]->name] = parts[i];
  return OkStatus();
}

}  // namespace

[[gnu::noinline]] Expected<Interpreter::Flow> Interpreter::ExecFor(
    const Stmt& s, const std::shared_ptr<Scope>& outer, std::string* out) {
  auto scope = std::make_shared<Scope>();
  scope->parent = outer;
  MT_ASSIGN_OR_RETURN(const ValueList items, LoopItems(s, scope));
  for (size_t i = 0; i < items.size(); ++i) {
    MT_RETURN_IF_ERROR(BindLoopVariables(s, items, i, scope.get()));
    MT_ASSIGN_OR_RETURN(Flow flow, Exec(s.body, scope, out));
    if (flow == Flow::kBreak) break;
  }
  // Jinja2's rule: the else block runs when there was nothing to iterate over.
  if (items.empty()) return Exec(s.orelse, scope, out);
  return Flow::kNormal;
}

// What a `for` iterates over: the items of a list, the keys of a dict, the characters of a
// string; with `for x in xs if cond`, only those passing cond (filtered first, so loop.length
// counts the kept items).
[[gnu::noinline]] Expected<ValueList> Interpreter::LoopItems(const Stmt& s,
                                                             const std::shared_ptr<Scope>& scope) {
  MT_ASSIGN_OR_RETURN(Value iterable, Eval(*s.expr, scope));
  ValueList all;
  if (iterable.is_list()) {
    all = iterable.as_list();
  } else if (iterable.is_dict()) {  // a dict iterates over its keys
    for (const auto& [k, v] : iterable.as_dict().entries()) all.push_back(Value::String(k));
  } else if (iterable.is_string()) {  // Jinja2 iterates over characters
    const std::string& str = iterable.as_string();
    for (size_t i = 0; i < str.size();) {
      std::string ch;
      utf8::Append(&ch, utf8::Next(str, &i));
      all.push_back(Value::String(std::move(ch)));
    }
  } else {
    return ErrorAt(s.line,
                   std::string("cannot iterate over a ") + TypeName(iterable) + " in 'for'");
  }
  if (!s.cond) return all;
  ValueList items;
  for (const Value& item : all) {
    auto test_scope = std::make_shared<Scope>();
    test_scope->parent = scope;
    MT_RETURN_IF_ERROR(BindLoopTarget(*s.target, item, test_scope.get(), s.line));
    MT_ASSIGN_OR_RETURN(Value keep, Eval(*s.cond, test_scope));
    if (Truthy(keep)) items.push_back(item);
  }
  return items;
}

// `loop` and the loop variables for iteration i over items.
[[gnu::noinline]] Status Interpreter::BindLoopVariables(const Stmt& s, const ValueList& items,
                                                        size_t i, Scope* scope) {
  MT_RETURN_IF_ERROR(AtLine(s.line, Step()));
  const auto n = static_cast<int64_t>(items.size());
  const auto k = static_cast<int64_t>(i);
  ValueDict loop;
  loop.Set("index", Value::Int(k + 1));
  loop.Set("index0", Value::Int(k));
  loop.Set("revindex", Value::Int(n - k));
  loop.Set("revindex0", Value::Int(n - k - 1));
  loop.Set("first", Value::Bool(k == 0));
  loop.Set("last", Value::Bool(k == n - 1));
  loop.Set("length", Value::Int(n));
  loop.Set("previtem", k > 0 ? items[i - 1] : Value());
  loop.Set("nextitem", k + 1 < n ? items[i + 1] : Value());
  scope->vars["loop"] = Value::Dict(std::move(loop));
  return BindLoopTarget(*s.target, items[i], scope, s.line);
}

Status Interpreter::ExecSet(const Stmt& s, const std::shared_ptr<Scope>& scope, Value value) {
  const Expr& target = *s.target;
  switch (target.kind) {
    case ExprKind::kName:
      scope->vars[target.name] = std::move(value);
      return OkStatus();
    case ExprKind::kTuple: {
      if (!value.is_list()) {
        return ErrorAt(s.line, std::string("cannot unpack a ") + TypeName(value) + " in 'set'");
      }
      const ValueList& parts = value.as_list();
      if (parts.size() != target.items.size()) {
        return ErrorAt(s.line, "cannot unpack " + std::to_string(parts.size()) + " values into " +
                                   std::to_string(target.items.size()) + " names in 'set'");
      }
      for (size_t i = 0; i < parts.size(); ++i) {
        if (target.items[i]->kind != ExprKind::kName) {
          return ErrorAt(s.line, "'set' can only unpack into names");
        }
        scope->vars[target.items[i]->name] = parts[i];
      }
      return OkStatus();
    }
    case ExprKind::kAttr: {
      MT_ASSIGN_OR_RETURN(Value object, Eval(*target.a, scope));
      if (!object.is_namespace()) {
        return ErrorAt(s.line, std::string("cannot set attribute '") + target.name + "' on a " +
                                   TypeName(object) + "; only a namespace() takes attributes");
      }
      object.namespace_dict().Set(target.name, std::move(value));
      return OkStatus();
    }
    default:
      return ErrorAt(s.line, "'set' needs a name, a tuple of names or namespace.attribute");
  }
}

Value Interpreter::MakeMacro(const Stmt& s, std::string display_name,
                             const std::vector<Arg>* params, const Body* body,
                             std::shared_ptr<Scope> defining_scope) {
  const int line = s.line;
  return Value::Func(std::move(display_name),
                     [params, body, defining_scope, line](CallArgs& args,
                                                          const CallSite& site) -> Expected<Value> {
                       return site.interpreter->CallMacro(*params, *body, defining_scope, line,
                                                          args, site);
                     });
}

[[gnu::noinline]] Expected<Value> Interpreter::CallMacro(
    const std::vector<Arg>& params, const Body& body, const std::shared_ptr<Scope>& defining_scope,
    int line, CallArgs& args, const CallSite& site) {
  if (call_depth_ >= limits_.max_call_depth) return CallDepthError(site.line);
  ++call_depth_;
  struct DepthRestore {
    int* d;
    ~DepthRestore() { --*d; }
  } restore{&call_depth_};
  MT_ASSIGN_OR_RETURN(std::shared_ptr<Scope> scope,
                      BindMacroArguments(params, defining_scope, args, site));
  auto text = RenderBlock(body, scope);
  if (!text.ok()) return AtLine(line, text.status());
  return Value::String(std::move(text).value());
}

[[gnu::noinline]] Status Interpreter::CallDepthError(int line) const {
  return ErrorAt(line, "macro calls nested deeper than " + std::to_string(limits_.max_call_depth) +
                           " (runaway recursion?)");
}

// The scope a macro body runs in: its parameters bound to the arguments (defaults evaluated
// there), the rest in varargs and kwargs. Macros see their caller's variables (as in
// @huggingface/jinja); a call block's body sees the scope it was written in.
[[gnu::noinline]] Expected<std::shared_ptr<Scope>> Interpreter::BindMacroArguments(
    const std::vector<Arg>& params, const std::shared_ptr<Scope>& defining_scope,
    const CallArgs& args, const CallSite& site) {
  auto scope = std::make_shared<Scope>();
  scope->parent = defining_scope ? defining_scope : site.scope;
  std::vector<std::pair<std::string, Value>> keywords = args.keyword;
  std::vector<const Arg*> pending_defaults;
  for (size_t i = 0; i < params.size(); ++i) {
    const Arg& p = params[i];
    std::optional<Value> v;
    if (i < args.positional.size()) v = args.positional[i];
    for (auto it = keywords.begin(); !v && it != keywords.end(); ++it) {
      if (it->first == p.name) {
        v = it->second;
        keywords.erase(it);
        break;
      }
    }
    if (!v && p.value) pending_defaults.push_back(&p);
    scope->vars[p.name] = v ? *v : Value();
  }
  ValueList varargs;
  for (size_t i = params.size(); i < args.positional.size(); ++i) {
    varargs.push_back(args.positional[i]);
  }
  ValueDict kwargs;
  for (auto& [k, v] : keywords) kwargs.Set(k, v);
  scope->vars["varargs"] = Value::List(std::move(varargs));
  scope->vars["kwargs"] = Value::Dict(std::move(kwargs));
  for (const Arg* p : pending_defaults) {
    auto v = Eval(*p->value, scope);
    if (!v.ok()) return v.status();
    scope->vars[p->name] = std::move(v).value();
  }
  return scope;
}

[[gnu::noinline]] Status Interpreter::ExecCallBlock(const Stmt& s,
                                                    const std::shared_ptr<Scope>& scope,
                                                    std::string* out) {
  const Expr& call = *s.expr;
  Value caller = MakeMacro(s, "caller", &s.params, &s.body, scope);
  MT_ASSIGN_OR_RETURN(CallArgs args, EvalArgs(call.args, scope));
  MT_ASSIGN_OR_RETURN(Value fn, Eval(*call.a, scope));
  if (!fn.is_function()) {
    return ErrorAt(s.line, "'" + call.a->name + "' is not a macro (it is a " + TypeName(fn) + ")");
  }
  auto call_scope = std::make_shared<Scope>();
  call_scope->parent = scope;
  call_scope->vars["caller"] = std::move(caller);
  auto result = fn.as_function().call(args, CallSite{this, call_scope, s.line});
  if (!result.ok()) return AtLine(s.line, result.status());
  auto text = ToOutputString(*result);
  if (!text.ok()) return ErrorAt(s.line, text.message());
  return AtLine(s.line, Append(out, *text));
}

// ---- expressions ---------------------------------------------------------------------------

namespace {

// How an expression reads in an error message: `messages[0].content`, `foo`, ...
std::string Spell(const Expr& e) {
  switch (e.kind) {
    case ExprKind::kName:
      return e.name;
    case ExprKind::kAttr:
      return Spell(*e.a) + "." + e.name;
    case ExprKind::kIndex:
      if (e.b->kind == ExprKind::kLiteral && e.b->literal.is_string()) {
        return Spell(*e.a) + "['" + e.b->literal.as_string() + "']";
      }
      if (e.b->kind == ExprKind::kLiteral && e.b->literal.is_int()) {
        return Spell(*e.a) + "[" + std::to_string(e.b->literal.as_int()) + "]";
      }
      return Spell(*e.a) + "[...]";
    case ExprKind::kCall:
      return Spell(*e.a) + "(...)";
    case ExprKind::kList:
      return "[...]";
    case ExprKind::kDict:
      return "{...}";
    case ExprKind::kFilter:
      return Spell(*e.a) + "|" + e.name;
    case ExprKind::kLiteral:
      if (e.literal.is_string()) return "'" + e.literal.as_string() + "'";
      return "literal";
    default:
      return "expression";
  }
}

bool AddOverflows(int64_t a, int64_t b, int64_t* r) {
  return __builtin_add_overflow(a, b, r);
}
bool SubOverflows(int64_t a, int64_t b, int64_t* r) {
  return __builtin_sub_overflow(a, b, r);
}
bool MulOverflows(int64_t a, int64_t b, int64_t* r) {
  return __builtin_mul_overflow(a, b, r);
}

// object[start:stop:step] of a list or string, each part optional.
[[gnu::noinline]] Value Slice(const Value& object, const std::optional<int64_t> (&parts)[3]) {
  const int64_t step = parts[2].value_or(1);
  std::vector<char32_t> cps;
  if (object.is_string()) cps = utf8::Decode(object.as_string());
  const auto n = static_cast<int64_t>(object.is_list() ? object.as_list().size() : cps.size());
  // The index arithmetic of @huggingface/jinja's slice(), which follows Python's for the
  // usual forms ([a:b], [::-1], [1:], [:-1]).
  std::vector<int64_t> picks;
  if (step > 0) {
    int64_t start = parts[0].value_or(0);
    int64_t stop = parts[1].value_or(n);
    start = start < 0 ? std::max<int64_t>(n + start, 0) : std::min(start, n);
    stop = stop < 0 ? std::max<int64_t>(n + stop, 0) : std::min(stop, n);
    for (int64_t i = start; i < stop; i += step) picks.push_back(i);
  } else if (step < 0) {
    int64_t start = parts[0].value_or(n - 1);
    int64_t stop = parts[1].value_or(-1);
    start = start < 0 ? std::max<int64_t>(n + start, -1) : std::min(start, n - 1);
    stop = stop < -1 ? std::max<int64_t>(n + stop, -1) : std::min(stop, n - 1);
    for (int64_t i = start; i > stop; i += step) picks.push_back(i);
  }
  if (object.is_list()) {
    ValueList out;
    out.reserve(picks.size());
    for (int64_t i : picks) out.push_back(object.as_list()[static_cast<size_t>(i)]);
    return Value::List(std::move(out));
  }
  std::string out;
  for (int64_t i : picks) utf8::Append(&out, cps[static_cast<size_t>(i)]);
  return Value::String(std::move(out));
}

// The key `.name` looks up: a string, or an integer for `a.0`.
[[gnu::noinline]] Value AttrKey(const Expr& e) {
  return e.attr_is_index ? Value::Int(std::strtoll(e.name.c_str(), nullptr, 10))
                         : Value::String(e.name);
}

// `not v`, `-v`, `+v`.
[[gnu::noinline]] Expected<Value> ApplyUnary(const Expr& e, const Value& v) {
  if (e.name == "not") return Value::Bool(!Truthy(v));
  const bool negate = e.name == "-";
  if (v.is_float()) return Value::Float(negate ? -v.as_float() : v.as_float());
  if (v.is_int() || v.is_bool()) {
    const int64_t i = v.is_int() ? v.as_int() : (v.as_bool() ? 1 : 0);
    int64_t r = 0;
    if (negate && SubOverflows(0, i, &r)) return ErrorAt(e.line, "integer overflow");
    return Value::Int(negate ? r : i);
  }
  return ErrorAt(e.line, "unary '" + e.name + "' needs a number, got a " + TypeName(v) + " (" +
                             Spell(*e.a) + ")");
}

// `left op right` for every binary operator but `and` and `or` (which short-circuit).
[[gnu::noinline]] Expected<Value> ApplyBinary(const Interpreter& interp, const Expr& e,
                                              const Value& left, const Value& right) {
  const std::string& op = e.name;
  if (op == "==") return Value::Bool(LooseEquals(left, right));
  if (op == "!=") return Value::Bool(!LooseEquals(left, right));
  const bool membership = op == "in" || op == "not in";
  if (left.is_undefined() || right.is_undefined()) {
    if (right.is_undefined() && membership) return Value::Bool(op == "not in");
    const Expr& which = left.is_undefined() ? *e.a : *e.b;
    return ErrorAt(e.line, "cannot apply '" + op + "': " + Spell(which) + " is undefined");
  }
  if (left.is_none() || right.is_none()) {
    const Expr& which = left.is_none() ? *e.a : *e.b;
    return ErrorAt(e.line, "cannot apply '" + op + "': " + Spell(which) + " is none");
  }
  if (op == "~") {
    auto a = ToOutputString(left);
    auto b = ToOutputString(right);
    if (!a.ok() || !b.ok()) return ErrorAt(e.line, "cannot apply '~' to a function");
    MT_RETURN_IF_ERROR(AtLine(e.line, interp.CheckString(a->size() + b->size())));
    return Value::String(*a + *b);
  }
  const bool numeric =
      (left.is_number() || left.is_bool()) && (right.is_number() || right.is_bool());
  if (op == "**" && numeric) {
    const double a = left.as_number();
    const double b = right.as_number();
    if (a == 0 && b < 0) return ErrorAt(e.line, "0 cannot be raised to a negative power");
    const double r = std::pow(a, b);
    if (!std::isfinite(r)) return ErrorAt(e.line, "'**' result is not a finite number");
    if (left.is_float() || right.is_float() || b < 0 || std::fabs(r) >= 9.2e18) {
      return Value::Float(r);
    }
    return Value::Int(static_cast<int64_t>(r));
  }
  if (left.is_number() && right.is_number()) {
    const bool as_float = left.is_float() || right.is_float();
    const double a = left.as_number();
    const double b = right.as_number();
    if (op == "<") return Value::Bool(a < b);
    if (op == ">") return Value::Bool(a > b);
    if (op == "<=") return Value::Bool(a <= b);
    if (op == ">=") return Value::Bool(a >= b);
    if (op == "/") {
      if (b == 0) return ErrorAt(e.line, "division by zero");
      return Value::Float(a / b);
    }
    if ((op == "//" || op == "%") && b == 0) return ErrorAt(e.line, "division by zero");
    if (!as_float) {
      const int64_t x = left.as_int();
      const int64_t y = right.as_int();
      int64_t r = 0;
      if (op == "+" && !AddOverflows(x, y, &r)) return Value::Int(r);
      if (op == "-" && !SubOverflows(x, y, &r)) return Value::Int(r);
      if (op == "*" && !MulOverflows(x, y, &r)) return Value::Int(r);
      if (op == "//" || op == "%") {
        if (x == INT64_MIN && y == -1) return ErrorAt(e.line, "integer overflow");
        int64_t q = x / y;
        int64_t m = x % y;
        if (m != 0 && ((m < 0) != (y < 0))) {  // floor, as Python does
          --q;
          m += y;
        }
        return Value::Int(op == "//" ? q : m);
      }
      if (op == "+" || op == "-" || op == "*") return ErrorAt(e.line, "integer overflow");
    } else {
      if (op == "+") return Value::Float(a + b);
      if (op == "-") return Value::Float(a - b);
      if (op == "*") return Value::Float(a * b);
      if (op == "//") return Value::Float(std::floor(a / b));
      if (op == "%") {
        double m = std::fmod(a, b);
        if (m != 0 && ((m < 0) != (b < 0))) m += b;
        return Value::Float(m);
      }
    }
  }
  if (left.is_list() && right.is_list() && op == "+") {
    ValueList joined = left.as_list();
    MT_RETURN_IF_ERROR(AtLine(e.line, interp.CheckList(joined.size() + right.as_list().size())));
    joined.insert(joined.end(), right.as_list().begin(), right.as_list().end());
    return Value::List(std::move(joined));
  }
  if (right.is_list() && membership) {
    bool found = false;
    for (const Value& item : right.as_list()) found = found || StrictEquals(left, item);
    return Value::Bool(found == (op == "in"));
  }
  if (op == "+" && (left.is_string() || right.is_string())) {
    // Strings concatenate with numbers and booleans too (@huggingface/jinja); a container on
    // the other side is an error, as in Python.
    const Value& other = left.is_string() ? right : left;
    if (other.is_list() || other.is_dict() || other.is_namespace() || other.is_function()) {
      return ErrorAt(e.line, std::string("cannot concatenate a string and a ") + TypeName(other) +
                                 " with '+' (" + Spell(left.is_string() ? *e.b : *e.a) + ")");
    }
    auto a = ToOutputString(left);
    auto b = ToOutputString(right);
    MT_RETURN_IF_ERROR(AtLine(e.line, interp.CheckString(a->size() + b->size())));
    return Value::String(*a + *b);
  }
  if (left.is_string() && right.is_string()) {
    const std::string& a = left.as_string();
    const std::string& b = right.as_string();
    if (membership) return Value::Bool((b.find(a) != std::string::npos) == (op == "in"));
    // Comparing strings is a Jinja2 feature @huggingface/jinja lacks; code-point order.
    if (op == "<") return Value::Bool(a < b);
    if (op == ">") return Value::Bool(a > b);
    if (op == "<=") return Value::Bool(a <= b);
    if (op == ">=") return Value::Bool(a >= b);
  }
  if (left.is_string() && right.is_dict() && membership) {
    const bool found = right.as_dict().Find(left.as_string()) != nullptr;
    return Value::Bool(found == (op == "in"));
  }
  return ErrorAt(e.line, "unsupported operand types for '" + op + "': " + TypeName(left) + " and " +
                             TypeName(right));
}

}  // namespace

Expected<Value> Interpreter::Eval(const Expr& e, const std::shared_ptr<Scope>& scope) {
  MT_RETURN_IF_ERROR(AtLine(e.line, Step()));
  NestingGuard level = Nest();
  if (level.exceeded()) return AtLine(e.line, NestingError());
  switch (e.kind) {
    case ExprKind::kLiteral:
      return e.literal;
    case ExprKind::kName: {
      const Value* v = scope->Lookup(e.name);
      return v ? *v : Value();
    }
    case ExprKind::kList:
    case ExprKind::kTuple:
      return EvalList(e, scope);
    case ExprKind::kDict:
      return EvalDict(e, scope);
    case ExprKind::kAttr:
      return EvalAttr(e, scope);
    case ExprKind::kIndex:
      return EvalIndex(e, scope);
    case ExprKind::kSlice:
      return EvalSlice(e, scope);
    case ExprKind::kCall:
      return EvalCall(e, scope);
    case ExprKind::kFilter:
      return EvalFilter(e, scope);
    case ExprKind::kTest:
      return EvalTest(e, scope);
    case ExprKind::kUnary:
      return EvalUnary(e, scope);
    case ExprKind::kBinary:
      return EvalBinary(e, scope);
    case ExprKind::kTernary:
    case ExprKind::kSelect:
      return EvalConditional(e, scope);
  }
  return Value();
}

[[gnu::noinline]] Expected<Value> Interpreter::EvalList(const Expr& e,
                                                        const std::shared_ptr<Scope>& scope) {
  ValueList items;
  items.reserve(e.items.size());
  for (const ExprPtr& item : e.items) {
    MT_ASSIGN_OR_RETURN(Value v, Eval(*item, scope));
    items.push_back(std::move(v));
  }
  return Value::List(std::move(items));
}

[[gnu::noinline]] Expected<Value> Interpreter::EvalDict(const Expr& e,
                                                        const std::shared_ptr<Scope>& scope) {
  ValueDict dict;
  for (const auto& [k, v] : e.pairs) {
    MT_ASSIGN_OR_RETURN(Value key, Eval(*k, scope));
    if (!key.is_string()) {
      return ErrorAt(e.line, std::string("dict keys must be strings, got a ") + TypeName(key));
    }
    MT_ASSIGN_OR_RETURN(Value value, Eval(*v, scope));
    dict.Set(key.as_string(), std::move(value));
  }
  return Value::Dict(std::move(dict));
}

[[gnu::noinline]] Expected<Value> Interpreter::EvalAttr(const Expr& e,
                                                        const std::shared_ptr<Scope>& scope) {
  MT_ASSIGN_OR_RETURN(Value object, Eval(*e.a, scope));
  return EvalMember(e, object, AttrKey(e));
}

[[gnu::noinline]] Expected<Value> Interpreter::EvalIndex(const Expr& e,
                                                         const std::shared_ptr<Scope>& scope) {
  MT_ASSIGN_OR_RETURN(Value object, Eval(*e.a, scope));
  MT_ASSIGN_OR_RETURN(Value key, Eval(*e.b, scope));
  return EvalMember(e, object, key);
}

[[gnu::noinline]] Expected<Value> Interpreter::EvalUnary(const Expr& e,
                                                         const std::shared_ptr<Scope>& scope) {
  MT_ASSIGN_OR_RETURN(Value v, Eval(*e.a, scope));
  return ApplyUnary(e, v);
}

// `b if a else c`, and `b if a` (undefined when a is false).
[[gnu::noinline]] Expected<Value> Interpreter::EvalConditional(
    const Expr& e, const std::shared_ptr<Scope>& scope) {
  MT_ASSIGN_OR_RETURN(const bool yes, EvalTruth(*e.a, scope));
  if (yes) return Eval(*e.b, scope);
  if (e.kind == ExprKind::kSelect) return Value();
  return Eval(*e.c, scope);
}

[[gnu::noinline]] Expected<Value> Interpreter::EvalMember(const Expr& e, const Value& object,
                                                          const Value& key) {
  if (object.is_dict() || object.is_namespace()) {
    if (!key.is_string()) {
      return ErrorAt(e.line, std::string("cannot index a ") + TypeName(object) + " with a " +
                                 TypeName(key) + " (" + Spell(e) + ")");
    }
    const ValueDict& dict = object.is_dict() ? object.as_dict() : object.namespace_dict();
    if (const Value* v = dict.Find(key.as_string())) return *v;
    return object.is_dict() ? LookupMethod(object, key.as_string()) : Value();
  }
  if (object.is_list() || object.is_string()) {
    if (key.is_int()) {
      int64_t i = key.as_int();
      if (object.is_list()) {
        const auto n = static_cast<int64_t>(object.as_list().size());
        if (i < 0) i += n;
        if (i < 0 || i >= n) return Value();
        return object.as_list()[static_cast<size_t>(i)];
      }
      const std::vector<char32_t> cps = utf8::Decode(object.as_string());
      const auto n = static_cast<int64_t>(cps.size());
      if (i < 0) i += n;
      if (i < 0 || i >= n) return Value();
      std::string ch;
      utf8::Append(&ch, cps[static_cast<size_t>(i)]);
      return Value::String(std::move(ch));
    }
    if (key.is_string()) return LookupMethod(object, key.as_string());
    return ErrorAt(e.line, std::string("cannot index a ") + TypeName(object) + " with a " +
                               TypeName(key) + " (" + Spell(e) + ")");
  }
  if (!key.is_string()) {
    return ErrorAt(e.line, std::string("cannot index a ") + TypeName(object) + " with a " +
                               TypeName(key) + " (" + Spell(e) + ")");
  }
  // Attributes of undefined and none are undefined, as in @huggingface/jinja.
  return LookupMethod(object, key.as_string());
}

[[gnu::noinline]] Expected<Value> Interpreter::EvalSlice(const Expr& e,
                                                         const std::shared_ptr<Scope>& scope) {
  MT_ASSIGN_OR_RETURN(Value object, Eval(*e.a, scope));
  if (!object.is_list() && !object.is_string()) {
    return ErrorAt(e.line,
                   std::string("cannot slice a ") + TypeName(object) + " (" + Spell(*e.a) + ")");
  }
  std::optional<int64_t> parts[3];
  const Expr* exprs[3] = {e.b.get(), e.c.get(), e.d.get()};
  for (int k = 0; k < 3; ++k) {
    if (!exprs[k]) continue;
    MT_ASSIGN_OR_RETURN(Value v, Eval(*exprs[k], scope));
    if (v.is_int()) {
      parts[k] = v.as_int();
    } else if (!v.is_undefined() && !v.is_none()) {
      return ErrorAt(e.line, std::string("slice bounds must be integers, got a ") + TypeName(v));
    }
  }
  return Slice(object, parts);
}

// Positional arguments (with * unpacking) first, then keywords, as Python evaluates them.
[[gnu::noinline]] Expected<CallArgs> Interpreter::EvalArgs(const std::vector<Arg>& args,
                                                           const std::shared_ptr<Scope>& scope) {
  CallArgs out;
  for (const bool keywords : {false, true}) {
    for (const Arg& a : args) {
      const bool is_keyword = a.kind == ArgKind::kKeyword || a.kind == ArgKind::kKeywordSpread;
      if (is_keyword != keywords) continue;
      MT_ASSIGN_OR_RETURN(Value v, Eval(*a.value, scope));
      MT_RETURN_IF_ERROR(AddArg(a, std::move(v), &out));
    }
  }
  return out;
}

[[gnu::noinline]] Status Interpreter::AddArg(const Arg& a, Value v, CallArgs* out) {
  const int line = a.value->line;
  auto add_keyword = [&](const std::string& name, Value item) -> Status {
    if (out->Keyword(name)) return ErrorAt(line, "keyword argument '" + name + "' given twice");
    out->keyword.emplace_back(name, std::move(item));
    return OkStatus();
  };
  switch (a.kind) {
    case ArgKind::kPositional:
      out->positional.push_back(std::move(v));
      return OkStatus();
    case ArgKind::kSpread:
      if (!v.is_list()) {
        return ErrorAt(line, std::string("cannot unpack a ") + TypeName(v) + " with *");
      }
      for (const Value& item : v.as_list()) out->positional.push_back(item);
      return OkStatus();
    case ArgKind::kKeyword:
      return add_keyword(a.name, std::move(v));
    case ArgKind::kKeywordSpread:
      if (!v.is_dict()) {
        return ErrorAt(line, std::string("cannot unpack a ") + TypeName(v) + " with **");
      }
      for (const auto& [k, item] : v.as_dict().entries()) {
        MT_RETURN_IF_ERROR(add_keyword(k, item));
      }
      return OkStatus();
  }
  return OkStatus();
}

[[gnu::noinline]] Expected<Value> Interpreter::EvalCall(const Expr& e,
                                                        const std::shared_ptr<Scope>& scope) {
  MT_ASSIGN_OR_RETURN(CallArgs args, EvalArgs(e.args, scope));
  MT_ASSIGN_OR_RETURN(Value fn, Eval(*e.a, scope));
  return CallValue(e, fn, args, scope);
}

[[gnu::noinline]] Expected<Value> Interpreter::CallValue(const Expr& e, const Value& fn,
                                                         CallArgs& args,
                                                         const std::shared_ptr<Scope>& scope) {
  if (!fn.is_function()) {
    // Appended, not `"'" + Spell(...)`: GCC 12 warns falsely (-Wrestrict) on that form here.
    std::string message = "'";
    message += Spell(*e.a);
    message += fn.is_undefined() ? std::string("' is undefined")
                                 : std::string("' is a ") + TypeName(fn) + ", not a function";
    return ErrorAt(e.line, message);
  }
  auto result = fn.as_function().call(args, CallSite{this, scope, e.line});
  if (!result.ok()) return AtLine(e.line, result.status());
  return result;
}

[[gnu::noinline]] Expected<Value> Interpreter::EvalFilter(const Expr& e,
                                                          const std::shared_ptr<Scope>& scope) {
  MT_ASSIGN_OR_RETURN(Value operand, Eval(*e.a, scope));
  return FilterValue(e, operand, scope);
}

// `operand | name(args)`, the operand evaluated.
[[gnu::noinline]] Expected<Value> Interpreter::FilterValue(const Expr& e, const Value& operand,
                                                           const std::shared_ptr<Scope>& scope) {
  MT_ASSIGN_OR_RETURN(CallArgs args, EvalArgs(e.args, scope));
  auto result = ApplyFilter(e.name, operand, args, CallSite{this, scope, e.line});
  if (!result.ok()) return AtLine(e.line, result.status());
  return result;
}

[[gnu::noinline]] Expected<Value> Interpreter::EvalTest(const Expr& e,
                                                        const std::shared_ptr<Scope>& scope) {
  MT_ASSIGN_OR_RETURN(Value operand, Eval(*e.a, scope));
  return TestValue(e, operand, scope);
}

// `operand is [not] name(args)`, the operand evaluated.
[[gnu::noinline]] Expected<Value> Interpreter::TestValue(const Expr& e, const Value& operand,
                                                         const std::shared_ptr<Scope>& scope) {
  MT_ASSIGN_OR_RETURN(CallArgs args, EvalArgs(e.args, scope));
  auto result = ApplyTest(e.name, operand, args);
  if (!result.ok()) return AtLine(e.line, result.status());
  return Value::Bool(e.negate ? !*result : *result);
}

[[gnu::noinline]] Expected<Value> Interpreter::EvalBinary(const Expr& e,
                                                          const std::shared_ptr<Scope>& scope) {
  MT_ASSIGN_OR_RETURN(Value left, Eval(*e.a, scope));
  if (e.name == "and") return Truthy(left) ? Eval(*e.b, scope) : Expected<Value>(left);
  if (e.name == "or") return Truthy(left) ? Expected<Value>(left) : Eval(*e.b, scope);
  MT_ASSIGN_OR_RETURN(Value right, Eval(*e.b, scope));
  return ApplyBinary(*this, e, left, right);
}

}  // namespace moetier::text::jinja
