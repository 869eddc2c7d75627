// The filters (`value | name(args)`): @huggingface/jinja's set with its semantics, plus the
// Jinja2 filters it lacks.
#include <algorithm>
#include <cmath>
#include <unordered_map>
#include <utility>

#include "text/template/builtins.h"
#include "text/template/text_functions.h"
#include "text/template/utf8.h"

namespace moetier::text::jinja {
namespace {

using namespace detail;  // NOLINT: the shared helpers of the builtins

using FilterFn = Expected<Value> (*)(const Value& operand, CallArgs& args, const CallSite& site);

// A test (or filter) applied element-wise by select/reject/selectattr/rejectattr/map.
Expected<bool> RunTest(const Value* test_name, const Value& operand, const CallArgs& rest) {
  if (test_name == nullptr || test_name->is_undefined()) return Truthy(operand);
  if (!test_name->is_string()) return Status::Error("the test name must be a string");
  return ApplyTest(test_name->as_string(), operand, rest);
}

CallArgs TailArgs(const CallArgs& args, size_t from) {
  CallArgs rest;
  for (size_t i = from; i < args.positional.size(); ++i)
    rest.positional.push_back(args.positional[i]);
  rest.keyword = args.keyword;
  return rest;
}

// ---- filters -------------------------------------------------------------------------------

Expected<Value> FSafe(const Value& v, CallArgs&, const CallSite&) {
  return v;
}

Expected<Value> FToJson(const Value& v, CallArgs& args, const CallSite& site) {
  JsonOptions o;
  if (const Value* indent = args.Keyword("indent"); indent && !indent->is_none()) {
    if (!indent->is_int()) return Status::Error("tojson indent must be an integer");
    if (indent->as_int() > 64) return Status::Error("tojson indent above 64");
    o.indent = static_cast<int>(indent->as_int());
  }
  MT_ASSIGN_OR_RETURN(o.ensure_ascii, BoolArg(args.Keyword("ensure_ascii"), false, "ensure_ascii"));
  MT_ASSIGN_OR_RETURN(o.sort_keys, BoolArg(args.Keyword("sort_keys"), false, "sort_keys"));
  if (o.indent > 0) o.item_separator.assign(1, ',');  // Python drops the space when indenting
  if (const Value* seps = args.Keyword("separators"); seps && !seps->is_none()) {
    if (!seps->is_list() || seps->as_list().size() != 2 || !seps->as_list()[0].is_string() ||
        !seps->as_list()[1].is_string()) {
      return Status::Error("tojson separators must be a pair of strings");
    }
    o.item_separator = seps->as_list()[0].as_string();
    o.key_separator = seps->as_list()[1].as_string();
  }
  MT_ASSIGN_OR_RETURN(std::string json, ToJson(v, o));
  MT_RETURN_IF_ERROR(site.interpreter->CheckString(json.size()));
  return Value::String(std::move(json));
}

Expected<Value> FDefault(const Value& v, CallArgs& args, const CallSite&) {
  const Value* fallback = args.Get(0, "default_value");
  MT_ASSIGN_OR_RETURN(bool boolean, BoolArg(args.Get(1, "boolean"), false, "boolean"));
  if (v.is_undefined() || (boolean && !Truthy(v))) {
    return fallback ? *fallback : Value::String("");
  }
  return v;
}

Expected<Value> FLength(const Value& v, CallArgs&, const CallSite&) {
  if (v.is_list()) return Value::Int(static_cast<int64_t>(v.as_list().size()));
  if (v.is_string()) return Value::Int(static_cast<int64_t>(utf8::Length(v.as_string())));
  if (v.is_dict()) return Value::Int(static_cast<int64_t>(v.as_dict().size()));
  return FilterTypeError("length", v);
}

Expected<Value> FList(const Value& v, CallArgs&, const CallSite&) {
  if (v.is_list()) return v;
  if (v.is_string()) return StringList(Characters(v.as_string()));
  if (v.is_dict()) {
    std::vector<std::string> keys;
    for (const auto& [k, item] : v.as_dict().entries()) keys.push_back(k);
    return StringList(std::move(keys));
  }
  return FilterTypeError("list", v);
}

Expected<Value> FFirst(const Value& v, CallArgs&, const CallSite&) {
  if (v.is_list()) return v.as_list().empty() ? Value() : v.as_list().front();
  if (v.is_string()) {
    auto chars = Characters(v.as_string());
    return chars.empty() ? Value() : Value::String(chars.front());
  }
  return FilterTypeError("first", v);
}

Expected<Value> FLast(const Value& v, CallArgs&, const CallSite&) {
  if (v.is_list()) return v.as_list().empty() ? Value() : v.as_list().back();
  if (v.is_string()) {
    auto chars = Characters(v.as_string());
    return chars.empty() ? Value() : Value::String(chars.back());
  }
  return FilterTypeError("last", v);
}

Expected<Value> FReverse(const Value& v, CallArgs&, const CallSite&) {
  if (v.is_list()) {
    ValueList items(v.as_list().rbegin(), v.as_list().rend());
    return Value::List(std::move(items));
  }
  if (v.is_string()) {
    std::vector<char32_t> cps = utf8::Decode(v.as_string());
    std::reverse(cps.begin(), cps.end());
    return Value::String(utf8::Encode(cps));
  }
  return FilterTypeError("reverse", v);
}

Expected<Value> FSort(const Value& v, CallArgs& args, const CallSite&) {
  if (!v.is_list()) return FilterTypeError("sort", v);
  MT_ASSIGN_OR_RETURN(bool reverse, BoolArg(args.Get(0, "reverse"), false, "reverse"));
  MT_ASSIGN_OR_RETURN(bool case_sensitive,
                      BoolArg(args.Get(1, "case_sensitive"), false, "case_sensitive"));
  const Value* attribute = args.Get(2, "attribute");
  std::vector<Value> keys;
  for (const Value& item : v.as_list()) {
    if (attribute && attribute->is_string()) {
      keys.push_back(GetAttributePath(item, attribute->as_string()));
    } else if (attribute && attribute->is_int()) {
      keys.push_back(GetAttributePath(item, std::to_string(attribute->as_int())));
    } else {
      keys.push_back(item);
    }
  }
  MT_ASSIGN_OR_RETURN(ValueList sorted, SortBy(v.as_list(), keys, reverse, case_sensitive));
  return Value::List(std::move(sorted));
}

Expected<Value> FJoin(const Value& v, CallArgs& args, const CallSite& site) {
  const Value* sep_arg = args.Get(0, "d");
  if (!sep_arg) sep_arg = args.Keyword("separator");
  std::string sep;
  if (sep_arg && !sep_arg->is_undefined()) {
    if (!sep_arg->is_string()) return Status::Error("join separator must be a string");
    sep = sep_arg->as_string();
  }
  const Value* attribute = args.Get(1, "attribute");
  std::vector<std::string> parts;
  if (v.is_string()) {
    if (!sep_arg) return v;  // joining a string's characters with nothing: itself
    parts = Characters(v.as_string());
  } else if (v.is_list()) {
    for (const Value& item : v.as_list()) {
      parts.push_back(JoinPart(attribute && attribute->is_string()
                                   ? GetAttributePath(item, attribute->as_string())
                                   : item));
    }
  } else {
    return FilterTypeError("join", v);
  }
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i > 0) out += sep;
    out += parts[i];
    MT_RETURN_IF_ERROR(site.interpreter->CheckString(out.size()));
  }
  return Value::String(std::move(out));
}

