#include "worker/planner/kv_dtype.h"

#include <string>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace kvserve {

absl::StatusOr<KvCacheDType> ParseKvCacheDType(std::string_view name) {
  const std::string lower = absl::AsciiStrToLower(absl::string_view(name.data(), name.size()));
  if (lower == "f32" || lower == "float32") return KvCacheDType::kF32;
  if (lower == "f16" || lower == "float16") return KvCacheDType::kF16;
  if (lower == "bf16" || lower == "bfloat16") return KvCacheDType::kBF16;
  if (lower == "int8") return KvCacheDType::kInt8;
  if (lower == "fp8" || lower == "fp8_e4m3") return KvCacheDType::kFp8E4M3;
  return absl::InvalidArgumentError(absl::StrCat("unknown KV cache dtype \"", lower,
                                                 "\" (expected f32, f16, bf16, int8 or fp8)"));
}

std::string_view KvCacheDTypeName(KvCacheDType dtype) {
  switch (dtype) {
    case KvCacheDType::kF32:
      return "f32";
    case KvCacheDType::kF16:
      return "f16";
    case KvCacheDType::kBF16:
      return "bf16";
    case KvCacheDType::kInt8:
      return "int8";
    case KvCacheDType::kFp8E4M3:
      return "fp8";
  }
  return "unknown";
}

int64_t KvBytesPerHeadVector(KvCacheDType dtype, int64_t head_dim) {
  switch (dtype) {
    case KvCacheDType::kF32:
      return 4 * head_dim;
    case KvCacheDType::kF16:
    case KvCacheDType::kBF16:
      return 2 * head_dim;
    case KvCacheDType::kInt8:
    case KvCacheDType::kFp8E4M3:
      return head_dim + kKvQuantScaleBytes;
  }
  return 0;
}

}  // namespace kvserve
