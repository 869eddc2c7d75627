// Tree-walking evaluator for parsed Jinja templates.
//
// One Interpreter renders one template once; it is cheap to make and holds the per-render state
// (the step budget, the message of a `raise_exception`, the clock). Scoping follows
// @huggingface/jinja: a `for` opens one scope for its whole run, `if` opens none, a macro body
// runs in a scope below its caller's.
#pragma once

#include <cstdint>
#include <ctime>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>

#include "core/status.h"
#include "text/template/ast.h"
#include "text/template/nesting.h"
#include "text/template/value.h"

namespace moetier::text::jinja {

// Guards against runaway templates; every limit fails the render with an error naming it.
struct RenderLimits {
  // Largest string the template may build or print: far above any chat prompt, far below memory.
  size_t max_output_bytes = size_t{64} << 20;
  // Largest list it may build (range(), concatenation, split()).
  size_t max_list_items = size_t{1} << 20;
  // Expression evaluations and loop iterations: a chat template needs thousands; this stops an
  // endless or exponential one within about a second.
  uint64_t max_steps = 20'000'000;
  // Nested macro calls (recursion).
  int max_call_depth = 64;
  // Statements and expressions nested inside each other while rendering, counting through macro
  // calls and through filters that apply filters (`map('map', ...)`). The parser keeps each
  // template within kMaxNestingDepth, so only calls add to that; twice the limit lets a template
  // nested to the limit call a macro nested as deep, and keeps the stack a render takes within
  // the figures given at kMaxNestingDepth.
  int max_depth = 2 * kMaxNestingDepth;
};

struct Scope {
  std::shared_ptr<Scope> parent;
  std::unordered_map<std::string, Value> vars;

  const Value* Lookup(const std::string& name) const {
    for (const Scope* s = this; s != nullptr; s = s->parent.get()) {
      auto it = s->vars.find(name);
      if (it != s->vars.end()) return &it->second;
    }
    return nullptr;
  }
};

class Interpreter {
 public:
  Interpreter(const RenderLimits& limits, std::optional<std::tm> now)
      : limits_(limits), now_(now) {}

  // Renders `body` with `globals` (the context) visible. Errors read "line N: <what>"; after a
  // `raise_exception`, raised() holds its message.
  Expected<std::string> Render(const Body& body, std::shared_ptr<Scope> globals);
  const std::optional<std::string>& raised() const { return raised_; }

  // ---- used by the builtins ------------------------------------------------------------------
  const RenderLimits& limits() const { return limits_; }
  Status CheckString(size_t bytes) const;
  Status CheckList(size_t items) const;
  Status Step();
  // Records the message of raise_exception and returns the error that unwinds the render.
  Status Raise(std::string message);
  std::tm Now() const;
  // Calls a function value (a macro, a builtin) from native code.
  Expected<Value> Call(const Value& fn, CallArgs& args, const CallSite& site);
  // One level of nesting for native code that recurses on its own (a filter that applies
  // filters): hold the guard while recursing, and fail with NestingError() when it is exceeded.
  NestingGuard Nest() { return NestingGuard(&depth_, limits_.max_depth); }
  Status NestingError() const;
  // Namespaces are the only mutable values, so the only way to a reference cycle (a namespace
  // holding itself, directly or through a list): each one made during a render is kept here and
  // emptied when the render ends, which breaks every cycle before the values are released.
  void TrackNamespace(const Value& ns) { namespaces_.push_back(ns); }

 private:
  enum class Flow { kNormal, kBreak, kContinue };
  std::vector<Value> namespaces_;  // see TrackNamespace