Expected<Value> FString(const Value& v, CallArgs&, const CallSite&) {
  if (v.is_undefined() || v.is_none() || v.is_function()) return FilterTypeError("string", v);
  MT_ASSIGN_OR_RETURN(std::string s, ToOutputString(v));
  return Value::String(std::move(s));
}

Expected<Value> FUnique(const Value& v, CallArgs&, const CallSite&) {
  if (!v.is_list()) return FilterTypeError("unique", v);
  ValueList out;
  for (const Value& item : v.as_list()) {
    bool seen = false;
    for (const Value& kept : out) seen = seen || StrictEquals(kept, item);
    if (!seen) out.push_back(item);
  }
  return Value::List(std::move(out));
}

Expected<Value> FItems(const Value& v, CallArgs&, const CallSite&) {
  if (v.is_dict()) return Value::List(DictItems(v.as_dict()));
  if (v.is_undefined()) return Value::List({});
  return FilterTypeError("items", v);
}

Expected<Value> FDictSort(const Value& v, CallArgs& args, const CallSite&) {
  if (!v.is_dict()) return FilterTypeError("dictsort", v);
  return DictSort(v.as_dict(), args);
}

Expected<Value> FMap(const Value& v, CallArgs& args, const CallSite& site) {
  if (!v.is_list()) return FilterTypeError("map", v);
  ValueList out;
  if (const Value* attribute = args.Keyword("attribute")) {
    if (!attribute->is_string() && !attribute->is_int()) {
      return Status::Error("map attribute must be a string");
    }
    const std::string path =
        attribute->is_string() ? attribute->as_string() : std::to_string(attribute->as_int());
    const Value* fallback = args.Keyword("default");
    for (const Value& item : v.as_list()) {
      Value got = GetAttributePath(item, path);
      out.push_back(got.is_undefined() && fallback ? *fallback : got);
    }
    return Value::List(std::move(out));
  }
  if (args.positional.empty() || !args.positional[0].is_string()) {
    return Status::Error("map needs attribute= or the name of a filter");
  }
  const std::string filter = args.positional[0].as_string();
  // The filter may be map again (`map('map', 'map', ...)`), recursing once per argument.
  NestingGuard level = site.interpreter->Nest();
  if (level.exceeded()) return site.interpreter->NestingError();
  for (const Value& item : v.as_list()) {
    CallArgs rest = TailArgs(args, 1);
    MT_ASSIGN_OR_RETURN(Value mapped, ApplyFilter(filter, item, rest, site));
    out.push_back(std::move(mapped));
  }
  return Value::List(std::move(out));
}

