#include "router/api_key_guard.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace kvserve {

ApiKeyGuard::Lease& ApiKeyGuard::Lease::operator=(Lease&& other) noexcept {
  if (this != &other) {
    Release();
    counter_ = other.counter_;
    other.counter_ = nullptr;
  }
  return *this;
}

void ApiKeyGuard::Lease::Release() {
  if (counter_ != nullptr) counter_->fetch_sub(1, std::memory_order_acq_rel);
  counter_ = nullptr;
}

ApiKeyGuard::ApiKeyGuard(auth::ApiKeyTable keys)
    : keys_(std::move(keys)),
      in_flight_(std::make_unique<std::atomic<int>[]>(keys_.keys().size())) {
  for (size_t i = 0; i < keys_.keys().size(); ++i) in_flight_[i].store(0);
}

absl::StatusOr<const auth::ApiKey*> ApiKeyGuard::Authenticate(
    std::optional<std::string_view> authorization) const {
  if (!authorization.has_value() || authorization->empty()) {
    return absl::UnauthenticatedError(
        "authorization: missing; send the metadata 'authorization: Bearer <API key>'");
  }
  std::optional<std::string_view> key = auth::ParseBearer(*authorization);
  if (!key.has_value()) {
    return absl::UnauthenticatedError("authorization: expected 'Bearer <API key>'");
  }
  const auth::ApiKey* entry = keys_.Find(*key);
  if (entry == nullptr) return absl::UnauthenticatedError("authorization: unknown API key");
  return entry;
}

absl::StatusOr<ApiKeyGuard::Lease> ApiKeyGuard::Acquire(const auth::ApiKey& key) {
  std::atomic<int>& counter = in_flight_[keys_.IndexOf(key)];
  const int before = counter.fetch_add(1, std::memory_order_acq_rel);
  if (key.max_concurrent > 0 && before >= key.max_concurrent) {
    counter.fetch_sub(1, std::memory_order_acq_rel);
    return absl::ResourceExhaustedError(absl::StrCat(
        "API key of tenant '", key.tenant, "' (line ", key.line, " of the key file) already has ",
        key.max_concurrent, " requests in flight, its limit; retry when one finishes"));
  }
  return Lease(&counter);
}

int ApiKeyGuard::in_flight(const auth::ApiKey& key) const {
  return in_flight_[keys_.IndexOf(key)].load(std::memory_order_acquire);
}

}  // namespace kvserve
