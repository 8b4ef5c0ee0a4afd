#ifndef KVSERVE_ROUTER_API_KEY_GUARD_H_
#define KVSERVE_ROUTER_API_KEY_GUARD_H_

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "common/auth/api_keys.h"

namespace kvserve {

/// The router's API key check and per-key concurrency limits.
///
/// Authenticate maps an `authorization` value to the caller's key entry: UNAUTHENTICATED when
/// the value is missing, is not "Bearer <key>", or names no key in the table (the message
/// never quotes the presented key). Acquire counts one open Generate call against the key's
/// max_concurrent: RESOURCE_EXHAUSTED when the key is at its limit; the returned Lease gives
/// the slot back when destroyed. Thread-safe; the counters are lock-free.
class ApiKeyGuard {
 public:
  /// One open call of a key; move-only, releases its slot on destruction.
  class Lease {
   public:
    Lease() = default;
    ~Lease() { Release(); }
    Lease(Lease&& other) noexcept : counter_(other.counter_) { other.counter_ = nullptr; }
    Lease& operator=(Lease&& other) noexcept;
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;

   private:
    friend class ApiKeyGuard;
    explicit Lease(std::atomic<int>* counter) : counter_(counter) {}
    void Release();
    std::atomic<int>* counter_ = nullptr;
  };

  explicit ApiKeyGuard(auth::ApiKeyTable keys);

  /// The caller's key for an `authorization` metadata/header value (nullopt: absent).
  absl::StatusOr<const auth::ApiKey*> Authenticate(
      std::optional<std::string_view> authorization) const;
  /// Takes one of `key`'s concurrent-call slots (always succeeds for an unlimited key).
  absl::StatusOr<Lease> Acquire(const auth::ApiKey& key);
  /// Calls of `key` open now.
  int in_flight(const auth::ApiKey& key) const;

  const auth::ApiKeyTable& keys() const { return keys_; }

 private:
  const auth::ApiKeyTable keys_;
  /// Parallel to keys_.keys().
  std::unique_ptr<std::atomic<int>[]> in_flight_;
};

}  // namespace kvserve

#endif  // KVSERVE_ROUTER_API_KEY_GUARD_H_