Expected<Value> SelectImpl(const Value& v, CallArgs& args, bool by_attribute, bool keep_if,
                           const char* name) {
  if (!v.is_list()) return FilterTypeError(name, v);
  ValueList out;
  std::string attr;
  size_t test_index = 0;
  if (by_attribute) {
    if (args.positional.empty() || !args.positional[0].is_string()) {
      return Status::Error(std::string(name) + " needs an attribute name");
    }
    attr = args.positional[0].as_string();
    test_index = 1;
  }
  const Value* test = test_index < args.positional.size() ? &args.positional[test_index] : nullptr;
  const CallArgs rest = TailArgs(args, test_index + 1);
  for (const Value& item : v.as_list()) {
    bool result = false;
    if (by_attribute) {
      // @huggingface/jinja: items must be dicts; a missing attribute never passes the test.
      if (!item.is_dict() && !item.is_namespace()) {
        return Status::Error(std::string(name) + " can only be applied to a list of dicts");
      }
      const ValueDict& d = item.is_dict() ? item.as_dict() : item.namespace_dict();
      const Value* a = d.Find(attr);
      if (a) {
        MT_ASSIGN_OR_RETURN(result, RunTest(test, *a, rest));
      }
    } else {
      MT_ASSIGN_OR_RETURN(result, RunTest(test, item, rest));
    }
    if (result == keep_if) out.push_back(item);
  }
  return Value::List(std::move(out));
}

