#ifndef KVSERVE_WORKER_PLANNER_KV_DTYPE_H_
#define KVSERVE_WORKER_PLANNER_KV_DTYPE_H_

#include <array>
#include <cstdint>
#include <string_view>

#include "absl/status/statusor.h"

namespace kvserve {

/// Element type of the paged KV cache.
enum class KvCacheDType { kF32, kF16, kBF16, kInt8, kFp8E4M3 };

/// Every KV cache dtype, in the order the planner reports them.
inline constexpr std::array<KvCacheDType, 5> kAllKvCacheDTypes = {
    KvCacheDType::kF32, KvCacheDType::kF16, KvCacheDType::kBF16, KvCacheDType::kInt8,
    KvCacheDType::kFp8E4M3};

/// Parses "f32", "f16", "bf16", "int8" or "fp8" (also the long forms "float32", "float16",
/// "bfloat16", "fp8_e4m3"). "auto" is deliberately refused: callers pick the default.
absl::StatusOr<KvCacheDType> ParseKvCacheDType(std::string_view name);

/// The canonical short name: "f32", "f16", "bf16", "int8" or "fp8".
std::string_view KvCacheDTypeName(KvCacheDType dtype);

/// Bytes of scale stored beside each quantized (int8 / fp8) vector: one f32 per token and head.
inline constexpr int64_t kKvQuantScaleBytes = 4;

/// Bytes one token occupies for one KV head vector of `head_dim` elements (K or V alone):
/// f32 4·d; f16 and bf16 2·d; int8 and fp8 d bytes plus a 4-byte f32 scale per token and head.
int64_t KvBytesPerHeadVector(KvCacheDType dtype, int64_t head_dim);

}  // namespace kvserve

#endif  // KVSERVE_WORKER_PLANNER_KV_DTYPE_H_
