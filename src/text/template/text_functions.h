// Operations on strings, lists and dicts shared by the filters and the methods (`s | trim` and
// `s.strip()` are one implementation). Internal to the interpreter.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "text/template/interpreter.h"
#include "text/template/value.h"

namespace moetier::text::jinja::detail {

Status FilterTypeError(const char* filter, const Value& operand);
// A boolean argument, `fallback` when absent or undefined; `what` names it in the error.
Expected<bool> BoolArg(const Value* v, bool fallback, const char* what);

// How join() prints one item: none and undefined as "", the rest as `{{ }}` prints them.
std::string JoinPart(const Value& v);
// Follows a dotted attribute path ("details.priority", "items.0") as Jinja's attribute= does.
Value GetAttributePath(const Value& item, const std::string& path);

// Sorting: keys must all be numbers (booleans count), all strings, or all none / undefined, as
// @huggingface/jinja allows; checked before sorting so the comparator is a total order.
Status CheckComparable(const std::vector<Value>& keys);
int CompareKeys(const Value& a, const Value& b, bool case_sensitive);
// Stable sort of `items` by `keys` (one per item).
Expected<ValueList> SortBy(const ValueList& items, const std::vector<Value>& keys, bool reverse,
                           bool case_sensitive);

// JavaScript's parseInt(s, 10) and parseFloat: what the int and float filters accept.
std::optional<int64_t> JsParseInt(const std::string& raw);
std::optional<double> JsParseFloat(const std::string& raw);

std::vector<std::string> Characters(const std::string& s);  // one string per code point
Value StringList(std::vector<std::string> parts);

// Python's str.replace (count < 0: all); an empty `old` inserts between code points.
Expected<std::string> Replace(const std::string& s, const std::string& old,
                              const std::string& replacement, int64_t count, const Interpreter& in);
// Python's str.split / str.rsplit (a null separator splits on runs of whitespace).
Expected<Value> Split(const std::string& s, const Value* sep_arg, const Value* max_arg,
                      bool from_right, const Interpreter& in);
std::string TitleCase(const std::string& s);
std::string Capitalize(const std::string& s);
// The indent filter: indent(width=4, first=false, blank=false).
Expected<std::string> Indent(const std::string& s, const CallArgs& args, const Interpreter& in);
std::string HtmlEscape(const std::string& s);

ValueList DictItems(const ValueDict& d);  // [[key, value], ...] in order
// dictsort(case_sensitive=false, by='key', reverse=false).
Expected<Value> DictSort(const ValueDict& d, const CallArgs& args);

}  // namespace moetier::text::jinja::detail