Expected<Value> FSelectAttr(const Value& v, CallArgs& a, const CallSite&) {
  return SelectImpl(v, a, true, true, "selectattr");
}
Expected<Value> FRejectAttr(const Value& v, CallArgs& a, const CallSite&) {
  return SelectImpl(v, a, true, false, "rejectattr");
}
Expected<Value> FSelect(const Value& v, CallArgs& a, const CallSite&) {
  return SelectImpl(v, a, false, true, "select");
}
Expected<Value> FReject(const Value& v, CallArgs& a, const CallSite&) {
  return SelectImpl(v, a, false, false, "reject");
}

Expected<Value> FTrim(const Value& v, CallArgs& args, const CallSite&) {
  if (!v.is_string()) return FilterTypeError("trim", v);
  const Value* chars = args.Get(0, "chars");
  if (chars && chars->is_string()) {
    return Value::String(utf8::TrimChars(v.as_string(), chars->as_string(), utf8::TrimSide::kBoth));
  }
  return Value::String(utf8::Trim(v.as_string(), utf8::TrimSide::kBoth));
}

Expected<Value> FUpper(const Value& v, CallArgs&, const CallSite&) {
  if (!v.is_string()) return FilterTypeError("upper", v);
  return Value::String(utf8::ToUpper(v.as_string()));
}
Expected<Value> FLower(const Value& v, CallArgs&, const CallSite&) {
  if (!v.is_string()) return FilterTypeError("lower", v);
  return Value::String(utf8::ToLower(v.as_string()));
}
Expected<Value> FTitle(const Value& v, CallArgs&, const CallSite&) {
  if (!v.is_string()) return FilterTypeError("title", v);
  return Value::String(TitleCase(v.as_string()));
}
Expected<Value> FCapitalize(const Value& v, CallArgs&, const CallSite&) {
  if (!v.is_string()) return FilterTypeError("capitalize", v);
  return Value::String(Capitalize(v.as_string()));
}

Expected<Value> FIndent(const Value& v, CallArgs& args, const CallSite& site) {
  if (!v.is_string()) return FilterTypeError("indent", v);
  MT_ASSIGN_OR_RETURN(std::string out, Indent(v.as_string(), args, *site.interpreter));
  return Value::String(std::move(out));
}

Expected<Value> FReplace(const Value& v, CallArgs& args, const CallSite& site) {
  if (!v.is_string()) return FilterTypeError("replace", v);
  const Value* old_arg = args.Get(0, "old");
  const Value* new_arg = args.Get(1, "new");
  if (!old_arg || !new_arg || !old_arg->is_string() || !new_arg->is_string()) {
    return Status::Error("replace needs two string arguments");
  }
  const Value* count_arg = args.Get(2, "count");
  const int64_t count = count_arg && count_arg->is_int() ? count_arg->as_int() : -1;
  MT_ASSIGN_OR_RETURN(std::string out, Replace(v.as_string(), old_arg->as_string(),
                                               new_arg->as_string(), count, *site.interpreter));
  return Value::String(std::move(out));
}

Expected<Value> FInt(const Value& v, CallArgs& args, const CallSite&) {
  const Value* fallback = args.Get(0, "default");
  if (v.is_int()) return v;
  if (v.is_float()) {
    const double f = std::floor(v.as_float());
    if (!std::isfinite(f) || std::fabs(f) >= 9.2e18) return Status::Error("int of a huge float");
    return Value::Int(static_cast<int64_t>(f));
  }
  if (v.is_bool()) return Value::Int(v.as_bool() ? 1 : 0);
  if (v.is_string()) {
    const auto parsed = JsParseInt(v.as_string());
    if (parsed) return Value::Int(*parsed);
    return fallback ? *fallback : Value::Int(0);
  }
  return FilterTypeError("int", v);
}

