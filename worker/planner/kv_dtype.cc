#include "worker/planner/kv_dtype.h"

#include <optional>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace kvserve {

absl::StatusOr<KvCacheDType> ParseKvCacheDType(std::string_view name) {
  const std::optional<KvCacheDType> dtype = KvCacheDTypeFromName(name);
  if (dtype.has_value()) return *dtype;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown KV cache dtype \"", absl::string_view(name.data(), name.size()),
                   "\" (expected f32, f16, bf16, int8 or fp8)"));
}

int64_t KvBytesPerHeadVector(KvCacheDType dtype, int64_t head_dim) {
  return KvCacheDTypeVectorBytes(dtype, head_dim);
}

}  // namespace kvserve
