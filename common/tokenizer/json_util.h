#ifndef KVSERVE_COMMON_TOKENIZER_JSON_UTIL_H_
#define KVSERVE_COMMON_TOKENIZER_JSON_UTIL_H_

// Small checked accessors for nlohmann::json objects. Each failure is an INVALID_ARGUMENT status
// that names the field (`where` is the path to the object, e.g. "pre_tokenizer.pretokenizers[1]").

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace kvserve::json_util {

/// `where.key`, for error messages.
inline std::string Field(const std::string& where, const std::string& key) {
  return where.empty() ? std::string(key) : absl::StrCat(where, ".", key);
}

/// An error naming `where`.
inline absl::Status Invalid(const std::string& where, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(where, ": ", what));
}

/// The required array field `key` of `j`, each element turned into a T by
/// `parse(element, "where.key[i]")`; the first failure is returned as is.
template <class T, class ParseFn>
absl::StatusOr<std::vector<T>> GetArrayOf(const nlohmann::json& j, const std::string& key,
                                          const std::string& where, ParseFn parse) {
  const auto it = j.find(key);
  if (it == j.end() || !it->is_array()) return Invalid(Field(where, key), "expected an array");
  std::vector<T> out;
  for (size_t i = 0; i < it->size(); ++i) {
    absl::StatusOr<T> item = parse((*it)[i], absl::StrCat(where, ".", key, "[", i, "]"));
    if (!item.ok()) return item.status();
    out.push_back(*std::move(item));
  }
  return out;
}

/// The required string field `key` of object `j`.
inline absl::StatusOr<std::string> GetString(const nlohmann::json& j, const std::string& key,
                                             const std::string& where) {
  const auto it = j.find(key);
  if (it == j.end() || !it->is_string()) {
    return Invalid(Field(where, key), "expected a string");
  }
  return it->get<std::string>();
}

/// The optional bool field `key` (absent or null gives `fallback`).
inline absl::StatusOr<bool> GetBool(const nlohmann::json& j, const std::string& key, bool fallback,
                                    const std::string& where) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) return Invalid(Field(where, key), "expected true or false");
  return it->get<bool>();
}

/// The "type" of a component object.
inline absl::StatusOr<std::string> GetType(const nlohmann::json& j, const std::string& where) {
  if (!j.is_object()) return Invalid(where, "expected an object");
  return GetString(j, "type", where);
}

}  // namespace kvserve::json_util

#endif  // KVSERVE_COMMON_TOKENIZER_JSON_UTIL_H_