Expected<Value> FFloat(const Value& v, CallArgs& args, const CallSite&) {
  const Value* fallback = args.Get(0, "default");
  if (v.is_number() || v.is_bool()) return Value::Float(v.as_number());
  if (v.is_string()) {
    const auto parsed = JsParseFloat(v.as_string());
    if (parsed) return Value::Float(*parsed);
    return fallback ? *fallback : Value::Float(0.0);
  }
  return FilterTypeError("float", v);
}

Expected<Value> FBool(const Value& v, CallArgs&, const CallSite&) {
  return Value::Bool(Truthy(v));
}

Expected<Value> FAbs(const Value& v, CallArgs&, const CallSite&) {
  if (v.is_int()) {
    if (v.as_int() == INT64_MIN) return Status::Error("integer overflow in abs");
    return Value::Int(v.as_int() < 0 ? -v.as_int() : v.as_int());
  }
  if (v.is_float()) return Value::Float(std::fabs(v.as_float()));
  return FilterTypeError("abs", v);
}

Expected<Value> FRound(const Value& v, CallArgs& args, const CallSite&) {
  if (!v.is_number()) return FilterTypeError("round", v);
  const Value* precision_arg = args.Get(0, "precision");
  const int64_t precision = precision_arg && precision_arg->is_int() ? precision_arg->as_int() : 0;
  if (precision < 0 || precision > 15) return Status::Error("round precision must be 0..15");
  const Value* method_arg = args.Get(1, "method");
  const std::string method =
      method_arg && method_arg->is_string() ? method_arg->as_string() : "common";
  const double scale = std::pow(10.0, static_cast<double>(precision));
  const double x = v.as_number() * scale;
  double r = 0;
  if (method == "common") {
    r = std::round(x);
  } else if (method == "floor") {
    r = std::floor(x);
  } else if (method == "ceil") {
    r = std::ceil(x);
  } else {
    return Status::Error("round method must be 'common', 'floor' or 'ceil'");
  }
  return Value::Float(r / scale);
}

Expected<Value> FSum(const Value& v, CallArgs& args, const CallSite&) {
  if (!v.is_list()) return FilterTypeError("sum", v);
  const Value* attribute = args.Get(0, "attribute");
  const Value* start = args.Get(1, "start");
  bool is_float = start && start->is_float();
  double fsum = start && start->is_number() ? start->as_number() : 0;
  int64_t isum = start && start->is_int() ? start->as_int() : 0;
  for (const Value& raw : v.as_list()) {
    const Value item =
        attribute && attribute->is_string() ? GetAttributePath(raw, attribute->as_string()) : raw;
    if (!item.is_number() && !item.is_bool()) {
      return Status::Error(std::string("sum of a ") + TypeName(item));
    }
    is_float = is_float || item.is_float();
    fsum += item.as_number();
    if (item.is_int() && __builtin_add_overflow(isum, item.as_int(), &isum)) {
      return Status::Error("integer overflow in sum");
    }
    if (item.is_bool()) isum += item.as_bool() ? 1 : 0;
  }
  return is_float ? Value::Float(fsum) : Value::Int(isum);
}

Expected<Value> MinMax(const Value& v, CallArgs& args, bool want_max, const char* name) {
  if (!v.is_list()) return FilterTypeError(name, v);
  if (v.as_list().empty()) return Value();
  MT_ASSIGN_OR_RETURN(bool case_sensitive,
                      BoolArg(args.Get(0, "case_sensitive"), false, "case_sensitive"));
  const Value* attribute = args.Get(1, "attribute");
  std::vector<Value> keys;
  for (const Value& item : v.as_list()) {
    keys.push_back(attribute && attribute->is_string()
                       ? GetAttributePath(item, attribute->as_string())
                       : item);
  }
  MT_RETURN_IF_ERROR(CheckComparable(keys));
  size_t best = 0;
  for (size_t i = 1; i < keys.size(); ++i) {
    const int c = CompareKeys(keys[i], keys[best], case_sensitive);
    if (want_max ? c > 0 : c < 0) best = i;
  }
  return v.as_list()[best];
}
Expected<Value> FMax(const Value& v, CallArgs& a, const CallSite&) {
  return MinMax(v, a, true, "max");
}
Expected<Value> FMin(const Value& v, CallArgs& a, const CallSite&) {
  return MinMax(v, a, false, "min");
}

