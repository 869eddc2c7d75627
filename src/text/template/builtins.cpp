#include "text/template/builtins.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <ctime>
#include <utility>

#include "text/template/text_functions.h"
#include "text/template/utf8.h"

namespace moetier::text::jinja {
namespace {

using namespace detail;  // NOLINT: the shared helpers of the builtins

// ---- tests ---------------------------------------------------------------------------------

Expected<bool> NeedArg(const CallArgs& args, const std::string& test) {
  if (args.positional.empty()) return Status::Error("test '" + test + "' needs an argument");
  return true;
}

// ---- methods -------------------------------------------------------------------------------

Value Method(const std::string& name,
             std::function<Expected<Value>(CallArgs&, const CallSite&)> f) {
  return Value::Func(name, std::move(f));
}

Value StringMethod(const std::string& s, const std::string& name) {
  auto trim = [s](utf8::TrimSide side) {
    return [s, side](CallArgs& args, const CallSite&) -> Expected<Value> {
      // Python's strip(chars) strips exactly those characters; without an argument it strips
      // whitespace (JavaScript's set, as @huggingface/jinja's trim does).
      const Value* chars = args.Get(0, "chars");
      if (chars && chars->is_string()) {
        return Value::String(utf8::TrimChars(s, chars->as_string(), side));
      }
      if (chars && !chars->is_none() && !chars->is_undefined()) {
        return Status::Error("strip argument must be a string or none");
      }
      return Value::String(utf8::Trim(s, side));
    };
  };
  auto affix = [s](bool prefix) {
    return [s, prefix](CallArgs& args, const CallSite&) -> Expected<Value> {
      const char* fname = prefix ? "startswith" : "endswith";
      if (args.positional.empty()) {
        return Status::Error(std::string(fname) + "() needs an argument");
      }
      auto matches = [&](const std::string& a) {
        if (a.size() > s.size()) return false;
        return prefix ? s.compare(0, a.size(), a) == 0
                      : s.compare(s.size() - a.size(), a.size(), a) == 0;
      };
      const Value& arg = args.positional[0];
      if (arg.is_string()) return Value::Bool(matches(arg.as_string()));
      if (arg.is_list()) {
        for (const Value& item : arg.as_list()) {
          if (!item.is_string()) return Status::Error(std::string(fname) + "() needs strings");
          if (matches(item.as_string())) return Value::Bool(true);
        }
        return Value::Bool(false);
      }
      return Status::Error(std::string(fname) + "() argument must be a string or a tuple");
    };
  };
  if (name == "length") return Value::Int(static_cast<int64_t>(utf8::Length(s)));
  if (name == "upper")
    return Method(name, [s](CallArgs&, const CallSite&) -> Expected<Value> {
      return Value::String(utf8::ToUpper(s));
    });
  if (name == "lower")
    return Method(name, [s](CallArgs&, const CallSite&) -> Expected<Value> {
      return Value::String(utf8::ToLower(s));
    });
  if (name == "title")
    return Method(name, [s](CallArgs&, const CallSite&) -> Expected<Value> {
      return Value::String(TitleCase(s));
    });
  if (name == "capitalize") {
    return Method(name, [s](CallArgs&, const CallSite&) -> Expected<Value> {
      return Value::String(Capitalize(s));
    });
  }
  if (name == "strip") return Method(name, trim(utf8::TrimSide::kBoth));
  if (name == "lstrip") return Method(name, trim(utf8::TrimSide::kLeft));
  if (name == "rstrip") return Method(name, trim(utf8::TrimSide::kRight));
  if (name == "startswith") return Method(name, affix(true));
  if (name == "endswith") return Method(name, affix(false));
  if (name == "split" || name == "rsplit") {
    const bool right = name == "rsplit";
    return Method(name, [s, right](CallArgs& args, const CallSite& site) -> Expected<Value> {
      return Split(s, args.Get(0, "sep"), args.Get(1, "maxsplit"), right, *site.interpreter);
    });
  }
  if (name == "replace") {
    return Method(name, [s](CallArgs& args, const CallSite& site) -> Expected<Value> {
      const Value* a = args.Get(0, "old");
      const Value* b = args.Get(1, "new");
      if (!a || !b || !a->is_string() || !b->is_string()) {
        return Status::Error("replace() needs two string arguments");
      }
      const Value* c = args.Get(2, "count");
      const int64_t count = c && c->is_int() ? c->as_int() : -1;
      MT_ASSIGN_OR_RETURN(std::string out,
                          Replace(s, a->as_string(), b->as_string(), count, *site.interpreter));
      return Value::String(std::move(out));
    });
  }
  if (name == "find" || name == "rfind" || name == "count") {
    return Method(name, [s, name](CallArgs& args, const CallSite&) -> Expected<Value> {
      if (args.positional.empty() || !args.positional[0].is_string()) {
        return Status::Error(name + "() needs a string argument");
      }
      const std::string& sub = args.positional[0].as_string();
      if (name == "count") {
        if (sub.empty()) return Value::Int(static_cast<int64_t>(utf8::Length(s) + 1));
        int64_t n = 0;
        for (size_t pos = s.find(sub); pos != std::string::npos;
             pos = s.find(sub, pos + sub.size()))
          ++n;
        return Value::Int(n);
      }
      const size_t hit = name == "find" ? s.find(sub) : s.rfind(sub);
      if (hit == std::string::npos) return Value::Int(-1);
      return Value::Int(static_cast<int64_t>(utf8::Length(std::string_view(s).substr(0, hit))));
    });
  }
  if (name == "join") {
    return Method(name, [s](CallArgs& args, const CallSite& site) -> Expected<Value> {
      if (args.positional.empty() || !args.positional[0].is_list()) {
        return Status::Error("join() needs a list");
      }
      std::string out;
      const ValueList& items = args.positional[0].as_list();
      for (size_t i = 0; i < items.size(); ++i) {
        if (i > 0) out += s;
        out += JoinPart(items[i]);
        MT_RETURN_IF_ERROR(site.interpreter->CheckString(out.size()));
      }
      return Value::String(std::move(out));
    });
  }
  if (name == "splitlines") {
    return Method(name, [s](CallArgs&, const CallSite&) -> Expected<Value> {
      std::vector<std::string> lines;
      size_t start = 0;
      for (size_t i = 0; i < s.size(); ++i) {
        if (s[i] == '\n' || s[i] == '\r') {
          lines.push_back(s.substr(start, i - start));
          if (s[i] == '\r' && i + 1 < s.size() && s[i + 1] == '\n') ++i;
          start = i + 1;
        }
      }
      if (start < s.size()) lines.push_back(s.substr(start));
      return StringList(std::move(lines));
    });
  }
  return Value();
}

Value DictMethod(const Value& dict, const std::string& name) {
  if (name == "get") {
    return Method(name, [dict](CallArgs& args, const CallSite&) -> Expected<Value> {
      if (args.positional.empty() || !args.positional[0].is_string()) {
        return Status::Error("get() needs a string key");
      }
      if (const Value* v = dict.as_dict().Find(args.positional[0].as_string())) return *v;
      return args.positional.size() > 1 ? args.positional[1] : Value::None();
    });
  }
  if (name == "items") {
    return Method(name, [dict](CallArgs&, const CallSite&) -> Expected<Value> {
      return Value::List(DictItems(dict.as_dict()));
    });
  }
  if (name == "keys" || name == "values") {
    const bool keys = name == "keys";
    return Method(name, [dict, keys](CallArgs&, const CallSite&) -> Expected<Value> {
      ValueList out;
      for (const auto& [k, v] : dict.as_dict().entries()) {
        out.push_back(keys ? Value::String(k) : v);
      }
      return Value::List(std::move(out));
    });
  }
  if (name == "dictsort") {
    return Method(name, [dict](CallArgs& args, const CallSite&) -> Expected<Value> {
      return DictSort(dict.as_dict(), args);
    });
  }
  return Value();
}

// ---- globals -------------------------------------------------------------------------------

Expected<Value> Range(CallArgs& args, const CallSite& site) {
  int64_t bounds[3] = {0, 0, 1};
  const size_t n = args.positional.size();
  if (n < 1 || n > 3) return Status::Error("range() takes 1 to 3 integers");
  for (size_t i = 0; i < n; ++i) {
    const Value& a = args.positional[i];
    if (!a.is_int())
      return Status::Error(std::string("range() needs integers, got a ") + TypeName(a));
  }
  if (n == 1) {
    bounds[1] = args.positional[0].as_int();
  } else {
    bounds[0] = args.positional[0].as_int();
    bounds[1] = args.positional[1].as_int();
    if (n == 3) bounds[2] = args.positional[2].as_int();
  }
  const int64_t start = bounds[0], stop = bounds[1], step = bounds[2];
  if (step == 0) return Status::Error("range() step must not be zero");
  // Count first (in floating point, so huge bounds cannot overflow) and refuse huge ranges.
  const double count = std::ceil((static_cast<double>(stop) - static_cast<double>(start)) /
                                 static_cast<double>(step));
  if (count > static_cast<double>(site.interpreter->limits().max_list_items)) {
    return site.interpreter->CheckList(site.interpreter->limits().max_list_items + 1);
  }
  ValueList items;
  for (int64_t i = 0; i < static_cast<int64_t>(std::max(0.0, count)); ++i) {
    items.push_back(Value::Int(start + i * step));
  }
  return Value::List(std::move(items));
}

Expected<Value> StrftimeNow(CallArgs& args, const CallSite& site) {
  if (args.positional.empty() || !args.positional[0].is_string()) {
    return Status::Error("strftime_now() needs a format string");
  }
  const std::string& format = args.positional[0].as_string();
  if (format.size() > 256) return Status::Error("strftime_now() format longer than 256 bytes");
  const std::tm now = site.interpreter->Now();
  std::string buf(format.size() * 16 + 64, '\0');
  const size_t n = std::strftime(buf.data(), buf.size(), format.c_str(), &now);
  if (n == 0 && !format.empty()) return Value::String("");
  buf.resize(n);
  return Value::String(std::move(buf));
}

Expected<Value> MakeNamespace(CallArgs& args, const CallSite& site) {
  ValueDict entries;
  if (args.positional.size() > 1)
    return Status::Error("namespace() takes at most 1 positional argument");
  if (args.positional.size() == 1) {
    const Value& source = args.positional[0];
    if (source.is_dict()) {
      for (const auto& [k, v] : source.as_dict().entries()) entries.Set(k, v);
    } else if (source.is_list()) {
      for (const Value& pair : source.as_list()) {
        if (!pair.is_list() || pair.as_list().size() != 2 || !pair.as_list()[0].is_string()) {
          return Status::Error("namespace() expects a dict or a list of [key, value] pairs");
        }
        entries.Set(pair.as_list()[0].as_string(), pair.as_list()[1]);
      }
    } else {
      return Status::Error(std::string("namespace() cannot take a ") + TypeName(source));
    }
  }
  for (const auto& [k, v] : args.keyword) entries.Set(k, v);
  Value ns = Value::Namespace(std::move(entries));
  if (site.interpreter != nullptr) site.interpreter->TrackNamespace(ns);
  return ns;
}

}  // namespace

void InstallGlobals(Scope* root) {
  auto& vars = root->vars;
  vars["true"] = vars["True"] = Value::Bool(true);
  vars["false"] = vars["False"] = Value::Bool(false);
  vars["none"] = vars["None"] = Value::None();
  vars["raise_exception"] =
      Value::Func("raise_exception", [](CallArgs& args, const CallSite& site) -> Expected<Value> {
        std::string message;
        if (!args.positional.empty()) {
          auto s = ToOutputString(args.positional[0]);
          message = s.ok() ? *s : std::string();
        }
        return site.interpreter->Raise(std::move(message));
      });
  vars["range"] = Value::Func("range", Range);
  vars["strftime_now"] = Value::Func("strftime_now", StrftimeNow);
  vars["namespace"] = Value::Func("namespace", MakeNamespace);
  vars["dict"] = Value::Func("dict", [](CallArgs& args, const CallSite&) -> Expected<Value> {
    ValueDict d;
    if (!args.positional.empty()) {
      if (!args.positional[0].is_dict()) return Status::Error("dict() takes keyword arguments");
      for (const auto& [k, v] : args.positional[0].as_dict().entries()) d.Set(k, v);
    }
    for (const auto& [k, v] : args.keyword) d.Set(k, v);
    return Value::Dict(std::move(d));
  });
}

Expected<bool> ApplyTest(const std::string& name, const Value& v, const CallArgs& args) {
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "boolean") return v.is_bool();
  if (name == "true") return v.is_bool() && v.as_bool();
  if (name == "false") return v.is_bool() && !v.as_bool();
  if (name == "string") return v.is_string();
  if (name == "number") return v.is_number();
  if (name == "integer") return v.is_int();
  if (name == "float") return v.is_float();
  if (name == "mapping") return v.is_dict();
  if (name == "iterable") return v.is_list() || v.is_string();
  if (name == "sequence") return v.is_list() || v.is_dict() || v.is_string();
  if (name == "callable") return v.is_function();
  if (name == "lower") return v.is_string() && v.as_string() == utf8::ToLower(v.as_string());
  if (name == "upper") return v.is_string() && v.as_string() == utf8::ToUpper(v.as_string());
  if (name == "odd" || name == "even") {
    if (!v.is_int())
      return Status::Error("test '" + name + "' needs an integer, got a " + TypeName(v));
    const bool odd = v.as_int() % 2 != 0;
    return name == "odd" ? odd : !odd;
  }
  if (name == "divisibleby") {
    MT_RETURN_IF_ERROR(NeedArg(args, name).status());
    const Value& d = args.positional[0];
    if (!v.is_int() || !d.is_int() || d.as_int() == 0) {
      return Status::Error("test 'divisibleby' needs integers and a non-zero divisor");
    }
    if (d.as_int() == -1) return true;
    return v.as_int() % d.as_int() == 0;
  }
  if (name == "eq" || name == "equalto" || name == "==" || name == "sameas") {
    if (args.positional.empty())
      return StrictEquals(v, Value());  // @huggingface/jinja's 1-arg form
    return StrictEquals(v, args.positional[0]);
  }
  if (name == "ne" || name == "!=") {
    MT_RETURN_IF_ERROR(NeedArg(args, name).status());
    return !StrictEquals(v, args.positional[0]);
  }
  if (name == "gt" || name == "ge" || name == "lt" || name == "le" || name == "greaterthan" ||
      name == "lessthan") {
    MT_RETURN_IF_ERROR(NeedArg(args, name).status());
    const Value& o = args.positional[0];
    MT_RETURN_IF_ERROR(CheckComparable({v, o}));
    const int c = CompareKeys(v, o, true);
    if (name == "gt" || name == "greaterthan") return c > 0;
    if (name == "ge") return c >= 0;
    if (name == "lt" || name == "lessthan") return c < 0;
    return c <= 0;
  }
  if (name == "in") {
    MT_RETURN_IF_ERROR(NeedArg(args, name).status());
    const Value& container = args.positional[0];
    if (container.is_list()) {
      for (const Value& item : container.as_list())
        if (StrictEquals(v, item)) return true;
      return false;
    }
    if (container.is_string() && v.is_string()) {
      return container.as_string().find(v.as_string()) != std::string::npos;
    }
    if (container.is_dict() && v.is_string())
      return container.as_dict().Find(v.as_string()) != nullptr;
    return Status::Error(std::string("test 'in' cannot search a ") + TypeName(container));
  }
  return Status::Error("unknown test '" + name + "'");
}

Value LookupMethod(const Value& receiver, const std::string& name) {
  if (receiver.is_string()) return StringMethod(receiver.as_string(), name);
  if (receiver.is_dict()) return DictMethod(receiver, name);
  if (receiver.is_list() && name == "length") {
    return Value::Int(static_cast<int64_t>(receiver.as_list().size()));
  }
  return Value();
}

}  // namespace moetier::text::jinja
