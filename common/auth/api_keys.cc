#include "common/auth/api_keys.h"

#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace kvserve::auth {
namespace {

constexpr size_t kMinKeyLength = 8;
constexpr size_t kMaxKeyLength = 256;
constexpr size_t kMaxTenantLength = 128;
constexpr int kMaxConcurrentLimit = 1000000;

// 64-bit FNV-1a: stable across processes and builds (unlike absl::Hash), which the default
// tenant name needs.
uint64_t Fnv1a64(std::string_view bytes) {
  uint64_t hash = 0xcbf29ce484222325ull;
  for (unsigned char c : bytes) {
    hash ^= c;
    hash *= 0x100000001b3ull;
  }
  return hash;
}

bool IsKeyChar(unsigned char c) { return c > 0x20 && c < 0x7f; }

bool IsTenantChar(unsigned char c) {
  return absl::ascii_isalnum(c) || c == '.' || c == '_' || c == '-';
}

}  // namespace

absl::StatusOr<ApiKeyTable> ApiKeyTable::Parse(std::string_view text,
                                               std::string_view source_view) {
  const std::string source(source_view);
  ApiKeyTable table;
  int line_number = 0;
  for (absl::string_view raw : absl::StrSplit(absl::string_view(text.data(), text.size()), '\n')) {
    ++line_number;
    absl::string_view line = absl::StripAsciiWhitespace(raw);
    if (line.empty() || line.front() == '#') continue;
    auto where = [&] { return absl::StrCat(source, ":", line_number, ": "); };
    std::vector<absl::string_view> fields =
        absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    if (fields.size() > 3) {
      return absl::InvalidArgumentError(
          absl::StrCat(where(), "expected '<key> [<tenant> [<max_concurrent>]]', got ",
                       fields.size(), " fields"));
    }
    ApiKey entry;
    entry.line = line_number;
    entry.key = std::string(fields[0]);
    if (entry.key.size() < kMinKeyLength || entry.key.size() > kMaxKeyLength) {
      return absl::InvalidArgumentError(absl::StrCat(where(), "key: must be ", kMinKeyLength,
                                                     " to ", kMaxKeyLength, " characters, got ",
                                                     entry.key.size()));
    }
    for (unsigned char c : entry.key) {
      if (!IsKeyChar(c)) {
        return absl::InvalidArgumentError(
            absl::StrCat(where(), "key: only printable ASCII characters are allowed"));
      }
    }
    if (fields.size() >= 2) {
      entry.tenant = std::string(fields[1]);
      if (entry.tenant.size() > kMaxTenantLength) {
        return absl::InvalidArgumentError(
            absl::StrCat(where(), "tenant: longer than ", kMaxTenantLength, " characters"));
      }
      for (unsigned char c : entry.tenant) {
        if (!IsTenantChar(c)) {
          return absl::InvalidArgumentError(absl::StrCat(where(), "tenant '", entry.tenant,
                                                         "': only [A-Za-z0-9._-] are allowed"));
        }
      }
    } else {
      entry.tenant = absl::StrFormat("key-%016x", Fnv1a64(entry.key));
    }
    if (fields.size() == 3) {
      if (!absl::SimpleAtoi(fields[2], &entry.max_concurrent) || entry.max_concurrent < 0 ||
          entry.max_concurrent > kMaxConcurrentLimit) {
        return absl::InvalidArgumentError(
            absl::StrCat(where(), "max_concurrent: expected an integer in [0, ",
                         kMaxConcurrentLimit, "], got '", fields[2], "'"));
      }
    }
    auto [it, inserted] = table.by_key_.emplace(entry.key, table.keys_.size());
    if (!inserted) {
      return absl::InvalidArgumentError(absl::StrCat(where(), "key: duplicate of the key on line ",
                                                     table.keys_[it->second].line));
    }
    table.keys_.push_back(std::move(entry));
  }
  if (table.keys_.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(source,
                                                   ": no API keys (every line is blank "
                                                   "or a comment)"));
  }
  return table;
}

absl::StatusOr<ApiKeyTable> ApiKeyTable::Load(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open the API key file"));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return absl::NotFoundError(absl::StrCat(path, ": cannot read the API key file"));
  return Parse(text.str(), path);
}

const ApiKey* ApiKeyTable::Find(std::string_view key) const {
  auto it = by_key_.find(absl::string_view(key.data(), key.size()));
  return it == by_key_.end() ? nullptr : &keys_[it->second];
}

std::optional<std::string_view> ParseBearer(std::string_view authorization) {
  absl::string_view value =
      absl::StripAsciiWhitespace(absl::string_view(authorization.data(), authorization.size()));
  constexpr absl::string_view kScheme = "bearer ";
  if (value.size() <= kScheme.size() || !absl::StartsWithIgnoreCase(value, kScheme)) {
    return std::nullopt;
  }
  value.remove_prefix(kScheme.size());
  value = absl::StripLeadingAsciiWhitespace(value);
  if (value.empty()) return std::nullopt;
  return std::string_view(value.data(), value.size());
}

std::string TenantCacheSalt(std::string_view tenant, std::string_view client_salt) {
  return absl::StrCat("tenant:", tenant.size(), ":",
                      absl::string_view(tenant.data(), tenant.size()), ":", client_salt.size(), ":",
                      absl::string_view(client_salt.data(), client_salt.size()));
}

}  // namespace kvserve::auth
