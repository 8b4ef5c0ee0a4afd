#ifndef KVSERVE_COMMON_AUTH_API_KEYS_H_
#define KVSERVE_COMMON_AUTH_API_KEYS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"

namespace kvserve::auth {

/// One API key as the key file declares it.
struct ApiKey {
  /// The secret the caller presents as `authorization: Bearer <key>`.
  std::string key;
  /// Who the key belongs to. Keys of one tenant share prefix-cache blocks; different tenants
  /// never do. When the file names none, the tenant is "key-" followed by a 64-bit FNV-1a hash
  /// of the key in hex, so that each such key is its own tenant without the secret itself
  /// travelling to workers or logs.
  std::string tenant;
  /// Most Generate calls the key may have open at once; 0 means no limit.
  int max_concurrent = 0;
  /// 1-based line of the key file, for messages.
  int line = 0;
};

/// The router's API keys, parsed from a key file.
///
/// Format (UTF-8 text, one key per line):
///
///     # comment lines and blank lines are ignored
///     <key> [<tenant> [<max_concurrent>]]
///
/// Fields are separated by spaces or tabs. A key is 8 to 256 printable ASCII characters other
/// than space; a tenant is 1 to 128 characters of [A-Za-z0-9._-]; max_concurrent is an integer
/// in [0, 1000000] (0 = unlimited; the default). A key may appear only once. Errors name the
/// file and line and never quote the key.
class ApiKeyTable {
 public:
  /// Parses key-file text; `source` names it in errors (usually the path).
  static absl::StatusOr<ApiKeyTable> Parse(std::string_view text, std::string_view source);
  /// Reads and parses the file at `path`. NOT_FOUND when it cannot be read; INVALID_ARGUMENT
  /// (naming path and line) for a malformed or empty file.
  static absl::StatusOr<ApiKeyTable> Load(const std::string& path);

  /// The key's entry, or nullptr when it is not in the table.
  const ApiKey* Find(std::string_view key) const;
  /// Every key, in file order; indices are stable for the table's life.
  const std::vector<ApiKey>& keys() const { return keys_; }
  /// The position of `entry` in keys() (entry must come from this table).
  size_t IndexOf(const ApiKey& entry) const { return static_cast<size_t>(&entry - keys_.data()); }

 private:
  std::vector<ApiKey> keys_;
  absl::flat_hash_map<std::string, size_t> by_key_;
};

/// The key of an `authorization` value "Bearer <key>" (scheme case-insensitive, surrounding
/// spaces ignored); nullopt for another scheme or an empty key.
std::optional<std::string_view> ParseBearer(std::string_view authorization);

/// The prefix-cache salt of a request from `tenant` that carried `client_salt`: both
/// length-prefixed, so no choice of client salt can reproduce another tenant's salt.
std::string TenantCacheSalt(std::string_view tenant, std::string_view client_salt);

}  // namespace kvserve::auth

#endif  // KVSERVE_COMMON_AUTH_API_KEYS_H_
