#include "text/template/text_functions.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <utility>

#include "text/template/utf8.h"

namespace moetier::text::jinja::detail {

Status FilterTypeError(const char* filter, const Value& operand) {
  return Status::Error(std::string("filter '") + filter + "' cannot be applied to a " +
                       TypeName(operand));
}

Expected<bool> BoolArg(const Value* v, bool fallback, const char* what) {
  if (v == nullptr || v->is_undefined()) return fallback;
  if (!v->is_bool()) return Status::Error(std::string(what) + " must be a boolean");
  return v->as_bool();
}

std::string JoinPart(const Value& v) {
  // JavaScript's Array.join prints null and undefined as empty strings.
  if (v.is_none() || v.is_undefined()) return "";
  auto s = ToOutputString(v);
  return s.ok() ? *s : std::string();
}

// Follows a dotted attribute path ("details.priority", "items.0") as Jinja's attribute= does.
Value GetAttributePath(const Value& item, const std::string& path) {
  Value v = item;
  size_t start = 0;
  while (true) {
    const size_t dot = path.find('.', start);
    const std::string part =
        path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (v.is_dict() || v.is_namespace()) {
      const ValueDict& d = v.is_dict() ? v.as_dict() : v.namespace_dict();
      const Value* found = d.Find(part);
      if (!found) return Value();
      v = *found;
    } else if (v.is_list()) {
      char* end = nullptr;
      const long long idx = std::strtoll(part.c_str(), &end, 10);
      if (part.empty() || *end != '\0' || idx < 0 ||
          static_cast<size_t>(idx) >= v.as_list().size()) {
        return Value();
      }
      v = v.as_list()[static_cast<size_t>(idx)];
    } else {
      return Value();
    }
    if (dot == std::string::npos) return v;
    start = dot + 1;
  }
}

// Sorting keys of one comparable class: numbers (with booleans), strings, or all none/undefined,
// as @huggingface/jinja's compareRuntimeValues allows. Mixed classes are an error, checked
// before sorting so the comparator is a total order.
Status CheckComparable(const std::vector<Value>& keys) {
  auto cls = [](const Value& v) {
    if (v.is_number() || v.is_bool()) return 0;
    if (v.is_string()) return 1;
    if (v.is_none()) return 2;
    if (v.is_undefined()) return 3;
    return 4;
  };
  for (size_t i = 0; i < keys.size(); ++i) {
    if (cls(keys[i]) == 4) return Status::Error(std::string("cannot sort a ") + TypeName(keys[i]));
    if (i > 0 && cls(keys[i]) != cls(keys[0])) {
      return Status::Error(std::string("cannot compare a ") + TypeName(keys[0]) + " with a " +
                           TypeName(keys[i]));
    }
  }
  return OkStatus();
}

int CompareKeys(const Value& a, const Value& b, bool case_sensitive) {
  if (a.is_string() && b.is_string()) {
    const std::string x = case_sensitive ? a.as_string() : utf8::ToLower(a.as_string());
    const std::string y = case_sensitive ? b.as_string() : utf8::ToLower(b.as_string());
    return x < y ? -1 : (x > y ? 1 : 0);
  }
  if ((a.is_number() || a.is_bool()) && (b.is_number() || b.is_bool())) {
    const double x = a.as_number();
    const double y = b.as_number();
    if (std::isnan(x) || std::isnan(y)) return std::isnan(x) ? (std::isnan(y) ? 0 : -1) : 1;
    return x < y ? -1 : (x > y ? 1 : 0);
  }
  return 0;
}

Expected<ValueList> SortBy(const ValueList& items, const std::vector<Value>& keys, bool reverse,
                           bool case_sensitive) {
  MT_RETURN_IF_ERROR(CheckComparable(keys));
  std::vector<size_t> order(items.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) {
    const int c = CompareKeys(keys[x], keys[y], case_sensitive);
    return reverse ? c > 0 : c < 0;
  });
  ValueList out;
  out.reserve(items.size());
  for (size_t i : order) out.push_back(items[i]);
  return out;
}

// JavaScript's parseInt(s, 10): optional whitespace and sign, then as many digits as there are.
std::optional<int64_t> JsParseInt(const std::string& raw) {
  const std::string s = utf8::Trim(raw, utf8::TrimSide::kLeft);
  size_t i = 0;
  bool negative = false;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) negative = s[i++] == '-';
  const size_t digits_start = i;
  int64_t v = 0;
  while (i < s.size() && s[i] >= '0' && s[i] <= '9') {
    if (v < INT64_MAX / 10) v = v * 10 + (s[i] - '0');
    ++i;
  }
  if (i == digits_start) return std::nullopt;
  return negative ? -v : v;
}

