#include "text/template/interpreter.h"

#include <cmath>
#include <utility>

#include "text/template/builtins.h"
#include "text/template/utf8.h"

namespace moetier::text::jinja {

Status ErrorAt(int line, const std::string& message) {
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
  if (statement_depth_ >= limits_.max_statement_depth) {
    return ErrorAt(s.line, "statements nested deeper than " +
                               std::to_string(limits_.max_statement_depth) +
                               " levels (counting macro calls)");
  }
  ++statement_depth_;
  struct DepthRestore {
    int* depth;
    ~DepthRestore() { --*depth; }
  } restore{&statement_depth_};
  switch (s.kind) {
    case StmtKind::kText:
      MT_RETURN_IF_ERROR(AtLine(s.line, Append(out, s.text)));
      return Flow::kNormal;
    case StmtKind::kOutput: {
      MT_ASSIGN_OR_RETURN(Value v, Eval(*s.expr, scope));
      auto text = ToOutputString(v);
      if (!text.ok()) return ErrorAt(s.line, text.message());
      MT_RETURN_IF_ERROR(AtLine(s.line, Append(out, *text)));
      return Flow::kNormal;
    }
    case StmtKind::kIf: {
      MT_ASSIGN_OR_RETURN(Value test, Eval(*s.expr, scope));
      return Exec(Truthy(test) ? s.body : s.orelse, scope, out);
    }
    case StmtKind::kFor:
      return ExecFor(s, scope, out);
    case StmtKind::kSet: {
      MT_ASSIGN_OR_RETURN(Value v, Eval(*s.expr, scope));
      MT_RETURN_IF_ERROR(ExecSet(s, scope, std::move(v)));
      return Flow::kNormal;
    }
    case StmtKind::kSetBlock: {
      MT_ASSIGN_OR_RETURN(std::string text, RenderBlock(s.body, scope));
      MT_RETURN_IF_ERROR(ExecSet(s, scope, Value::String(std::move(text))));
      return Flow::kNormal;
    }
    case StmtKind::kMacro:
      scope->vars[s.text] = MakeMacro(s, "'" + s.text + "'", &s.params, &s.body, nullptr);
      return Flow::kNormal;
    case StmtKind::kCallBlock:
      MT_RETURN_IF_ERROR(ExecCallBlock(s, scope, out));
      return Flow::kNormal;
    case StmtKind::kFilterBlock: {
      MT_ASSIGN_OR_RETURN(std::string text, RenderBlock(s.body, scope));
      MT_ASSIGN_OR_RETURN(CallArgs args, EvalArgs(s.expr->args, scope));
      auto v = ApplyFilter(s.expr->name, Value::String(std::move(text)), args,
                           CallSite{this, scope, s.line});
      if (!v.ok()) return AtLine(s.line, v.status());
      auto printed = ToOutputString(*v);
      if (!printed.ok()) return ErrorAt(s.line, printed.message());
      MT_RETURN_IF_ERROR(AtLine(s.line, Append(out, *printed)));
      return Flow::kNormal;
    }
    case StmtKind::kBreak:
      return Flow::kBreak;
    case StmtKind::kContinue:
      return Flow::kContinue;
  }
  return Flow::kNormal;
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

Expected<Interpreter::Flow> Interpreter::ExecFor(const Stmt& s, const std::shared_ptr<Scope>& outer,
                                                 std::string* out) {
  auto scope = std::make_shared<Scope>();
  scope->parent = outer;
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
  ValueList items;
  if (s.cond) {  // `for x in xs if cond`: filter first, so loop.length counts kept items
    for (const Value& item : all) {
      auto test_scope = std::make_shared<Scope>();
      test_scope->parent = scope;
      MT_RETURN_IF_ERROR(BindLoopTarget(*s.target, item, test_scope.get(), s.line));
      MT_ASSIGN_OR_RETURN(Value keep, Eval(*s.cond, test_scope));
      if (Truthy(keep)) items.push_back(item);
    }
  } else {
    items = std::move(all);
  }
  const auto n = static_cast<int64_t>(items.size());
  for (int64_t i = 0; i < n; ++i) {
    MT_RETURN_IF_ERROR(AtLine(s.line, Step()));
    ValueDict loop;
    loop.Set("index", Value::Int(i + 1));
    loop.Set("index0", Value::Int(i));
    loop.Set("revindex", Value::Int(n - i));
    loop.Set("revindex0", Value::Int(n - i - 1));
    loop.Set("first", Value::Bool(i == 0));
    loop.Set("last", Value::Bool(i == n - 1));
    loop.Set("length", Value::Int(n));
    loop.Set("previtem", i > 0 ? items[i - 1] : Value());
    loop.Set("nextitem", i + 1 < n ? items[i + 1] : Value());
    scope->vars["loop"] = Value::Dict(std::move(loop));
    MT_RETURN_IF_ERROR(BindLoopTarget(*s.target, items[i], scope.get(), s.line));
    MT_ASSIGN_OR_RETURN(Flow flow, Exec(s.body, scope, out));
    if (flow == Flow::kBreak) break;
  }
  // Jinja2's rule: the else block runs when there was nothing to iterate over.
  if (items.empty()) return Exec(s.orelse, scope, out);
  return Flow::kNormal;
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
  return Value::Func(display_name,
                     [display_name, params, body, defining_scope, line](
                         CallArgs& args, const CallSite& site) -> Expected<Value> {
                       Interpreter* self = site.interpreter;
                       if (self->call_depth_ >= self->limits_.max_call_depth) {
                         return ErrorAt(site.line,
                                        "macro calls nested deeper than " +
                                            std::to_string(self->limits_.max_call_depth) +
                                            " (runaway recursion?)");
                       }
                       // Macros see their caller's variables (as in @huggingface/jinja); a call
                       // block's body sees the scope it was written in.
                       auto scope = std::make_shared<Scope>();
                       scope->parent = defining_scope ? defining_scope : site.scope;
                       std::vector<std::pair<std::string, Value>> keywords = args.keyword;
                       std::vector<const Arg*> pending_defaults;
                       for (size_t i = 0; i < params->size(); ++i) {
                         const Arg& p = (*params)[i];
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
                       for (size_t i = params->size(); i < args.positional.size(); ++i) {
                         varargs.push_back(args.positional[i]);
                       }
                       ValueDict kwargs;
                       for (auto& [k, v] : keywords) kwargs.Set(k, v);
                       scope->vars["varargs"] = Value::List(std::move(varargs));
                       scope->vars["kwargs"] = Value::Dict(std::move(kwargs));
                       ++self->call_depth_;
                       struct DepthRestore {
                         int* d;
                         ~DepthRestore() { --*d; }
                       } restore{&self->call_depth_};
                       for (const Arg* p : pending_defaults) {
                         auto v = self->Eval(*p->value, scope);
                         if (!v.ok()) return v.status();
                         scope->vars[p->name] = std::move(v).value();
                       }
                       auto text = self->RenderBlock(*body, scope);
                       if (!text.ok()) return AtLine(line, text.status());
                       return Value::String(std::move(text).value());
                     });
}

Status Interpreter::ExecCallBlock(const Stmt& s, const std::shared_ptr<Scope>& scope,
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

}  // namespace

Expected<Value> Interpreter::Eval(const Expr& e, const std::shared_ptr<Scope>& scope) {
  MT_RETURN_IF_ERROR(AtLine(e.line, Step()));
  switch (e.kind) {
    case ExprKind::kLiteral:
      return e.literal;
    case ExprKind::kName: {
      const Value* v = scope->Lookup(e.name);
      return v ? *v : Value();
    }
    case ExprKind::kList:
    case ExprKind::kTuple: {
      ValueList items;
      items.reserve(e.items.size());
      for (const ExprPtr& item : e.items) {
        MT_ASSIGN_OR_RETURN(Value v, Eval(*item, scope));
        items.push_back(std::move(v));
      }
      return Value::List(std::move(items));
    }
    case ExprKind::kDict: {
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
    case ExprKind::kAttr: {
      MT_ASSIGN_OR_RETURN(Value object, Eval(*e.a, scope));
      const Value key = e.attr_is_index ? Value::Int(std::strtoll(e.name.c_str(), nullptr, 10))
                                        : Value::String(e.name);
      return EvalMember(e, object, key);
    }
    case ExprKind::kIndex: {
      MT_ASSIGN_OR_RETURN(Value object, Eval(*e.a, scope));
      MT_ASSIGN_OR_RETURN(Value key, Eval(*e.b, scope));
      return EvalMember(e, object, key);
    }
    case ExprKind::kSlice:
      return EvalSlice(e, scope);
    case ExprKind::kCall:
      return EvalCall(e, scope);
    case ExprKind::kFilter:
      return EvalFilter(e, scope);
    case ExprKind::kTest:
      return EvalTest(e, scope);
    case ExprKind::kUnary: {
      MT_ASSIGN_OR_RETURN(Value v, Eval(*e.a, scope));
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
    case ExprKind::kBinary:
      return EvalBinary(e, scope);
    case ExprKind::kTernary: {
      MT_ASSIGN_OR_RETURN(Value test, Eval(*e.a, scope));
      return Eval(Truthy(test) ? *e.b : *e.c, scope);
    }
    case ExprKind::kSelect: {
      MT_ASSIGN_OR_RETURN(Value test, Eval(*e.a, scope));
      if (!Truthy(test)) return Value();
      return Eval(*e.b, scope);
    }
  }
  return Value();
}

Expected<Value> Interpreter::EvalMember(const Expr& e, const Value& object, const Value& key) {
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

Expected<Value> Interpreter::EvalSlice(const Expr& e, const std::shared_ptr<Scope>& scope) {
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

Expected<CallArgs> Interpreter::EvalArgs(const std::vector<Arg>& args,
                                         const std::shared_ptr<Scope>& scope) {
  CallArgs out;
  // Positional arguments (with * unpacking) first, then keywords, as Python evaluates them.
  for (const Arg& a : args) {
    if (a.kind == ArgKind::kPositional) {
      MT_ASSIGN_OR_RETURN(Value v, Eval(*a.value, scope));
      out.positional.push_back(std::move(v));
    } else if (a.kind == ArgKind::kSpread) {
      MT_ASSIGN_OR_RETURN(Value v, Eval(*a.value, scope));
      if (!v.is_list()) {
        return ErrorAt(a.value->line, std::string("cannot unpack a ") + TypeName(v) + " with *");
      }
      for (const Value& item : v.as_list()) out.positional.push_back(item);
    }
  }
  auto add_keyword = [&](const std::string& name, Value v, int line) -> Status {
    if (out.Keyword(name)) return ErrorAt(line, "keyword argument '" + name + "' given twice");
    out.keyword.emplace_back(name, std::move(v));
    return OkStatus();
  };
  for (const Arg& a : args) {
    if (a.kind == ArgKind::kKeyword) {
      MT_ASSIGN_OR_RETURN(Value v, Eval(*a.value, scope));
      MT_RETURN_IF_ERROR(add_keyword(a.name, std::move(v), a.value->line));
    } else if (a.kind == ArgKind::kKeywordSpread) {
      MT_ASSIGN_OR_RETURN(Value v, Eval(*a.value, scope));
      if (!v.is_dict()) {
        return ErrorAt(a.value->line, std::string("cannot unpack a ") + TypeName(v) + " with **");
      }
      for (const auto& [k, item] : v.as_dict().entries()) {
        MT_RETURN_IF_ERROR(add_keyword(k, item, a.value->line));
      }
    }
  }
  return out;
}

Expected<Value> Interpreter::EvalCall(const Expr& e, const std::shared_ptr<Scope>& scope) {
  MT_ASSIGN_OR_RETURN(CallArgs args, EvalArgs(e.args, scope));
  MT_ASSIGN_OR_RETURN(Value fn, Eval(*e.a, scope));
  if (!fn.is_function()) {
    if (fn.is_undefined()) return ErrorAt(e.line, "'" + Spell(*e.a) + "' is undefined");
    return ErrorAt(e.line, "'" + Spell(*e.a) + "' is a " + TypeName(fn) + ", not a function");
  }
  auto result = fn.as_function().call(args, CallSite{this, scope, e.line});
  if (!result.ok()) return AtLine(e.line, result.status());
  return result;
}

Expected<Value> Interpreter::EvalFilter(const Expr& e, const std::shared_ptr<Scope>& scope) {
  MT_ASSIGN_OR_RETURN(Value operand, Eval(*e.a, scope));
  MT_ASSIGN_OR_RETURN(CallArgs args, EvalArgs(e.args, scope));
  auto result = ApplyFilter(e.name, operand, args, CallSite{this, scope, e.line});
  if (!result.ok()) return AtLine(e.line, result.status());
  return result;
}

Expected<Value> Interpreter::EvalTest(const Expr& e, const std::shared_ptr<Scope>& scope) {
  MT_ASSIGN_OR_RETURN(Value operand, Eval(*e.a, scope));
  MT_ASSIGN_OR_RETURN(CallArgs args, EvalArgs(e.args, scope));
  auto result = ApplyTest(e.name, operand, args);
  if (!result.ok()) return AtLine(e.line, result.status());
  return Value::Bool(e.negate ? !*result : *result);
}

Expected<Value> Interpreter::EvalBinary(const Expr& e, const std::shared_ptr<Scope>& scope) {
  const std::string& op = e.name;
  MT_ASSIGN_OR_RETURN(Value left, Eval(*e.a, scope));
  if (op == "and") return Truthy(left) ? Eval(*e.b, scope) : Expected<Value>(left);
  if (op == "or") return Truthy(left) ? Expected<Value>(left) : Eval(*e.b, scope);
  MT_ASSIGN_OR_RETURN(Value right, Eval(*e.b, scope));
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
    MT_RETURN_IF_ERROR(AtLine(e.line, CheckString(a->size() + b->size())));
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
    MT_RETURN_IF_ERROR(AtLine(e.line, CheckList(joined.size() + right.as_list().size())));
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
    MT_RETURN_IF_ERROR(AtLine(e.line, CheckString(a->size() + b->size())));
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

}  // namespace moetier::text::jinja
