#include "text/template/value.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "text/template/nesting.h"
#include "text/template/utf8.h"

namespace moetier::text::jinja {

const Value* ValueDict::Find(std::string_view key) const {
  for (const auto& [k, v] : entries_)
    if (k == key) return &v;
  return nullptr;
}

void ValueDict::Set(std::string key, Value value) {
  for (auto& [k, v] : entries_) {
    if (k == key) {
      v = std::move(value);
      return;
    }
  }
  entries_.emplace_back(std::move(key), std::move(value));
}

const Value* CallArgs::Keyword(std::string_view name) const {
  for (const auto& [k, v] : keyword)
    if (k == name) return &v;
  return nullptr;
}

const Value* CallArgs::Get(size_t index, std::string_view name) const {
  if (index < positional.size()) return &positional[index];
  return Keyword(name);
}

// Containers are created mutable and shared as const: ~Value may then take apart one it solely
// owns (a const_cast on an object that was never const).
Value Value::List(ValueList items) {
  return Value(Storage(std::in_place_index<6>, std::shared_ptr<const ValueList>(
                                                   std::make_shared<ValueList>(std::move(items)))));
}
Value Value::Dict(ValueDict dict) {
  return Value(Storage(std::in_place_index<7>, std::shared_ptr<const ValueDict>(
                                                   std::make_shared<ValueDict>(std::move(dict)))));
}

Value::~Value() {
  if (SolelyOwnsContainer(v_)) ReleaseIteratively(std::move(v_));
}

bool Value::SolelyOwnsContainer(const Storage& s) {
  switch (s.index()) {
    case 6: {
      const auto& p = std::get<6>(s);
      return p != nullptr && p.use_count() == 1 && !p->empty();
    }
    case 7: {
      const auto& p = std::get<7>(s);
      return p != nullptr && p.use_count() == 1 && !p->empty();
    }
    case 8: {
      const auto& p = std::get<8>(s);
      return p != nullptr && p.use_count() == 1 && !p->empty();
    }
    default:
      return false;
  }
}

void Value::ReleaseIteratively(Storage s) {
  std::vector<Storage> work;
  work.push_back(std::move(s));
  while (!work.empty()) {
    Storage cur = std::move(work.back());
    work.pop_back();
    // Move out every child container that only `cur` holds; `cur` then dies shallow (its
    // children's destructors see empty pointers), and the children wait on the worklist.
    auto take = [&](Value& child) {
      if (SolelyOwnsContainer(child.v_)) work.push_back(std::move(child.v_));
    };
    if (cur.index() == 6) {
      for (Value& c : const_cast<ValueList&>(*std::get<6>(cur))) take(c);
    } else if (cur.index() == 7) {
      for (auto& e : const_cast<ValueDict&>(*std::get<7>(cur)).entries_) take(e.second);
    } else if (cur.index() == 8) {
      for (auto& e : std::get<8>(cur)->entries_) take(e.second);
    }
  }
}
Value Value::Namespace(ValueDict dict) {
  return Value(Storage(std::in_place_index<8>, std::make_shared<ValueDict>(std::move(dict))));
}
Value Value::Func(std::string name,
                  std::function<Expected<Value>(CallArgs&, const CallSite&)> call) {
  return Value(Storage(std::in_place_index<9>, std::make_shared<const Function>(
                                                   Function{std::move(name), std::move(call)})));
}

double Value::as_number() const {
  if (is_int()) return static_cast<double>(as_int());
  if (is_float()) return as_float();
  if (is_bool()) return as_bool() ? 1.0 : 0.0;
  return std::nan("");
}

const void* Value::identity() const {
  switch (kind()) {
    case Kind::kList:
      return std::get<6>(v_).get();
    case Kind::kDict:
      return std::get<7>(v_).get();
    case Kind::kNamespace:
      return std::get<8>(v_).get();
    case Kind::kFunction:
      return std::get<9>(v_).get();
    default:
      return nullptr;
  }
}

const char* TypeName(const Value& v) {
  switch (v.kind()) {
    case Kind::kUndefined:
      return "undefined";
    case Kind::kNone:
      return "none";
    case Kind::kBool:
      return "boolean";
    case Kind::kInt:
      return "integer";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return "string";
    case Kind::kList:
      return "list";
    case Kind::kDict:
      return "dict";
    case Kind::kNamespace:
      return "namespace";
    case Kind::kFunction:
      return "function";
  }
  return "value";
}

bool Truthy(const Value& v) {
  switch (v.kind()) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return v.as_bool();
    case Kind::kInt:
      return v.as_int() != 0;
    case Kind::kFloat:
      return v.as_float() != 0 && !std::isnan(v.as_float());
    case Kind::kString:
      return !v.as_string().empty();
    case Kind::kList:
      return !v.as_list().empty();
    case Kind::kDict:
      return !v.as_dict().empty();
    case Kind::kNamespace:
    case Kind::kFunction:
      return true;
  }
  return false;
}

