// Runtime values of the Jinja interpreter.
//
// The semantics follow @huggingface/jinja, the renderer transformers.js ships and our reference:
// undefined and none are distinct (undefined prints as nothing, its attributes are undefined);
// lists and dicts are shared, immutable once built, and compare by identity; dicts keep insertion
// order, since tool schemas are printed in the order the caller wrote them. A namespace is the
// one mutable value (`{% set ns.x = ... %}`), shared by reference like a Python object.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "core/status.h"

namespace moetier::text::jinja {

class Value;
class Interpreter;
struct Scope;

using ValueList = std::vector<Value>;

class ValueDict;
struct CallArgs;
struct CallSite;
struct Function;

enum class Kind : uint8_t {
  kUndefined,
  kNone,
  kBool,
  kInt,
  kFloat,
  kString,
  kList,
  kDict,
  kNamespace,
  kFunction,
};

class Value {
 public:
  Value() = default;  // undefined
  Value(const Value&) = default;
  Value(Value&&) noexcept = default;
  // By value, so that the old contents go through ~Value below (never a recursive release).
  Value& operator=(Value other) noexcept {
    v_.swap(other.v_);
    return *this;
  }
  // Lists and dicts can nest as deep as a template's step limit lets it build them
  // ([[...]] 10^5 levels and more); releasing the last reference to such a value one level per
  // call frame would overflow the stack, so the containers a dying value solely owns are taken
  // apart with a worklist instead.
  ~Value();
  static Value None() { return Value(Storage(std::in_place_index<1>, nullptr)); }
  static Value Bool(bool b) { return Value(Storage(std::in_place_index<2>, b)); }
  static Value Int(int64_t i) { return Value(Storage(std::in_place_index<3>, i)); }
  static Value Float(double d) { return Value(Storage(std::in_place_index<4>, d)); }
  static Value String(std::string s) {
    return Value(Storage(std::in_place_index<5>, std::move(s)));
  }
  static Value List(ValueList items);
  static Value Dict(ValueDict dict);
  static Value Namespace(ValueDict dict);
  static Value Func(std::string name,
                    std::function<Expected<Value>(CallArgs&, const CallSite&)> call);

  Kind kind() const { return static_cast<Kind>(v_.index()); }
  bool is_undefined() const { return kind() == Kind::kUndefined; }
  bool is_none() const { return kind() == Kind::kNone; }
  bool is_bool() const { return kind() == Kind::kBool; }
  bool is_int() const { return kind() == Kind::kInt; }
  bool is_float() const { return kind() == Kind::kFloat; }
  bool is_number() const { return is_int() || is_float(); }
  bool is_string() const { return kind() == Kind::kString; }
  bool is_list() const { return kind() == Kind::kList; }
  bool is_dict() const { return kind() == Kind::kDict; }
  bool is_namespace() const { return kind() == Kind::kNamespace; }
  bool is_function() const { return kind() == Kind::kFunction; }

  bool as_bool() const { return std::get<2>(v_); }
  int64_t as_int() const { return std::get<3>(v_); }
  double as_float() const { return std::get<4>(v_); }
  // Int, float or bool as a double (JavaScript numbers).
  double as_number() const;
  const std::string& as_string() const { return std::get<5>(v_); }
  const ValueList& as_list() const { return *std::get<6>(v_); }
  const ValueDict& as_dict() const { return *std::get<7>(v_); }
  // A namespace is shared: writes through one copy are seen by all.
  ValueDict& namespace_dict() const { return *std::get<8>(v_); }
  const Function& as_function() const { return *std::get<9>(v_); }

  // Identity of a shared container (lists, dicts, namespaces, functions); null for scalars.
  const void* identity() const;