// JavaScript's parseFloat: the longest decimal prefix after optional whitespace.
std::optional<double> JsParseFloat(const std::string& raw) {
  const std::string s = utf8::Trim(raw, utf8::TrimSide::kLeft);
  size_t i = 0;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
  if (s.compare(i, 8, "Infinity") == 0) return s[0] == '-' ? -INFINITY : INFINITY;
  size_t digits = 0;
  while (i < s.size() && s[i] >= '0' && s[i] <= '9') ++i, ++digits;
  if (i < s.size() && s[i] == '.') {
    ++i;
    while (i < s.size() && s[i] >= '0' && s[i] <= '9') ++i, ++digits;
  }
  if (digits == 0) return std::nullopt;
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    size_t j = i + 1;
    if (j < s.size() && (s[j] == '+' || s[j] == '-')) ++j;
    size_t exp_digits = 0;
    while (j < s.size() && s[j] >= '0' && s[j] <= '9') ++j, ++exp_digits;
    if (exp_digits > 0) i = j;
  }
  return std::strtod(s.substr(0, i).c_str(), nullptr);
}

std::vector<std::string> Characters(const std::string& s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    std::string ch;
    utf8::Append(&ch, utf8::Next(s, &i));
    out.push_back(std::move(ch));
  }
  return out;
}

Value StringList(std::vector<std::string> parts) {
  ValueList items;
  items.reserve(parts.size());
  for (auto& p : parts) items.push_back(Value::String(std::move(p)));
  return Value::List(std::move(items));
}

// Python's str.replace; an empty `old` inserts `replacement` between code points.
Expected<std::string> Replace(const std::string& s, const std::string& old,
                              const std::string& replacement, int64_t count,
                              const Interpreter& in) {
  std::string out;
  int64_t done = 0;
  auto budget_left = [&] { return count < 0 || done < count; };
  if (old.empty()) {
    for (size_t i = 0; i <= s.size();) {
      if (budget_left()) {
        out += replacement;
        ++done;
      }
      if (i == s.size()) break;
      const size_t start = i;
      utf8::Next(s, &i);
      out.append(s, start, i - start);
      MT_RETURN_IF_ERROR(in.CheckString(out.size()));
    }
    return out;
  }
  size_t pos = 0;
  while (budget_left()) {
    const size_t hit = s.find(old, pos);
    if (hit == std::string::npos) break;
    out.append(s, pos, hit - pos);
    out += replacement;
    MT_RETURN_IF_ERROR(in.CheckString(out.size()));
    pos = hit + old.size();
    ++done;
  }
  out.append(s, pos, std::string::npos);
  MT_RETURN_IF_ERROR(in.CheckString(out.size()));
  return out;
}

// Python's str.split / str.rsplit (sep None: runs of whitespace, no empty ends).
Expected<Value> Split(const std::string& s, const Value* sep_arg, const Value* max_arg,
                      bool from_right, const Interpreter& in) {
  int64_t maxsplit = -1;
  if (max_arg && !max_arg->is_undefined()) {
    if (!max_arg->is_int()) return Status::Error("split() maxsplit must be an integer");
    maxsplit = max_arg->as_int();
  }
  std::vector<std::string> parts;
  if (sep_arg == nullptr || sep_arg->is_none() || sep_arg->is_undefined()) {
    std::vector<char32_t> cps = utf8::Decode(s);
    if (from_right) std::reverse(cps.begin(), cps.end());
    size_t i = 0;
    while (true) {
      while (i < cps.size() && utf8::IsSpace(cps[i])) ++i;
      if (i >= cps.size()) break;
      if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) >= maxsplit) {
        std::vector<char32_t> rest(cps.begin() + static_cast<std::ptrdiff_t>(i), cps.end());
        size_t end = rest.size();
        while (end > 0 && utf8::IsSpace(rest[end - 1])) --end;  // Python trims the remainder
        rest.resize(end);
        if (from_right) std::reverse(rest.begin(), rest.end());
        parts.push_back(utf8::Encode(rest));
        break;
      }
      const size_t start = i;
      while (i < cps.size() && !utf8::IsSpace(cps[i])) ++i;
      std::vector<char32_t> word(cps.begin() + static_cast<std::ptrdiff_t>(start),
                                 cps.begin() + static_cast<std::ptrdiff_t>(i));
      if (from_right) std::reverse(word.begin(), word.end());
      parts.push_back(utf8::Encode(word));
    }
    if (from_right) std::reverse(parts.begin(), parts.end());
  } else {
    if (!sep_arg->is_string()) return Status::Error("split() separator must be a string");
    const std::string& sep = sep_arg->as_string();
    if (sep.empty()) return Status::Error("split() separator is empty");
    if (!from_right) {
      size_t pos = 0;
      while (maxsplit < 0 || static_cast<int64_t>(parts.size()) < maxsplit) {
        const size_t hit = s.find(sep, pos);
        if (hit == std::string::npos) break;
        parts.push_back(s.substr(pos, hit - pos));
        pos = hit + sep.size();
        MT_RETURN_IF_ERROR(in.CheckList(parts.size()));
      }
      parts.push_back(s.substr(pos));
    } else {
      size_t end = s.size();
      while (maxsplit < 0 || static_cast<int64_t>(parts.size()) < maxsplit) {
        if (end < sep.size()) break;
        const size_t hit = s.rfind(sep, end - sep.size());
        if (hit == std::string::npos) break;
        parts.push_back(s.substr(hit + sep.size(), end - hit - sep.size()));
        end = hit;
        MT_RETURN_IF_ERROR(in.CheckList(parts.size()));
      }
      parts.push_back(s.substr(0, end));
      std::reverse(parts.begin(), parts.end());
    }
  }
  MT_RETURN_IF_ERROR(in.CheckList(parts.size()));
  return StringList(std::move(parts));
}