namespace {

bool IsDigits(std::string_view s, int base) {
  if (s.empty()) return false;
  for (char c : s) {
    const int d = (c >= '0' && c <= '9')   ? c - '0'
                  : (c >= 'a' && c <= 'z') ? c - 'a' + 10
                  : (c >= 'A' && c <= 'Z') ? c - 'A' + 10
                                           : 99;
    if (d >= base) return false;
  }
  return true;
}

// JavaScript's ToNumber of a string: what `"1" == 1` compares with.
double JsStringToNumber(std::string_view raw) {
  const std::string s = utf8::Trim(raw, utf8::TrimSide::kBoth);
  if (s.empty()) return 0;
  if (s.size() > 2 && s[0] == '0') {
    const char p = static_cast<char>(s[1] | 0x20);
    const int base = p == 'x' ? 16 : p == 'o' ? 8 : p == 'b' ? 2 : 0;
    if (base != 0) {
      if (!IsDigits(std::string_view(s).substr(2), base)) return std::nan("");
      double v = 0;
      for (char c : s.substr(2)) {
        const int d = (c >= '0' && c <= '9') ? c - '0' : ((c | 0x20) - 'a' + 10);
        v = v * base + d;
      }
      return v;
    }
  }
  std::string_view body = s;
  bool negative = false;
  if (body[0] == '+' || body[0] == '-') {
    negative = body[0] == '-';
    body.remove_prefix(1);
  }
  if (body == "Infinity") return negative ? -INFINITY : INFINITY;
  // A decimal literal: digits [. digits] [e [sign] digits], with digits on at least one side.
  size_t i = 0;
  size_t int_digits = 0;
  size_t frac_digits = 0;
  while (i < body.size() && body[i] >= '0' && body[i] <= '9') ++i, ++int_digits;
  if (i < body.size() && body[i] == '.') {
    ++i;
    while (i < body.size() && body[i] >= '0' && body[i] <= '9') ++i, ++frac_digits;
  }
  if (int_digits + frac_digits == 0) return std::nan("");
  if (i < body.size() && (body[i] == 'e' || body[i] == 'E')) {
    ++i;
    if (i < body.size() && (body[i] == '+' || body[i] == '-')) ++i;
    size_t exp_digits = 0;
    while (i < body.size() && body[i] >= '0' && body[i] <= '9') ++i, ++exp_digits;
    if (exp_digits == 0) return std::nan("");
  }
  if (i != body.size()) return std::nan("");
  return std::strtod(s.c_str(), nullptr);
}

bool IsNumberLike(const Value& v) {
  return v.is_int() || v.is_float() || v.is_bool();
}

}  // namespace

bool LooseEquals(const Value& a, const Value& b) {
  const bool a_nullish = a.is_none() || a.is_undefined();
  const bool b_nullish = b.is_none() || b.is_undefined();
  if (a_nullish || b_nullish) return a_nullish && b_nullish;
  if (a.is_string() && b.is_string()) return a.as_string() == b.as_string();
  if (IsNumberLike(a) && IsNumberLike(b)) return a.as_number() == b.as_number();
  if (IsNumberLike(a) && b.is_string()) return a.as_number() == JsStringToNumber(b.as_string());
  if (a.is_string() && IsNumberLike(b)) return JsStringToNumber(a.as_string()) == b.as_number();
  // Containers compare by identity; a container never equals a scalar here (JavaScript would
  // compare its string form, which no template relies on).
  return a.identity() != nullptr && a.identity() == b.identity();
}

bool StrictEquals(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) return a.as_number() == b.as_number();
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Kind::kUndefined:
    case Kind::kNone:
      return true;
    case Kind::kBool:
      return a.as_bool() == b.as_bool();
    case Kind::kString:
      return a.as_string() == b.as_string();
    default:
      return a.identity() == b.identity();
  }
}