Expected<Value> FBatch(const Value& v, CallArgs& args, const CallSite&) {
  if (!v.is_list()) return FilterTypeError("batch", v);
  const Value* size_arg = args.Get(0, "linecount");
  if (!size_arg || !size_arg->is_int() || size_arg->as_int() <= 0) {
    return Status::Error("batch needs a positive size");
  }
  const auto n = static_cast<size_t>(size_arg->as_int());
  const Value* fill = args.Get(1, "fill_with");
  ValueList out;
  ValueList row;
  for (const Value& item : v.as_list()) {
    row.push_back(item);
    if (row.size() == n) out.push_back(Value::List(std::exchange(row, {})));
  }
  if (!row.empty()) {
    if (fill && !fill->is_undefined()) {
      while (row.size() < n) row.push_back(*fill);
    }
    out.push_back(Value::List(std::move(row)));
  }
  return Value::List(std::move(out));
}

Expected<Value> FEscape(const Value& v, CallArgs&, const CallSite&) {
  MT_ASSIGN_OR_RETURN(std::string s, ToOutputString(v));
  return Value::String(HtmlEscape(s));
}

Expected<Value> FWordCount(const Value& v, CallArgs&, const CallSite&) {
  if (!v.is_string()) return FilterTypeError("wordcount", v);
  int64_t n = 0;
  bool in_word = false;
  for (char32_t cp : utf8::Decode(v.as_string())) {
    const bool word = !utf8::IsSpace(cp);
    if (word && !in_word) ++n;
    in_word = word;
  }
  return Value::Int(n);
}

const std::unordered_map<std::string, FilterFn>& Filters() {
  static const std::unordered_map<std::string, FilterFn> kFilters = {
      {"safe", FSafe},
      {"tojson", FToJson},
      {"default", FDefault},
      {"d", FDefault},
      {"length", FLength},
      {"count", FLength},
      {"list", FList},
      {"first", FFirst},
      {"last", FLast},
      {"reverse", FReverse},
      {"sort", FSort},
      {"join", FJoin},
      {"string", FString},
      {"unique", FUnique},
      {"items", FItems},
      {"dictsort", FDictSort},
      {"map", FMap},
      {"selectattr", FSelectAttr},
      {"rejectattr", FRejectAttr},
      {"select", FSelect},
      {"reject", FReject},
      {"trim", FTrim},
      {"upper", FUpper},
      {"lower", FLower},
      {"title", FTitle},
      {"capitalize", FCapitalize},
      {"indent", FIndent},
      {"replace", FReplace},
      {"int", FInt},
      {"float", FFloat},
      {"bool", FBool},
      {"abs", FAbs},
      {"round", FRound},
      {"sum", FSum},
      {"max", FMax},
      {"min", FMin},
      {"batch", FBatch},
      {"e", FEscape},
      {"escape", FEscape},
      {"wordcount", FWordCount},
  };
  return kFilters;
}

}  // namespace

Expected<Value> ApplyFilter(const std::string& name, const Value& operand, CallArgs& args,
                            const CallSite& site) {
  MT_RETURN_IF_ERROR(site.interpreter->Step());
  const auto& filters = Filters();
  auto it = filters.find(name);
  if (it != filters.end()) return it->second(operand, args, site);
  // A dict's methods double as filters in @huggingface/jinja (`d | keys`).
  if (operand.is_dict()) {
    Value method = LookupMethod(operand, name);
    if (method.is_function()) return method.as_function().call(args, site);
  }
  return Status::Error("unknown filter '" + name + "'");
}

}  // namespace moetier::text::jinja
