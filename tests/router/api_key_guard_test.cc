// API key files, bearer parsing, tenant salts and per-key concurrency limits.

#include "router/api_key_guard.h"

#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "common/auth/api_keys.h"
#include "gtest/gtest.h"

namespace kvserve {
namespace {

using auth::ApiKeyTable;

TEST(ApiKeyTableTest, ParsesKeysTenantsAndLimits) {
  absl::StatusOr<ApiKeyTable> table = ApiKeyTable::Parse(
      "# operators' keys\n"
      "\n"
      "sk-alpha-000001 alpha 2\n"
      "  sk-alpha-000002\talpha  \n"
      "sk-solo-0000003\n",
      "keys.txt");
  ASSERT_TRUE(table.ok()) << table.status();
  ASSERT_EQ(table->keys().size(), 3u);
  const auth::ApiKey* a1 = table->Find("sk-alpha-000001");
  ASSERT_NE(a1, nullptr);
  EXPECT_EQ(a1->tenant, "alpha");
  EXPECT_EQ(a1->max_concurrent, 2);
  EXPECT_EQ(a1->line, 3);
  const auth::ApiKey* a2 = table->Find("sk-alpha-000002");
  ASSERT_NE(a2, nullptr);
  EXPECT_EQ(a2->tenant, "alpha");
  EXPECT_EQ(a2->max_concurrent, 0);
  const auth::ApiKey* solo = table->Find("sk-solo-0000003");
  ASSERT_NE(solo, nullptr);
  EXPECT_EQ(solo->tenant.rfind("key-", 0), 0u);
  EXPECT_EQ(solo->tenant.size(), 4u + 16u);
  EXPECT_EQ(solo->tenant.find("sk-solo"), std::string::npos) << "the secret must not leak";
  EXPECT_EQ(table->Find("sk-alpha-00000"), nullptr);
  EXPECT_EQ(table->Find(""), nullptr);
}

TEST(ApiKeyTableTest, DefaultTenantIsAStableHashOfTheKey) {
  // 64-bit FNV-1a as its specification defines it (offset basis, then xor and multiply).
  uint64_t h = 0xcbf29ce484222325ull;
  for (char c : std::string("12345678")) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001b3ull;
  }
  char expected[32];
  std::snprintf(expected, sizeof(expected), "key-%016llx", static_cast<unsigned long long>(h));
  absl::StatusOr<ApiKeyTable> table = ApiKeyTable::Parse("12345678\n", "k");
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_EQ(table->keys()[0].tenant, expected);
}

TEST(ApiKeyTableTest, BadFilesNameTheLineAndNeverTheKey) {
  struct Case {
    const char* text;
    const char* expected;
  };
  const Case cases[] = {
      {"", "keys.txt: no API keys"},
      {"# only a comment\n\n", "keys.txt: no API keys"},
      {"short\n", "keys.txt:1: key: must be 8 to 256 characters, got 5"},
      {"good-key-1\nsk-secret-123 t 1 extra\n", "keys.txt:2: expected '<key> [<tenant> "},
      {"sk-secret-123 bad/tenant\n", "keys.txt:1: tenant 'bad/tenant'"},
      {"sk-secret-123 t -1\n", "keys.txt:1: max_concurrent: expected an integer in [0, "},
      {"sk-secret-123 t many\n", "keys.txt:1: max_concurrent"},
      {"sk-secret-123\n# x\nsk-secret-123 other\n",
       "keys.txt:3: key: duplicate of the key on line 1"},
      {"sk-secr\x01t-123\n", "keys.txt:1: key: only printable ASCII"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<ApiKeyTable> table = ApiKeyTable::Parse(c.text, "keys.txt");
    ASSERT_FALSE(table.ok()) << c.text;
    EXPECT_TRUE(absl::IsInvalidArgument(table.status())) << table.status();
    EXPECT_NE(table.status().message().find(c.expected), std::string::npos)
        << "got: " << table.status().message() << "\nwanted: " << c.expected;
    EXPECT_EQ(table.status().message().find("sk-secret-123"), std::string::npos)
        << table.status().message();
  }
  absl::StatusOr<ApiKeyTable> missing = ApiKeyTable::Load("/nonexistent/keys.txt");
  EXPECT_TRUE(absl::IsNotFound(missing.status())) << missing.status();
  EXPECT_NE(missing.status().message().find("/nonexistent/keys.txt"), std::string::npos);
}

TEST(ApiKeyTableTest, ParseBearer) {
  EXPECT_EQ(auth::ParseBearer("Bearer abc"), "abc");
  EXPECT_EQ(auth::ParseBearer("bearer   abc  "), "abc");
  EXPECT_EQ(auth::ParseBearer("BEARER abc"), "abc");
  EXPECT_EQ(auth::ParseBearer("Basic abc"), std::nullopt);
  EXPECT_EQ(auth::ParseBearer("Bearer "), std::nullopt);
  EXPECT_EQ(auth::ParseBearer("Bearerabc"), std::nullopt);
  EXPECT_EQ(auth::ParseBearer(""), std::nullopt);
}

TEST(ApiKeyTableTest, TenantSaltsCannotCollide) {
  EXPECT_EQ(auth::TenantCacheSalt("alpha", ""), "tenant:5:alpha:0:");
  EXPECT_EQ(auth::TenantCacheSalt("alpha", "s"), "tenant:5:alpha:1:s");
  // A client salt crafted to look like another tenant's salt still differs.
  EXPECT_NE(auth::TenantCacheSalt("a", "5:alpha:0:"), auth::TenantCacheSalt("alpha", ""));
  EXPECT_NE(auth::TenantCacheSalt("al", "pha"), auth::TenantCacheSalt("alp", "ha"));
}

ApiKeyGuard MakeGuard() {
  return ApiKeyGuard(*ApiKeyTable::Parse(
      "sk-limited-01 team 2\nsk-unlimited-1 team\nsk-other-0001 other 1\n", "k"));
}

TEST(ApiKeyGuardTest, AuthenticateAnswersUnauthenticated) {
  ApiKeyGuard guard = MakeGuard();
  absl::StatusOr<const auth::ApiKey*> ok = guard.Authenticate("Bearer sk-limited-01");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ((*ok)->tenant, "team");
  for (std::optional<std::string_view> header :
       {std::optional<std::string_view>(), std::optional<std::string_view>(""),
        std::optional<std::string_view>("sk-limited-01"),
        std::optional<std::string_view>("Bearer sk-limited-02"),
        std::optional<std::string_view>("Basic sk-limited-01")}) {
    absl::StatusOr<const auth::ApiKey*> bad = guard.Authenticate(header);
    EXPECT_TRUE(absl::IsUnauthenticated(bad.status())) << bad.status();
    EXPECT_NE(bad.status().message().find("authorization"), std::string::npos);
    EXPECT_EQ(bad.status().message().find("sk-limited-02"), std::string::npos);
  }
}

TEST(ApiKeyGuardTest, LeasesEnforceThePerKeyLimit) {
  ApiKeyGuard guard = MakeGuard();
  const auth::ApiKey& limited = *guard.keys().Find("sk-limited-01");
  const auth::ApiKey& unlimited = *guard.keys().Find("sk-unlimited-1");
  const auth::ApiKey& other = *guard.keys().Find("sk-other-0001");
  absl::StatusOr<ApiKeyGuard::Lease> first = guard.Acquire(limited);
  absl::StatusOr<ApiKeyGuard::Lease> second = guard.Acquire(limited);
  ASSERT_TRUE(first.ok() && second.ok());
  absl::StatusOr<ApiKeyGuard::Lease> third = guard.Acquire(limited);
  EXPECT_TRUE(absl::IsResourceExhausted(third.status())) << third.status();
  EXPECT_NE(third.status().message().find("tenant 'team'"), std::string::npos);
  EXPECT_EQ(guard.in_flight(limited), 2);
  // Limits are per key, not per tenant, and other keys are unaffected.
  std::vector<ApiKeyGuard::Lease> many;
  for (int i = 0; i < 50; ++i) many.push_back(*guard.Acquire(unlimited));
  EXPECT_EQ(guard.in_flight(unlimited), 50);
  EXPECT_TRUE(guard.Acquire(other).ok());  // a temporary: released at once
  EXPECT_EQ(guard.in_flight(other), 0);
  // Moving a lease keeps one slot; destroying it frees the slot.
  ApiKeyGuard::Lease moved = *std::move(first);
  EXPECT_EQ(guard.in_flight(limited), 2);
  { ApiKeyGuard::Lease gone = std::move(moved); }
  EXPECT_EQ(guard.in_flight(limited), 1);
  EXPECT_TRUE(guard.Acquire(limited).ok());
  second = absl::ResourceExhaustedError("dropped");
  EXPECT_EQ(guard.in_flight(limited), 0);
  many.clear();
  EXPECT_EQ(guard.in_flight(unlimited), 0);
}

}  // namespace
}  // namespace kvserve