std::string FormatFloat(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  const std::string sci(buf, res.ptr);  // "-1.2345e+05": shortest round-trip digits
  const size_t e = sci.find('e');
  std::string mantissa = sci.substr(0, e);
  const int exp10 = std::atoi(sci.c_str() + e + 1);
  std::string sign;
  if (mantissa[0] == '-') {
    sign = "-";
    mantissa.erase(0, 1);
  }
  std::string digits;
  for (char c : mantissa)
    if (c != '.') digits.push_back(c);
  std::string out = sign;
  // Python's repr switches to exponent notation outside 1e-4 <= |d| < 1e16.
  if (exp10 >= -4 && exp10 < 16) {
    if (exp10 >= 0) {
      const size_t int_len = static_cast<size_t>(exp10) + 1;
      if (digits.size() <= int_len) {
        out += digits + std::string(int_len - digits.size(), '0') + ".0";
      } else {
        out += digits.substr(0, int_len) + "." + digits.substr(int_len);
      }
    } else {
      out += "0." + std::string(static_cast<size_t>(-exp10 - 1), '0') + digits;
    }
  } else {
    out += digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char exp_buf[16];
    std::snprintf(exp_buf, sizeof(exp_buf), "e%c%02d", exp10 < 0 ? '-' : '+', std::abs(exp10));
    out += exp_buf;
  }
  return out;
}

namespace {

void AppendHexEscape(std::string* out, unsigned unit) {
  char buf[8];
  std::snprintf(buf, sizeof(buf), "\\u%04x", unit & 0xFFFF);
  *out += buf;
}

void AppendJsonString(std::string* out, std::string_view s, bool ensure_ascii) {
  out->push_back('"');
  for (size_t i = 0; i < s.size();) {
    const char32_t cp = utf8::Next(s, &i);
    switch (cp) {
      case '"':
        *out += "\\\"";
        continue;
      case '\\':
        *out += "\\\\";
        continue;
      case '\b':
        *out += "\\b";
        continue;
      case '\f':
        *out += "\\f";
        continue;
      case '\n':
        *out += "\\n";
        continue;
      case '\r':
        *out += "\\r";
        continue;
      case '\t':
        *out += "\\t";
        continue;
      default:
        break;
    }
    if (cp < 0x20) {
      AppendHexEscape(out, cp);
    } else if (ensure_ascii && cp >= 0x7F) {
      if (cp >= 0x10000) {  // a UTF-16 surrogate pair, as JSON requires
        const char32_t v = cp - 0x10000;
        AppendHexEscape(out, 0xD800 + (v >> 10));
        AppendHexEscape(out, 0xDC00 + (v & 0x3FF));
      } else {
        AppendHexEscape(out, cp);
      }
    } else {
      utf8::Append(out, cp);
    }
  }
  out->push_back('"');
}

// Recurses once per level, so stops at kMaxNestingDepth: values from JSON and literals stay
// within it, but a template can build deeper ones in a loop, and a namespace that holds itself
// (`{% set ns.me = ns %}{{ ns }}`) would recurse forever. `depth` is 1 for the top value.
Status AppendJson(std::string* out, const Value& v, const JsonOptions& o, int depth) {
  if (depth > kMaxNestingDepth) {
    return Status::Error("value nested deeper than " + std::to_string(kMaxNestingDepth) +
                         " levels (a namespace that contains itself?)");
  }
  const bool pretty = o.indent > 0;
  const std::string pad = pretty ? std::string(static_cast<size_t>(o.indent), ' ') : "";
  auto newline = [&](int level) {
    out->push_back('\n');
    for (int i = 0; i < level; ++i) *out += pad;
  };
  switch (v.kind()) {
    case Kind::kUndefined:
      *out += o.undefined_as_null ? "null" : "undefined";
      return OkStatus();
    case Kind::kNone:
      *out += "null";
      return OkStatus();
    case Kind::kBool:
      *out += v.as_bool() ? "true" : "false";
      return OkStatus();
    case Kind::kInt:
      *out += std::to_string(v.as_int());
      return OkStatus();
    case Kind::kFloat: {
      const double d = v.as_float();
      *out += std::isnan(d)   ? "NaN"
              : std::isinf(d) ? (d > 0 ? "Infinity" : "-Infinity")
                              : FormatFloat(d);
      return OkStatus();
    }
    case Kind::kString:
      AppendJsonString(out, v.as_string(), o.ensure_ascii);
      return OkStatus();
    case Kind::kList: {
      const ValueList& items = v.as_list();
      out->push_back('[');
      for (size_t i = 0; i < items.size(); ++i) {
        if (i > 0) *out += o.item_separator;
        if (pretty) newline(depth);
        MT_RETURN_IF_ERROR(AppendJson(out, items[i], o, depth + 1));
      }
      if (pretty && !items.empty()) newline(depth - 1);
      out->push_back(']');
      return OkStatus();
    }
    case Kind::kDict:
    case Kind::kNamespace: {
      const ValueDict& dict = v.is_dict() ? v.as_dict() : v.namespace_dict();
      std::vector<const ValueDict::Entry*> entries;
      for (const auto& e : dict.entries()) entries.push_back(&e);
      if (o.sort_keys) {
        std::stable_sort(entries.begin(), entries.end(),
                         [](const auto* a, const auto* b) { return a->first < b->first; });
      }
      out->push_back('{');
      for (size_t i = 0; i < entries.size(); ++i) {
        if (i > 0) *out += o.item_separator;
        if (pretty) newline(depth);
        AppendJsonString(out, entries[i]->first, o.ensure_ascii);
        *out += o.key_separator;
        MT_RETURN_IF_ERROR(AppendJson(out, entries[i]->second, o, depth + 1));
      }
      if (pretty && !entries.empty()) newline(depth - 1);
      out->push_back('}');
      return OkStatus();
    }
    case Kind::kFunction:
      return Status::Error("cannot convert a function to JSON");
  }
  return OkStatus();
}

}  // namespace

