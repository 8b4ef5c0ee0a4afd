#ifndef KVSERVE_COMMON_CHAT_TEMPLATE_JINJA_VALUE_H_
#define KVSERVE_COMMON_CHAT_TEMPLATE_JINJA_VALUE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "nlohmann/json_fwd.hpp"

namespace kvserve::jinja {

/// A value of the template language: what variables hold and expressions produce. Lists and
/// maps are shared and immutable once built (templates cannot mutate them), so copies are cheap.
/// Maps keep insertion order, as Python dicts do.
class Value {
 public:
  enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kMap };
  using List = std::vector<Value>;
  using Map = std::vector<std::pair<std::string, Value>>;

  /// Undefined: a missing variable or key. Renders as "", is falsy.
  Value() = default;
  static Value None();
  static Value Bool(bool b);
  static Value Int(int64_t i);
  static Value Float(double f);
  static Value String(std::string s);
  static Value MakeList(List items);
  static Value MakeMap(Map entries);
  /// A namespace() object: a map whose entries `{% set ns.name = value %}` replaces in place,
  /// seen by every copy (the one mutable value of the language, as in Jinja2).
  static Value MakeNamespace(Map entries);
  /// JSON null → None, objects → maps (in the JSON's key order: nlohmann::json sorts keys,
  /// ordered_json keeps them as written), arrays → lists.
  static Value FromJson(const nlohmann::json& json);
  static Value FromJson(const nlohmann::ordered_json& json);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_number() const { return kind_ == Kind::kInt || kind_ == Kind::kFloat; }
  bool as_bool() const { return bool_; }
  int64_t as_int() const { return int_; }
  /// Int or float as a double.
  double as_double() const;
  const std::string& as_string() const { return string_; }
  const List& as_list() const { return *list_; }
  const Map& as_map() const { return *map_; }

  /// Python truthiness: undefined, None, False, 0, "", [] and {} are false.
  bool Truthy() const;
  /// Python str(): None → "None", True → "True", 1.0 → "1.0", lists → "['a', 1]".
  std::string ToString() const;
  /// Python repr() (strings quoted), used for items inside lists and maps.
  std::string Repr() const;
  /// Python ==: numbers compare by value across int/float; containers deeply.
  bool Equals(const Value& other) const;
  /// The map entry for `key`, or nullptr (also for non-maps).
  const Value* Find(const std::string& key) const;
  /// A short name of the kind for error messages ("string", "list", ...).
  const char* TypeName() const;
  /// Python's name of the type ("str", "dict", "NoneType", ...), for errors worded as Python's.
  const char* PythonTypeName() const;
  bool is_namespace() const { return namespace_ != nullptr; }
  /// Sets `key` of a namespace (replacing or appending); false for any other value.
  bool SetAttribute(const std::string& key, Value value) const;

 private:
  Kind kind_ = Kind::kUndefined;
  bool bool_ = false;
  int64_t int_ = 0;
  double float_ = 0;
  std::string string_;
  std::shared_ptr<const List> list_;
  std::shared_ptr<const Map> map_;
  // A namespace's entries (map_ points at the same map).
  std::shared_ptr<Map> namespace_;
};

}  // namespace kvserve::jinja

#endif  // KVSERVE_COMMON_CHAT_TEMPLATE_JINJA_VALUE_H_
