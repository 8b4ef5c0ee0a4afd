#include "common/chat_template/jinja_render.h"

#include <algorithm>
#include <cmath>
#include <ctime>
#include <string_view>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "nlohmann/json.hpp"

namespace kvserve::jinja {
namespace {

using Kind = Value::Kind;

absl::Status Error(int line, absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat("line ", line, ": ", message));
}

/// Splits a UTF-8 string into code points (Python iterates strings by code point).
std::vector<std::string> CodePoints(const std::string& s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    size_t n = 1;
    while (i + n < s.size() && (static_cast<unsigned char>(s[i + n]) & 0xC0) == 0x80) ++n;
    out.push_back(s.substr(i, n));
    i += n;
  }
  return out;
}

/// Python's str.strip() family with the default (whitespace) or given characters.
std::string StripChars(const std::string& s, const std::string* chars, bool left, bool right) {
  auto strip = [&](char c) {
    return chars == nullptr ? absl::ascii_isspace(static_cast<unsigned char>(c))
                            : chars->find(c) != std::string::npos;
  };
  size_t begin = 0;
  size_t end = s.size();
  if (left) {
    while (begin < end && strip(s[begin])) ++begin;
  }
  if (right) {
    while (end > begin && strip(s[end - 1])) --end;
  }
  return s.substr(begin, end - begin);
}