std::string TitleCase(const std::string& s) {
  // @huggingface/jinja's title: upper-case each ASCII word character that starts a word
  // (/\b\w/g); the rest of the word is left as it is.
  auto word = [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
  };
  std::string out = s;
  for (size_t i = 0; i < out.size(); ++i) {
    if (word(out[i]) && (i == 0 || !word(out[i - 1])) && out[i] >= 'a' && out[i] <= 'z') {
      out[i] = static_cast<char>(out[i] - 32);
    }
  }
  return out;
}

std::string Capitalize(const std::string& s) {
  if (s.empty()) return s;
  size_t i = 0;
  const char32_t first = utf8::Next(s, &i);
  std::string out;
  utf8::Append(&out, utf8::UpperOf(first));
  out.append(s, i, std::string::npos);
  return out;
}

Expected<std::string> Indent(const std::string& s, const CallArgs& args, const Interpreter& in) {
  const Value* width_arg = args.Get(0, "width");
  std::string pad(4, ' ');
  if (width_arg && width_arg->is_int()) {
    if (width_arg->as_int() < 0 || width_arg->as_int() > 1024) {
      return Status::Error("indent width must be between 0 and 1024");
    }
    pad.assign(static_cast<size_t>(width_arg->as_int()), ' ');
  } else if (width_arg && width_arg->is_string()) {
    pad = width_arg->as_string();  // Jinja2 accepts the indentation text itself
  } else if (width_arg && !width_arg->is_undefined()) {
    return Status::Error("indent width must be an integer");
  }
  const Value* first_arg = args.Get(1, "first");
  const Value* blank_arg = args.Get(2, "blank");
  const bool first = first_arg && Truthy(*first_arg);
  const bool blank = blank_arg && Truthy(*blank_arg);
  std::string out;
  size_t start = 0;
  for (size_t line = 0;; ++line) {
    const size_t nl = s.find('\n', start);
    const std::string_view text =
        std::string_view(s).substr(start, nl == std::string::npos ? std::string::npos : nl - start);
    const bool skip = (line == 0 && !first) || (text.empty() && !blank);
    if (!skip) out += pad;
    out += text;
    MT_RETURN_IF_ERROR(in.CheckString(out.size()));
    if (nl == std::string::npos) break;
    out.push_back('\n');
    start = nl + 1;
  }
  return out;
}

std::string HtmlEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out.push_back(c);
    }
  }
  return out;
}

ValueList DictItems(const ValueDict& d) {
  ValueList items;
  items.reserve(d.size());
  for (const auto& [k, v] : d.entries()) items.push_back(Value::List({Value::String(k), v}));
  return items;
}

Expected<Value> DictSort(const ValueDict& d, const CallArgs& args) {
  MT_ASSIGN_OR_RETURN(bool case_sensitive,
                      BoolArg(args.Get(0, "case_sensitive"), false, "case_sensitive"));
  const Value* by_arg = args.Get(1, "by");
  std::string by = "key";
  if (by_arg && !by_arg->is_undefined()) {
    if (!by_arg->is_string() || (by_arg->as_string() != "key" && by_arg->as_string() != "value")) {
      return Status::Error("dictsort 'by' must be 'key' or 'value'");
    }
    by = by_arg->as_string();
  }
  MT_ASSIGN_OR_RETURN(bool reverse, BoolArg(args.Get(2, "reverse"), false, "reverse"));
  ValueList items = DictItems(d);
  std::vector<Value> keys;
  for (const Value& item : items) keys.push_back(item.as_list()[by == "key" ? 0 : 1]);
  MT_ASSIGN_OR_RETURN(ValueList sorted, SortBy(items, keys, reverse, case_sensitive));
  return Value::List(std::move(sorted));
}

}  // namespace moetier::text::jinja::detail