Expected<std::string> ToJson(const Value& v, const JsonOptions& options) {
  std::string out;
  MT_RETURN_IF_ERROR(AppendJson(&out, v, options, 1));
  return out;
}

Expected<std::string> ToOutputString(const Value& v) {
  switch (v.kind()) {
    case Kind::kUndefined:
    case Kind::kNone:
      return std::string();
    case Kind::kBool:
      return std::string(v.as_bool() ? "true" : "false");
    case Kind::kInt:
      return std::to_string(v.as_int());
    case Kind::kFloat:
      return FormatFloat(v.as_float());
    case Kind::kString:
      return v.as_string();
    case Kind::kFunction:
      return Status::Error("cannot print function '" + v.as_function().name + "'");
    default: {
      JsonOptions o;
      o.undefined_as_null = false;
      return ToJson(v, o);
    }
  }
}

namespace {

Status DataTooDeep() {
  return Status::Error("nested deeper than " + std::to_string(kMaxNestingDepth) + " levels");
}

// FromJson below, after CheckJsonNesting has bounded its recursion.
Value FromCheckedJson(const nlohmann::ordered_json& j) {
  using J = nlohmann::ordered_json::value_t;
  switch (j.type()) {
    case J::null:
      return Value::None();
    case J::boolean:
      return Value::Bool(j.get<bool>());
    case J::number_integer:
      return Value::Int(j.get<int64_t>());
    case J::number_unsigned: {
      const auto u = j.get<uint64_t>();
      return u <= static_cast<uint64_t>(INT64_MAX) ? Value::Int(static_cast<int64_t>(u))
                                                   : Value::Float(static_cast<double>(u));
    }
    case J::number_float:
      return Value::Float(j.get<double>());
    case J::string:
      return Value::String(j.get<std::string>());
    case J::array: {
      ValueList items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(FromCheckedJson(e));
      return Value::List(std::move(items));
    }
    case J::object: {
      ValueDict dict;
      for (const auto& [k, e] : j.items()) dict.Set(k, FromCheckedJson(e));
      return Value::Dict(std::move(dict));
    }
    default:
      return Value();  // binary and discarded values have no template meaning
  }
}

}  // namespace

Status CheckJsonNesting(const nlohmann::ordered_json& j) {
  std::vector<std::pair<const nlohmann::ordered_json*, int>> work = {{&j, 1}};
  while (!work.empty()) {
    const auto [node, depth] = work.back();
    work.pop_back();
    if (depth > kMaxNestingDepth) return DataTooDeep();
    if (node->is_structured()) {
      for (const auto& child : *node) work.emplace_back(&child, depth + 1);
    }
  }
  return OkStatus();
}

Expected<Value> FromJson(const nlohmann::ordered_json& j) {
  MT_RETURN_IF_ERROR(CheckJsonNesting(j));
  return FromCheckedJson(j);
}

}  // namespace moetier::text::jinja