  // A render recurses once per level of nesting, through Exec, ExecOne and ExecIf/ExecFor for
  // blocks and through Eval and one Eval* for expressions. Those functions only evaluate their
  // operands and hand the work (and the error messages) to out-of-line helpers, so that their
  // frames, which pile up while recursing, stay small: kMaxNestingDepth and max_depth are
  // sized by the stack one level takes.
  Expected<Flow> Exec(const Body& body, const std::shared_ptr<Scope>& scope, std::string* out);
  Expected<Flow> ExecOne(const Stmt& s, const std::shared_ptr<Scope>& scope, std::string* out);
  Expected<Flow> ExecIf(const Stmt& s, const std::shared_ptr<Scope>& scope, std::string* out);
  Expected<Flow> ExecFor(const Stmt& s, const std::shared_ptr<Scope>& scope, std::string* out);
  Expected<ValueList> LoopItems(const Stmt& s, const std::shared_ptr<Scope>& scope);
  Status BindLoopVariables(const Stmt& s, const ValueList& items, size_t i, Scope* scope);
  Status ExecSimple(const Stmt& s, const std::shared_ptr<Scope>& scope, std::string* out);
  Status ExecOutput(const Stmt& s, const std::shared_ptr<Scope>& scope, std::string* out);
  Status ExecSetStatement(const Stmt& s, const std::shared_ptr<Scope>& scope);
  Status ExecMacroDefinition(const Stmt& s, const std::shared_ptr<Scope>& scope);
  Status ExecSet(const Stmt& s, const std::shared_ptr<Scope>& scope, Value value);
  Status ExecCallBlock(const Stmt& s, const std::shared_ptr<Scope>& scope, std::string* out);
  Status ExecFilterBlock(const Stmt& s, const std::shared_ptr<Scope>& scope, std::string* out);
  Status Append(std::string* out, std::string_view text) const;
  Expected<std::string> RenderBlock(const Body& body, const std::shared_ptr<Scope>& scope);

  Expected<Value> Eval(const Expr& e, const std::shared_ptr<Scope>& scope);
  Expected<bool> EvalTruth(const Expr& e, const std::shared_ptr<Scope>& scope);
  Expected<Value> EvalList(const Expr& e, const std::shared_ptr<Scope>& scope);
  Expected<Value> EvalDict(const Expr& e, const std::shared_ptr<Scope>& scope);
  Expected<Value> EvalAttr(const Expr& e, const std::shared_ptr<Scope>& scope);
  Expected<Value> EvalIndex(const Expr& e, const std::shared_ptr<Scope>& scope);
  Expected<Value> EvalUnary(const Expr& e, const std::shared_ptr<Scope>& scope);
  Expected<Value> EvalBinary(const Expr& e, const std::shared_ptr<Scope>& scope);
  Expected<Value> EvalConditional(const Expr& e, const std::shared_ptr<Scope>& scope);
  Expected<Value> EvalMember(const Expr& e, const Value& object, const Value& key);
  Expected<Value> EvalSlice(const Expr& e, const std::shared_ptr<Scope>& scope);
  Expected<CallArgs> EvalArgs(const std::vector<Arg>& args, const std::shared_ptr<Scope>& scope);
  Status AddArg(const Arg& a, Value v, CallArgs* out);
  Expected<Value> EvalCall(const Expr& e, const std::shared_ptr<Scope>& scope);
  Expected<Value> CallValue(const Expr& e, const Value& fn, CallArgs& args,
                            const std::shared_ptr<Scope>& scope);
  Expected<Value> EvalFilter(const Expr& e, const std::shared_ptr<Scope>& scope);
  Expected<Value> FilterValue(const Expr& e, const Value& operand,
                              const std::shared_ptr<Scope>& scope);
  Expected<Value> EvalTest(const Expr& e, const std::shared_ptr<Scope>& scope);
  Expected<Value> TestValue(const Expr& e, const Value& operand,
                            const std::shared_ptr<Scope>& scope);

  Expected<Value> CallMacro(const std::vector<Arg>& params, const Body& body,
                            const std::shared_ptr<Scope>& defining_scope, int line, CallArgs& args,
                            const CallSite& site);
  Status CallDepthError(int line) const;
  Expected<std::shared_ptr<Scope>> BindMacroArguments(const std::vector<Arg>& params,
                                                      const std::shared_ptr<Scope>& defining_scope,
                                                      const CallArgs& args, const CallSite& site);
  Value MakeMacro(const Stmt& s, std::string display_name, const std::vector<Arg>* params,
                  const Body* body, std::shared_ptr<Scope> defining_scope);

  RenderLimits limits_;
  std::optional<std::tm> now_;
  std::optional<std::string> raised_;
  uint64_t steps_ = 0;
  int call_depth_ = 0;
  int depth_ = 0;  // see RenderLimits::max_depth
};

// "line N: <message>", unless the message already names a line.
Status AtLine(int line, const Status& status);
Status ErrorAt(int line, const std::string& message);

}  // namespace moetier::text::jinja
