#include "common/chat_template/jinja_value.h"

#include <charconv>
#include <cmath>

#include "nlohmann/json.hpp"

namespace kvserve::jinja {

Value Value::None() {
  Value v;
  v.kind_ = Kind::kNone;
  return v;
}

Value Value::Bool(bool b) {
  Value v;
  v.kind_ = Kind::kBool;
  v.bool_ = b;
  return v;
}

Value Value::Int(int64_t i) {
  Value v;
  v.kind_ = Kind::kInt;
  v.int_ = i;
  return v;
}

Value Value::Float(double f) {
  Value v;
  v.kind_ = Kind::kFloat;
  v.float_ = f;
  return v;
}

Value Value::String(std::string s) {
  Value v;
  v.kind_ = Kind::kString;
  v.string_ = std::move(s);
  return v;
}

Value Value::MakeList(List items) {
  Value v;
  v.kind_ = Kind::kList;
  v.list_ = std::make_shared<const List>(std::move(items));
  return v;
}

Value Value::MakeMap(Map entries) {
  Value v;
  v.kind_ = Kind::kMap;
  v.map_ = std::make_shared<const Map>(std::move(entries));
  return v;
}

Value Value::MakeNamespace(Map entries) {
  Value v;
  v.kind_ = Kind::kMap;
  v.namespace_ = std::make_shared<Map>(std::move(entries));
  v.map_ = v.namespace_;
  return v;
}

bool Value::SetAttribute(const std::string& key, Value value) const {
  if (namespace_ == nullptr) return false;
  for (auto& [k, v] : *namespace_) {
    if (k == key) {
      v = std::move(value);
      return true;
    }
  }
  namespace_->emplace_back(key, std::move(value));
  return true;
}

namespace {

template <class Json>
Value ValueFromJson(const Json& json) {
  switch (json.type()) {
    case Json::value_t::null:
      return Value::None();
    case Json::value_t::boolean:
      return Value::Bool(json.template get<bool>());
    case Json::value_t::number_integer:
      return Value::Int(json.template get<int64_t>());
    case Json::value_t::number_unsigned:
      return Value::Int(static_cast<int64_t>(json.template get<uint64_t>()));
    case Json::value_t::number_float:
      return Value::Float(json.template get<double>());
    case Json::value_t::string:
      return Value::String(json.template get<std::string>());
    case Json::value_t::array: {
      Value::List items;
      items.reserve(json.size());
      for (const auto& item : json) items.push_back(ValueFromJson(item));
      return Value::MakeList(std::move(items));
    }
    case Json::value_t::object: {
      Value::Map entries;
      entries.reserve(json.size());
      for (const auto& [key, item] : json.items()) entries.emplace_back(key, ValueFromJson(item));
      return Value::MakeMap(std::move(entries));
    }
    default:
      return Value();
  }
}

}  // namespace

Value Value::FromJson(const nlohmann::json& json) { return ValueFromJson(json); }
Value Value::FromJson(const nlohmann::ordered_json& json) { return ValueFromJson(json); }

double Value::as_double() const { return kind_ == Kind::kInt ? static_cast<double>(int_) : float_; }

bool Value::Truthy() const {
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return bool_;
    case Kind::kInt:
      return int_ != 0;
    case Kind::kFloat:
      return float_ != 0;
    case Kind::kString:
      return !string_.empty();
    case Kind::kList:
      return !list_->empty();
    case Kind::kMap:
      return !map_->empty();
  }
  return false;
}

namespace {

std::string FloatToString(double f) {
  if (std::isnan(f)) return "nan";
  if (std::isinf(f)) return f > 0 ? "inf" : "-inf";
  char buffer[64];
  const auto result = std::to_chars(buffer, buffer + sizeof(buffer), f);
  std::string text(buffer, result.ptr);
  if (text.find_first_of(".e") == std::string::npos) text += ".0";
  return text;
}

}  // namespace

std::string Value::ToString() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "";
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return bool_ ? "True" : "False";
    case Kind::kInt:
      return std::to_string(int_);
    case Kind::kFloat:
      return FloatToString(float_);
    case Kind::kString:
      return string_;
    case Kind::kList: {
      std::string out = "[";
      for (size_t i = 0; i < list_->size(); ++i) {
        if (i > 0) out += ", ";
        out += (*list_)[i].Repr();
      }
      return out + "]";
    }
    case Kind::kMap: {
      std::string out = "{";
      for (size_t i = 0; i < map_->size(); ++i) {
        if (i > 0) out += ", ";
        out += String((*map_)[i].first).Repr() + ": " + (*map_)[i].second.Repr();
      }
      return out + "}";
    }
  }
  return "";
}

std::string Value::Repr() const {
  if (kind_ != Kind::kString) return ToString();
  // Python quotes with ' unless the text holds ' and no ".
  const bool double_quote =
      string_.find('\'') != std::string::npos && string_.find('"') == std::string::npos;
  const char quote = double_quote ? '"' : '\'';
  std::string out(1, quote);
  for (char c : string_) {
    if (c == '\\' || c == quote) {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\r') {
      out += "\\r";
    } else {
      out += c;
    }
  }
  return out + quote;
}

bool Value::Equals(const Value& other) const {
  if (is_number() || kind_ == Kind::kBool) {
    if (!other.is_number() && other.kind_ != Kind::kBool) return false;
    const double a = kind_ == Kind::kBool ? (bool_ ? 1 : 0) : as_double();
    const double b = other.kind_ == Kind::kBool ? (other.bool_ ? 1 : 0) : other.as_double();
    if (kind_ == Kind::kInt && other.kind_ == Kind::kInt) return int_ == other.int_;
    return a == b;
  }
  if (kind_ != other.kind_) return false;
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone:
      return true;
    case Kind::kString:
      return string_ == other.string_;
    case Kind::kList: {
      if (list_->size() != other.list_->size()) return false;
      for (size_t i = 0; i < list_->size(); ++i) {
        if (!(*list_)[i].Equals((*other.list_)[i])) return false;
      }
      return true;
    }
    case Kind::kMap: {
      if (map_->size() != other.map_->size()) return false;
      for (const auto& [key, value] : *map_) {
        const Value* found = other.Find(key);
        if (found == nullptr || !value.Equals(*found)) return false;
      }
      return true;
    }
    default:
      return false;
  }
}

const Value* Value::Find(const std::string& key) const {
  if (kind_ != Kind::kMap) return nullptr;
  for (const auto& [k, v] : *map_) {
    if (k == key) return &v;
  }
  return nullptr;
}

const char* Value::PythonTypeName() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "Undefined";
    case Kind::kNone:
      return "NoneType";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return "str";
    case Kind::kList:
      return "list";
    case Kind::kMap:
      return namespace_ != nullptr ? "Namespace" : "dict";
  }
  return "?";
}

const char* Value::TypeName() const {
  switch (kind_) {
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
    case Kind::kMap:
      return "mapping";
  }
  return "?";
}

}  // namespace kvserve::jinja
