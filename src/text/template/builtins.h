// The functions, filters, tests and methods a template can call. Each follows @huggingface/jinja
// where it has one; the few it lacks (select, sum, round, dict(), ...) follow Jinja2.
#pragma once

#include <string>

#include "core/status.h"
#include "text/template/interpreter.h"
#include "text/template/value.h"

namespace moetier::text::jinja {

// Adds true/false/none (and their title-case forms), raise_exception, range, strftime_now,
// namespace and dict to the root scope.
void InstallGlobals(Scope* root);

// `operand | name(args)`. An unknown name is an error "unknown filter 'name'".
Expected<Value> ApplyFilter(const std::string& name, const Value& operand, CallArgs& args,
                            const CallSite& site);

// `operand is name(args)`. An unknown name is an error "unknown test 'name'".
Expected<bool> ApplyTest(const std::string& name, const Value& operand, const CallArgs& args);

// `receiver.name` for the builtin methods of strings, dicts and lists (bound to the receiver),
// and properties such as `.length`. Undefined when there is none.
Value LookupMethod(const Value& receiver, const std::string& name);

}  // namespace moetier::text::jinja