/// Python's floor division and modulo on integers.
int64_t FloorDiv(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

class Renderer {
 public:
  Renderer(const Value::Map& globals, const RenderEnv& env)
      : limits_(env.limits), today_(env.today) {
    scopes_.emplace_back();
    for (const auto& [name, value] : globals) scopes_.back()[name] = value;
  }

  absl::Status RenderNodes(const std::vector<Node>& nodes) {
    for (const Node& node : nodes) {
      if (absl::Status s = RenderNode(node); !s.ok()) return s;
    }
    return absl::OkStatus();
  }

  std::string TakeOutput() { return std::move(out_); }

 private:
  absl::Status Append(const std::string& text, int line) {
    if (out_.size() + text.size() > limits_.max_output_bytes) {
      return Error(line, absl::StrCat("output exceeds ", limits_.max_output_bytes, " bytes"));
    }
    out_ += text;
    return absl::OkStatus();
  }

  absl::Status RenderNode(const Node& node) {
    switch (node.kind) {
      case Node::Kind::kText:
        return Append(node.text, node.line);
      case Node::Kind::kOutput: {
        absl::StatusOr<Value> value = Eval(*node.expr);
        if (!value.ok()) return value.status();
        return Append(value->ToString(), node.line);
      }
      case Node::Kind::kSet: {
        absl::StatusOr<Value> value = Eval(*node.expr);
        if (!value.ok()) return value.status();
        if (node.attribute.empty()) {
          scopes_.back()[node.targets[0]] = *std::move(value);
          return absl::OkStatus();
        }
        const Value target = Lookup(node.targets[0]);
        if (!target.SetAttribute(node.attribute, *std::move(value))) {
          return Error(node.line, absl::StrCat("cannot assign attribute on non-namespace object '",
                                               node.targets[0], "'"));
        }
        return absl::OkStatus();
      }
      case Node::Kind::kIf:
        for (const Node::Branch& branch : node.branches) {
          bool taken = branch.condition == nullptr;
          if (!taken) {
            absl::StatusOr<Value> condition = Eval(*branch.condition);
            if (!condition.ok()) return condition.status();
            taken = condition->Truthy();
          }
          if (taken) return RenderNodes(branch.body);
        }
        return absl::OkStatus();
      case Node::Kind::kFor:
        return RenderFor(node);
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::vector<Value>> Iterate(const Value& value, int line) {
    switch (value.kind()) {
      case Kind::kUndefined:
        return std::vector<Value>{};
      case Kind::kList:
        return value.as_list();
      case Kind::kMap: {
        std::vector<Value> keys;
        for (const auto& entry : value.as_map()) keys.push_back(Value::String(entry.first));
        return keys;
      }
      case Kind::kString: {
        std::vector<Value> chars;
        for (std::string& c : CodePoints(value.as_string())) {
          chars.push_back(Value::String(std::move(c)));
        }
        return chars;
      }
      default:
        return Error(line, absl::StrCat("cannot iterate over a ", value.TypeName()));
    }
  }

  absl::Status RenderFor(const Node& node) {
    absl::StatusOr<Value> iterable = Eval(*node.expr);
    if (!iterable.ok()) return iterable.status();
    absl::StatusOr<std::vector<Value>> all = Iterate(*iterable, node.line);
    if (!all.ok()) return all.status();
    scopes_.emplace_back();
    auto bind = [&](const Value& item) -> absl::Status {
      if (node.targets.size() == 1) {
        scopes_.back()[node.targets[0]] = item;
        return absl::OkStatus();
      }
      if (item.kind() != Kind::kList || item.as_list().size() != node.targets.size()) {
        return Error(node.line, "cannot unpack the loop item into two variables");
      }
      for (size_t i = 0; i < node.targets.size(); ++i) {
        scopes_.back()[node.targets[i]] = item.as_list()[i];
      }
      return absl::OkStatus();
    };
    std::vector<Value> items;
    if (node.filter == nullptr) {
      items = *std::move(all);
    } else {
      for (const Value& item : *all) {
        if (absl::Status s = bind(item); !s.ok()) return s;
        absl::StatusOr<Value> keep = Eval(*node.filter);
        if (!keep.ok()) return keep.status();
        if (keep->Truthy()) items.push_back(item);
      }
    }
    const int64_t length = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < length; ++i) {
      if (++iterations_ > limits_.max_iterations) {
        return Error(node.line,
                     absl::StrCat("more than ", limits_.max_iterations, " loop iterations"));
      }
      if (absl::Status s = bind(items[i]); !s.ok()) return s;
      scopes_.back()["loop"] = Value::MakeMap({
          {"index", Value::Int(i + 1)},
          {"index0", Value::Int(i)},
          {"revindex", Value::Int(length - i)},
          {"revindex0", Value::Int(length - i - 1)},
          {"first", Value::Bool(i == 0)},
          {"last", Value::Bool(i + 1 == length)},
          {"length", Value::Int(length)},
      });
      if (absl::Status s = RenderNodes(node.body); !s.ok()) return s;
    }
    scopes_.pop_back();
    if (length == 0) return RenderNodes(node.else_body);
    return absl::OkStatus();
  }

  Value Lookup(const std::string& name) const {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
      if (auto found = it->find(name); found != it->end()) return found->second;
    }
    // The global functions are defined names too (`strftime_now is defined`); as values they
    // render like Python's functions.
    if (name == "raise_exception" || name == "namespace" || name == "strftime_now") {
      return Value::String(absl::StrCat("<function ", name, ">"));
    }
    return Value();
  }

  /// The error for reading `what` from an undefined or None value produced by `source`.
  static absl::Status NoAttribute(const Expr& source, const Value& value, int line,
                                  const std::string& what) {
    if (value.is_undefined() && source.kind == Expr::Kind::kName) {
      return Error(line, absl::StrCat("'", source.name, "' is undefined"));
    }
    return Error(line, absl::StrCat("cannot read ", what, " of ",
                                    value.is_undefined() ? "an undefined value" : "None"));
  }

  absl::StatusOr<Value> Item(const Value& container, const Value& key, int line) {
    switch (container.kind()) {
      case Kind::kMap: {
        if (key.kind() != Kind::kString) return Value();
        const Value* found = container.Find(key.as_string());
        return found == nullptr ? Value() : *found;
      }
      case Kind::kList:
      case Kind::kString: {
        if (key.kind() != Kind::kInt) {
          return Error(line, absl::StrCat("a ", container.TypeName(), " index must be an integer"));
        }
        if (container.kind() == Kind::kList) {
          const auto& list = container.as_list();
          int64_t i =
              key.as_int() < 0 ? key.as_int() + static_cast<int64_t>(list.size()) : key.as_int();
          if (i < 0 || i >= static_cast<int64_t>(list.size())) return Value();
          return list[static_cast<size_t>(i)];
        }
        std::vector<std::string> chars = CodePoints(container.as_string());
        int64_t i =
            key.as_int() < 0 ? key.as_int() + static_cast<int64_t>(chars.size()) : key.as_int();
        if (i < 0 || i >= static_cast<int64_t>(chars.size())) return Value();
        return Value::String(chars[static_cast<size_t>(i)]);
      }
      default:
        return Value();
    }
  }

  absl::StatusOr<Value> Slice(const Expr& expr) {
    absl::StatusOr<Value> target = Eval(*expr.args[0]);
    if (!target.ok()) return target;
    int64_t bounds[3] = {0, 0, 1};
    bool given[3] = {false, false, false};
    for (int i = 0; i < 3; ++i) {
      if (expr.args[i + 1] == nullptr) continue;
      absl::StatusOr<Value> v = Eval(*expr.args[i + 1]);
      if (!v.ok()) return v;
      if (v->kind() == Kind::kNone) continue;
      if (v->kind() != Kind::kInt) return Error(expr.line, "slice bounds must be integers");
      bounds[i] = v->as_int();
      given[i] = true;
    }
    const int64_t step = bounds[2];
    if (step == 0) return Error(expr.line, "slice step cannot be zero");
    std::vector<Value> items;
    const bool is_string = target->kind() == Kind::kString;
    if (is_string) {
      for (std::string& c : CodePoints(target->as_string())) {
        items.push_back(Value::String(std::move(c)));
      }
    } else if (target->kind() == Kind::kList) {
      items = target->as_list();
    } else {
      return Error(expr.line, absl::StrCat("cannot slice a ", target->TypeName()));
    }
    const int64_t n = static_cast<int64_t>(items.size());
    auto clamp = [&](int64_t v, bool is_given, int64_t fallback) {
      if (!is_given) return fallback;
      if (v < 0) v += n;
      if (step > 0) return std::clamp<int64_t>(v, 0, n);
      return std::clamp<int64_t>(v, -1, n - 1);
    };
    const int64_t start = clamp(bounds[0], given[0], step > 0 ? 0 : n - 1);
    const int64_t stop = clamp(bounds[1], given[1], step > 0 ? n : -1);
    std::vector<Value> picked;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
      picked.push_back(items[static_cast<size_t>(i)]);
    }
    if (!is_string) return Value::MakeList(std::move(picked));
    std::string text;
    for (const Value& c : picked) text += c.as_string();
    return Value::String(std::move(text));
  }

  absl::StatusOr<Value> Arithmetic(const std::string& op, const Value& a, const Value& b,
                                   int line) {
    if (op == "~") return Value::String(a.ToString() + b.ToString());
    if (op == "+") {
      if (a.kind() == Kind::kString && b.kind() == Kind::kString) {
        return Value::String(a.as_string() + b.as_string());
      }
      if (a.kind() == Kind::kList && b.kind() == Kind::kList) {
        std::vector<Value> joined = a.as_list();
        joined.insert(joined.end(), b.as_list().begin(), b.as_list().end());
        return Value::MakeList(std::move(joined));
      }
    }
    if (op == "+" && (a.kind() == Kind::kString || a.kind() == Kind::kList)) {
      return Error(line, absl::StrCat("can only concatenate ", a.PythonTypeName(), " (not \"",
                                      b.PythonTypeName(), "\") to ", a.PythonTypeName()));
    }
    if (!a.is_number() || !b.is_number()) {
      return Error(line, absl::StrCat("unsupported operand type(s) for ", op, ": '",
                                      a.PythonTypeName(), "' and '", b.PythonTypeName(), "'"));
    }
    if (a.kind() == Kind::kInt && b.kind() == Kind::kInt && op != "/") {
      const int64_t x = a.as_int();
      const int64_t y = b.as_int();
      int64_t r = 0;
      bool overflow = false;
      if (op == "+") {
        overflow = __builtin_add_overflow(x, y, &r);
      } else if (op == "-") {
        overflow = __builtin_sub_overflow(x, y, &r);
      } else if (op == "*") {
        overflow = __builtin_mul_overflow(x, y, &r);
      } else {
        if (y == 0) return Error(line, "integer division or modulo by zero");
        if (x == INT64_MIN && y == -1) return Error(line, "integer overflow");
        r = FloorDiv(x, y);
        if (op == "%") r = x - r * y;
      }
      if (overflow) return Error(line, "integer overflow");
      return Value::Int(r);
    }
    const double x = a.as_double();
    const double y = b.as_double();
    if (op == "+") return Value::Float(x + y);
    if (op == "-") return Value::Float(x - y);
    if (op == "*") return Value::Float(x * y);
    if (y == 0) return Error(line, "division by zero");
    if (op == "/") return Value::Float(x / y);
    const double q = std::floor(x / y);
    return Value::Float(op == "//" ? q : x - q * y);
  }

  absl::StatusOr<Value> Compare(const std::string& op, const Value& a, const Value& b, int line) {
    if (op == "==") return Value::Bool(a.Equals(b));
    if (op == "!=") return Value::Bool(!a.Equals(b));
    if (op == "in" || op == "not in") {
      bool found = false;
      if (b.kind() == Kind::kString) {
        if (a.kind() != Kind::kString) {
          return Error(line, "'in <string>' requires a string on the left");
        }
        found = absl::StrContains(b.as_string(), a.as_string());
      } else if (b.kind() == Kind::kList) {
        for (const Value& item : b.as_list()) found = found || item.Equals(a);
      } else if (b.kind() == Kind::kMap) {
        found = a.kind() == Kind::kString && b.Find(a.as_string()) != nullptr;
      } else if (!b.is_undefined()) {
        return Error(line,
                     absl::StrCat("'in' needs a string, list or mapping, got a ", b.TypeName()));
      }
      return Value::Bool(op == "in" ? found : !found);
    }
    int order = 0;
    if (a.is_number() && b.is_number()) {
      order = a.as_double() < b.as_double() ? -1 : (a.as_double() > b.as_double() ? 1 : 0);
    } else if (a.kind() == Kind::kString && b.kind() == Kind::kString) {
      order = a.as_string().compare(b.as_string());
    } else {
      return Error(
          line, absl::StrCat("cannot compare ", a.TypeName(), " and ", b.TypeName(), " with ", op));
    }
    if (op == "<") return Value::Bool(order < 0);
    if (op == "<=") return Value::Bool(order <= 0);
    if (op == ">") return Value::Bool(order > 0);
    return Value::Bool(order >= 0);
  }

  absl::StatusOr<std::vector<Value>> EvalArgs(const Expr& expr, size_t first, size_t max_args) {
    if (expr.args.size() - first > max_args) {
      return Error(expr.line,
                   absl::StrCat("'", expr.name, "' takes at most ", max_args, " argument(s)"));
    }
    std::vector<Value> values;
    for (size_t i = first; i < expr.args.size(); ++i) {
      if (i < expr.keywords.size() && !expr.keywords[i].empty()) {
        return Error(expr.line,
                     absl::StrCat("'", expr.name, "' got an unexpected keyword argument '",
                                  expr.keywords[i], "'"));
      }
      absl::StatusOr<Value> v = Eval(*expr.args[i]);
      if (!v.ok()) return v.status();
      values.push_back(*std::move(v));
    }
    return values;
  }

  absl::StatusOr<Value> Filter(const Expr& expr) {
    absl::StatusOr<Value> input = Eval(*expr.args[0]);
    if (!input.ok()) return input;
    if (expr.name == "tojson") return ToJson(expr, *input);
    absl::StatusOr<std::vector<Value>> args = EvalArgs(expr, 1, 2);
    if (!args.ok()) return args.status();
    const std::string& name = expr.name;
    const Value& v = *input;
    if (name == "default" || name == "d") {
      const bool use_default =
          args->size() > 1 && (*args)[1].Truthy() ? !v.Truthy() : v.is_undefined();
      return use_default ? (args->empty() ? Value::String("") : (*args)[0]) : v;
    }
    if (name == "string") return Value::String(v.ToString());
    if (name == "length" || name == "count") {
      switch (v.kind()) {
        case Kind::kUndefined:
          return Value::Int(0);
        case Kind::kString:
          return Value::Int(static_cast<int64_t>(CodePoints(v.as_string()).size()));
        case Kind::kList:
          return Value::Int(static_cast<int64_t>(v.as_list().size()));
        case Kind::kMap:
          return Value::Int(static_cast<int64_t>(v.as_map().size()));
        default:
          return Error(expr.line, absl::StrCat("a ", v.TypeName(), " has no length"));
      }
    }
    if (name == "first" || name == "last") {
      absl::StatusOr<std::vector<Value>> items = Iterate(v, expr.line);
      if (!items.ok()) return items.status();
      if (items->empty()) return Value();
      return name == "first" ? items->front() : items->back();
    }
    if (name == "join") {
      absl::StatusOr<std::vector<Value>> items = Iterate(v, expr.line);
      if (!items.ok()) return items.status();
      const std::string separator = args->empty() ? "" : (*args)[0].ToString();
      std::vector<std::string> parts;
      for (const Value& item : *items) parts.push_back(item.ToString());
      return Value::String(absl::StrJoin(parts, separator));
    }
    if (v.kind() != Kind::kString) {
      return Error(expr.line,
                   absl::StrCat("filter '", name, "' needs a string, got a ", v.TypeName()));
    }
    if (name == "trim") return Value::String(StripChars(v.as_string(), nullptr, true, true));
    if (name == "upper") return Value::String(absl::AsciiStrToUpper(v.as_string()));
    return Value::String(absl::AsciiStrToLower(v.as_string()));  // lower
  }

  static bool Test(const std::string& name, const Value& v) {
    const Kind k = v.kind();
    if (name == "defined") return k != Kind::kUndefined;
    if (name == "undefined") return k == Kind::kUndefined;
    if (name == "none") return k == Kind::kNone;
    if (name == "string") return k == Kind::kString;
    if (name == "number") return k == Kind::kInt || k == Kind::kFloat;
    if (name == "integer") return k == Kind::kInt;
    if (name == "boolean") return k == Kind::kBool;
    if (name == "true") return k == Kind::kBool && v.as_bool();
    if (name == "false") return k == Kind::kBool && !v.as_bool();
    if (name == "mapping") return k == Kind::kMap;
    return k == Kind::kString || k == Kind::kList || k == Kind::kMap;  // iterable, sequence
  }

  absl::StatusOr<Value> Method(const Expr& expr) {
    absl::StatusOr<Value> self = Eval(*expr.args[0]);
    if (!self.ok()) return self;
    absl::StatusOr<std::vector<Value>> args = EvalArgs(expr, 1, 2);
    if (!args.ok()) return args.status();
    const std::string& name = expr.name;
    if (self->is_undefined() || self->kind() == Kind::kNone) {
      return NoAttribute(*expr.args[0], *self, expr.line, absl::StrCat("method '", name, "'"));
    }
    if (self->kind() == Kind::kMap) {
      if (name == "get") {
        if (args->empty() || (*args)[0].kind() != Kind::kString) {
          return Error(expr.line, "get() needs a string key");
        }
        const Value* found = self->Find((*args)[0].as_string());
        if (found != nullptr) return *found;
        return args->size() > 1 ? (*args)[1] : Value::None();
      }
      std::vector<Value> out;
      for (const auto& [key, value] : self->as_map()) {
        if (name == "keys") {
          out.push_back(Value::String(key));
        } else if (name == "values") {
          out.push_back(value);
        } else if (name == "items") {
          out.push_back(Value::MakeList({Value::String(key), value}));
        } else {
          return Error(expr.line, absl::StrCat("a mapping has no method '", name, "'"));
        }
      }
      return Value::MakeList(std::move(out));
    }
    if (self->kind() != Kind::kString) {
      return Error(expr.line, absl::StrCat("a ", self->TypeName(), " has no method '", name, "'"));
    }
    const std::string& s = self->as_string();
    const std::string* chars =
        !args->empty() && (*args)[0].kind() == Kind::kString ? &(*args)[0].as_string() : nullptr;
    if (name == "strip") return Value::String(StripChars(s, chars, true, true));
    if (name == "lstrip") return Value::String(StripChars(s, chars, true, false));
    if (name == "rstrip") return Value::String(StripChars(s, chars, false, true));
    if (name == "upper") return Value::String(absl::AsciiStrToUpper(s));
    if (name == "lower") return Value::String(absl::AsciiStrToLower(s));
    if (name == "startswith" || name == "endswith") {
      if (chars == nullptr) return Error(expr.line, absl::StrCat(name, "() needs a string"));
      return Value::Bool(name == "startswith" ? absl::StartsWith(s, *chars)
                                              : absl::EndsWith(s, *chars));
    }
    if (name == "split") {
      std::vector<Value> parts;
      if (chars == nullptr) {
        for (absl::string_view p :
             absl::StrSplit(s, absl::ByAnyChar(" \t\n\r\f\v"), absl::SkipEmpty())) {
          parts.push_back(Value::String(std::string(p)));
        }
      } else {
        if (chars->empty()) return Error(expr.line, "split() separator is empty");
        for (absl::string_view p : absl::StrSplit(s, *chars)) {
          parts.push_back(Value::String(std::string(p)));
        }
      }
      return Value::MakeList(std::move(parts));
    }
    return Error(expr.line, absl::StrCat("a string has no method '", name, "'"));
  }

  // The global functions.
  absl::StatusOr<Value> Call(const Expr& expr) {
    if (expr.name == "namespace") {  // namespace(name=value, ...)
      Value::Map entries;
      for (size_t i = 0; i < expr.args.size(); ++i) {
        if (i >= expr.keywords.size() || expr.keywords[i].empty()) {
          return Error(expr.line, "namespace() takes keyword arguments only");
        }
        absl::StatusOr<Value> v = Eval(*expr.args[i]);
        if (!v.ok()) return v;
        entries.emplace_back(expr.keywords[i], *std::move(v));
      }
      return Value::MakeNamespace(std::move(entries));
    }
    absl::StatusOr<std::vector<Value>> args = EvalArgs(expr, 0, 1);
    if (!args.ok()) return args.status();
    if (expr.name == "strftime_now") {
      if (args->empty() || (*args)[0].kind() != Kind::kString) {
        return Error(expr.line, "strftime_now() takes a format string");
      }
      std::tm time{};
      time.tm_year = static_cast<int>(today_.year()) - 1900;
      time.tm_mon = today_.month() - 1;
      time.tm_mday = today_.day();
      timegm(&time);  // fills in the weekday and the day of the year
      std::string out(256, '\0');
      const size_t n = std::strftime(out.data(), out.size(), (*args)[0].as_string().c_str(), &time);
      out.resize(n);
      return Value::String(std::move(out));
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "raise_exception: ", args->empty() ? "template error" : (*args)[0].ToString()));
  }

  // value | tojson(indent=None, sort_keys=False): json.dumps(value, ensure_ascii=False, ...).
  absl::StatusOr<Value> ToJson(const Expr& expr, const Value& value) {
    int64_t indent = -1;
    bool sort_keys = false;
    for (size_t i = 1; i < expr.args.size(); ++i) {
      const std::string keyword = i < expr.keywords.size() ? expr.keywords[i] : "";
      absl::StatusOr<Value> v = Eval(*expr.args[i]);
      if (!v.ok()) return v;
      if (keyword == "indent" || (keyword.empty() && i == 1)) {
        if (v->kind() == Kind::kNone) continue;
        if (v->kind() != Kind::kInt || v->as_int() < 0 || v->as_int() > 64) {
          return Error(expr.line, "tojson: indent must be an integer in [0, 64] or none");
        }
        indent = v->as_int();
      } else if (keyword == "sort_keys") {
        sort_keys = v->Truthy();
      } else {
        return Error(expr.line, absl::StrCat("tojson: unsupported argument '", keyword, "'"));
      }
    }
    std::string out;
    if (absl::Status s = DumpJson(value, indent, sort_keys, 0, expr.line, &out); !s.ok()) return s;
    return Value::String(std::move(out));
  }

  // Python's json.dumps with ensure_ascii=False and the default separators (", " and ": ", or
  // "," and ": " with an indent).
  absl::Status DumpJson(const Value& v, int64_t indent, bool sort_keys, int64_t depth, int line,
                        std::string* out) {
    if (depth > 128) return Error(line, "tojson: nesting too deep");
    auto newline = [&](int64_t level) {
      if (indent < 0) return;
      *out += '\n';
      out->append(static_cast<size_t>(indent * level), ' ');
    };
    switch (v.kind()) {
      case Kind::kUndefined:
        return Error(line, "Object of type Undefined is not JSON serializable");
      case Kind::kNone:
        *out += "null";
        return absl::OkStatus();
      case Kind::kBool:
        *out += v.as_bool() ? "true" : "false";
        return absl::OkStatus();
      case Kind::kInt:
        *out += std::to_string(v.as_int());
        return absl::OkStatus();
      case Kind::kFloat: {
        const double f = v.as_double();
        *out += std::isnan(f)   ? "NaN"
                : std::isinf(f) ? (f > 0 ? "Infinity" : "-Infinity")
                                : v.ToString();
        return absl::OkStatus();
      }
      case Kind::kString:
        AppendJsonString(v.as_string(), out);
        return absl::OkStatus();
      case Kind::kList: {
        const Value::List& items = v.as_list();
        if (items.empty()) {
          *out += "[]";
          return absl::OkStatus();
        }
        *out += '[';
        for (size_t i = 0; i < items.size(); ++i) {
          if (i > 0) *out += indent < 0 ? ", " : ",";
          newline(depth + 1);
          if (absl::Status s = DumpJson(items[i], indent, sort_keys, depth + 1, line, out);
              !s.ok()) {
            return s;
          }
        }
        newline(depth);
        *out += ']';
        return absl::OkStatus();
      }
      case Kind::kMap: {
        if (v.is_namespace()) {
          return Error(line, "Object of type Namespace is not JSON serializable");
        }
        std::vector<const std::pair<std::string, Value>*> entries;
        for (const auto& entry : v.as_map()) entries.push_back(&entry);
        if (sort_keys) {
          std::stable_sort(entries.begin(), entries.end(),
                           [](const auto* a, const auto* b) { return a->first < b->first; });
        }
        if (entries.empty()) {
          *out += "{}";
          return absl::OkStatus();
        }
        *out += '{';
        for (size_t i = 0; i < entries.size(); ++i) {
          if (i > 0) *out += indent < 0 ? ", " : ",";
          newline(depth + 1);
          AppendJsonString(entries[i]->first, out);
          *out += ": ";
          if (absl::Status s =
                  DumpJson(entries[i]->second, indent, sort_keys, depth + 1, line, out);
              !s.ok()) {
            return s;
          }
        }
        newline(depth);
        *out += '}';
        return absl::OkStatus();
      }
    }
    return absl::OkStatus();
  }

  // A JSON string as Python writes it with ensure_ascii=False: quotes, backslashes and control
  // characters escaped (\n, \t, ..., \u00XX), everything else (UTF-8 included) as is, which is
  // also nlohmann::json's escaping.
  static void AppendJsonString(const std::string& s, std::string* out) {
    *out += nlohmann::json(s).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  }

  absl::StatusOr<Value> Eval(const Expr& expr) {
    switch (expr.kind) {
      case Expr::Kind::kLiteral:
        return expr.literal;
      case Expr::Kind::kName:
        return Lookup(expr.name);
      case Expr::Kind::kList: {
        absl::StatusOr<std::vector<Value>> items = EvalArgs(expr, 0, expr.args.size());
        if (!items.ok()) return items.status();
        return Value::MakeList(*std::move(items));
      }
      case Expr::Kind::kDict: {
        Value::Map entries;
        for (size_t i = 0; i + 1 < expr.args.size(); i += 2) {
          absl::StatusOr<Value> key = Eval(*expr.args[i]);
          if (!key.ok()) return key;
          if (key->kind() != Kind::kString) return Error(expr.line, "dict keys must be strings");
          absl::StatusOr<Value> value = Eval(*expr.args[i + 1]);
          if (!value.ok()) return value;
          entries.emplace_back(key->as_string(), *std::move(value));
        }
        return Value::MakeMap(std::move(entries));
      }
      case Expr::Kind::kAttr:
      case Expr::Kind::kItem: {
        absl::StatusOr<Value> target = Eval(*expr.args[0]);
        if (!target.ok()) return target;
        Value key = Value::String(expr.name);
        if (expr.kind == Expr::Kind::kItem) {
          absl::StatusOr<Value> k = Eval(*expr.args[1]);
          if (!k.ok()) return k;
          key = *std::move(k);
        }
        if (target->is_undefined() || target->kind() == Kind::kNone) {
          return NoAttribute(*expr.args[0], *target, expr.line,
                             absl::StrCat("'", key.ToString(), "'"));
        }
        if (expr.kind == Expr::Kind::kAttr && target->kind() != Kind::kMap) return Value();
        return Item(*target, key, expr.line);
      }
      case Expr::Kind::kSlice:
        return Slice(expr);
      case Expr::Kind::kNot: {
        absl::StatusOr<Value> v = Eval(*expr.args[0]);
        if (!v.ok()) return v;
        return Value::Bool(!v->Truthy());
      }
      case Expr::Kind::kNegate: {
        absl::StatusOr<Value> v = Eval(*expr.args[0]);
        if (!v.ok()) return v;
        if (v->kind() == Kind::kInt && v->as_int() != INT64_MIN) return Value::Int(-v->as_int());
        if (v->kind() == Kind::kFloat) return Value::Float(-v->as_double());
        return Error(expr.line, absl::StrCat("cannot negate a ", v->TypeName()));
      }
      case Expr::Kind::kAnd:
      case Expr::Kind::kOr: {
        absl::StatusOr<Value> left = Eval(*expr.args[0]);
        if (!left.ok()) return left;
        const bool decided = expr.kind == Expr::Kind::kAnd ? !left->Truthy() : left->Truthy();
        if (decided) return left;
        return Eval(*expr.args[1]);
      }
      case Expr::Kind::kBinary:
      case Expr::Kind::kCompare: {
        absl::StatusOr<Value> left = Eval(*expr.args[0]);
        if (!left.ok()) return left;
        absl::StatusOr<Value> right = Eval(*expr.args[1]);
        if (!right.ok()) return right;
        return expr.kind == Expr::Kind::kBinary ? Arithmetic(expr.name, *left, *right, expr.line)
                                                : Compare(expr.name, *left, *right, expr.line);
      }
      case Expr::Kind::kConditional: {
        absl::StatusOr<Value> condition = Eval(*expr.args[1]);
        if (!condition.ok()) return condition;
        if (condition->Truthy()) return Eval(*expr.args[0]);
        if (expr.args[2] == nullptr) return Value();
        return Eval(*expr.args[2]);
      }
      case Expr::Kind::kFilter:
        return Filter(expr);
      case Expr::Kind::kTest: {
        absl::StatusOr<Value> v = Eval(*expr.args[0]);
        if (!v.ok()) return v;
        return Value::Bool(Test(expr.name, *v) != expr.negated);
      }
      case Expr::Kind::kCall:
        return Call(expr);
      case Expr::Kind::kMethod:
        return Method(expr);
    }
    return Error(expr.line, "unknown expression");
  }

  const RenderLimits limits_;
  const absl::CivilDay today_;
  std::vector<absl::flat_hash_map<std::string, Value>> scopes_;
  std::string out_;
  int64_t iterations_ = 0;
};

}  // namespace

absl::StatusOr<std::string> Render(const std::vector<Node>& nodes, const Value::Map& globals,
                                   const RenderEnv& env) {
  Renderer renderer(globals, env);
  if (absl::Status s = renderer.RenderNodes(nodes); !s.ok()) return s;
  return renderer.TakeOutput();
}

}  // namespace kvserve::jinja