 private:
  using Storage = std::variant<std::monostate, std::nullptr_t, bool, int64_t, double, std::string,
                               std::shared_ptr<const ValueList>, std::shared_ptr<const ValueDict>,
                               std::shared_ptr<ValueDict>, std::shared_ptr<const Function>>;
  explicit Value(Storage v) : v_(std::move(v)) {}
  // True when `s` is a non-empty list, dict or namespace that nothing else references.
  static bool SolelyOwnsContainer(const Storage& s);
  static void ReleaseIteratively(Storage s);
  Storage v_;
};

// Insertion-ordered map from string keys. Lookups are linear: template dicts are small (a message,
// a tool schema) and order is what matters.
class ValueDict {
 public:
  using Entry = std::pair<std::string, Value>;

  const Value* Find(std::string_view key) const;
  // Inserts at the end, or replaces the value in place when the key exists.
  void Set(std::string key, Value value);
  const std::vector<Entry>& entries() const { return entries_; }
  size_t size() const { return entries_.size(); }
  bool empty() const { return entries_.empty(); }

 private:
  friend class Value;  // ~Value takes entries apart (see there)
  std::vector<Entry> entries_;
};

// Arguments of a call: positional values, then keyword values in the order written.
struct CallArgs {
  ValueList positional;
  std::vector<std::pair<std::string, Value>> keyword;

  const Value* Keyword(std::string_view name) const;
  // The argument at `index` if given positionally, else the keyword `name`, else nullptr.
  const Value* Get(size_t index, std::string_view name) const;
};

// Where a function is called from: macros render in the caller's scope (as @huggingface/jinja
// does), and errors name the caller's line.
struct CallSite {
  Interpreter* interpreter = nullptr;
  std::shared_ptr<Scope> scope;
  int line = 0;
};

struct Function {
  std::string name;
  std::function<Expected<Value>(CallArgs& args, const CallSite& site)> call;
};

// A short name of the value's type for error messages ("string", "list", "undefined", ...).
const char* TypeName(const Value& v);

// Python's truthiness with JavaScript's for scalars (NaN is false); a namespace is always true.
bool Truthy(const Value& v);

// `==` as @huggingface/jinja evaluates it (JavaScript loose equality of the underlying values):
// numbers and booleans compare numerically, a number and a numeric string compare as numbers,
// none equals undefined, containers compare by identity.
bool LooseEquals(const Value& a, const Value& b);
// Strict equality (JavaScript ===): what `in`, `unique` and the `eq` test use.
bool StrictEquals(const Value& a, const Value& b);

// Python's repr of a float: the shortest string that reads back to the same double, always with
// a '.' or an exponent ("1.0", "0.1", "1e-07", "1.5e+16").
std::string FormatFloat(double d);

// How `{{ v }}` prints: none and undefined print nothing, booleans print "true"/"false", lists,
// dicts and namespaces print as JSON (as @huggingface/jinja's toString does).
Expected<std::string> ToOutputString(const Value& v);

struct JsonOptions {
  int indent = -1;  // < 0: single line
  bool ensure_ascii = false;
  bool sort_keys = false;
  // Python's json.dumps defaults: ", " and ": ", or "," and ": " when indenting.
  std::string item_separator = ", ";
  std::string key_separator = ": ";
  bool undefined_as_null = true;
};
// The `tojson` filter: Python's json.dumps with the transformers defaults (no ASCII escaping).
Expected<std::string> ToJson(const Value& v, const JsonOptions& options);

// Fails with "nested deeper than N levels" when `j` nests arrays and objects deeper than
// kMaxNestingDepth (the top value is level 1). It walks without recursing, so it is the check to
// make before anything walks a document recursively: FromJson, but also the copy constructor of
// nlohmann::json, one native frame per level.
Status CheckJsonNesting(const nlohmann::ordered_json& j);

// Converts context data: JSON objects become dicts in key order, integers stay ints, floats stay
// floats (1.0 is a float, as in Python). Fails as CheckJsonNesting does.
Expected<Value> FromJson(const nlohmann::ordered_json& j);

}  // namespace moetier::text::jinja
