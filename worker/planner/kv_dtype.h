#ifndef KVSERVE_WORKER_PLANNER_KV_DTYPE_H_
#define KVSERVE_WORKER_PLANNER_KV_DTYPE_H_

#include <cstdint>
#include <string_view>

#include "absl/status/statusor.h"
#include "kernels/kv_dtype.h"

namespace kvserve {

// KvCacheDType, kAllKvCacheDTypes, kKvQuantScaleBytes and KvCacheDTypeName come from
// kernels/kv_dtype.h (the one definition shared with the KV cache and the kernels).

/// Parses "f32", "f16", "bf16", "int8" or "fp8" (also the long forms "float32", "float16",
/// "bfloat16", "fp8_e4m3"), case-insensitively. "auto" is deliberately refused: callers pick the
/// default.
absl::StatusOr<KvCacheDType> ParseKvCacheDType(std::string_view name);

/// Bytes one token occupies for one KV head vector of `head_dim` elements (K or V alone):
/// f32 4·d; f16 and bf16 2·d; int8 and fp8 d bytes plus a 4-byte f32 scale per token and head.
int64_t KvBytesPerHeadVector(KvCacheDType dtype, int64_t head_dim);

}  // namespace kvserve

#endif  // KVSERVE_WORKER_PLANNER_KV_DTYPE_H_
