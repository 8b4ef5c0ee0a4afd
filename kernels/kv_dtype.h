#ifndef KVSERVE_KERNELS_KV_DTYPE_H_
#define KVSERVE_KERNELS_KV_DTYPE_H_

// Element types of the paged KV cache (vLLM's --kv-cache-dtype). Header-only and free of server
// dependencies: kernels, the KV cache and the capacity planner share this one definition.

#include <array>
#include <cstdint>
#include <optional>
#include <string_view>
#include <utility>

namespace kvserve {

/// Element type of the paged KV cache.
///   kF32, kF16, kBF16: plain floats (f16 and bf16 rounded to nearest even on write).
///   kInt8: symmetric int8, one f32 scale per token and KV head: x = scale * q, q in [-127, 127].
///   kFp8E4M3: OCP FP8 E4M3FN bytes (bias 7, max 448, no infinities, NaN = 0x7f / 0xff), one f32
///             scale per token and KV head: x = scale * fp8(q).
enum class KvCacheDType : uint8_t { kF32, kF16, kBF16, kInt8, kFp8E4M3 };

/// Every KV cache dtype, in enum order (the order the planner reports them).
inline constexpr std::array<KvCacheDType, 5> kAllKvCacheDTypes = {
    KvCacheDType::kF32, KvCacheDType::kF16, KvCacheDType::kBF16, KvCacheDType::kInt8,
    KvCacheDType::kFp8E4M3};

/// Bytes of scale stored beside each quantized (int8 / fp8) vector: one f32 per token and head.
inline constexpr int64_t kKvQuantScaleBytes = 4;

/// The canonical short name: "f32", "f16", "bf16", "int8" or "fp8".
constexpr std::string_view KvCacheDTypeName(KvCacheDType dtype) {
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

/// Parses a dtype name, ASCII case-insensitively: the short names of KvCacheDTypeName or the long
/// forms "float32", "float16", "bfloat16", "fp8_e4m3". Anything else (including "auto") gives
/// nullopt; callers that accept "auto" resolve it themselves.
constexpr std::optional<KvCacheDType> KvCacheDTypeFromName(std::string_view name) {
  constexpr std::array<std::pair<std::string_view, KvCacheDType>, 9> kNames = {{
      {"f32", KvCacheDType::kF32},
      {"float32", KvCacheDType::kF32},
      {"f16", KvCacheDType::kF16},
      {"float16", KvCacheDType::kF16},
      {"bf16", KvCacheDType::kBF16},
      {"bfloat16", KvCacheDType::kBF16},
      {"int8", KvCacheDType::kInt8},
      {"fp8", KvCacheDType::kFp8E4M3},
      {"fp8_e4m3", KvCacheDType::kFp8E4M3},
  }};
  for (const auto& [candidate, dtype] : kNames) {
    if (candidate.size() != name.size()) continue;
    bool same = true;
    for (size_t i = 0; i < name.size() && same; ++i) {
      const char c = name[i] >= 'A' && name[i] <= 'Z' ? static_cast<char>(name[i] - 'A' + 'a')
                                                       : name[i];
      same = c == candidate[i];
    }
    if (same) return dtype;
  }
  return std::nullopt;
}

/// Bytes of one stored element: 4 (f32), 2 (f16, bf16) or 1 (int8, fp8).
constexpr int64_t KvCacheDTypeElemBytes(KvCacheDType dtype) {
  switch (dtype) {
    case KvCacheDType::kF32:
      return 4;
    case KvCacheDType::kF16:
    case KvCacheDType::kBF16:
      return 2;
    case KvCacheDType::kInt8:
    case KvCacheDType::kFp8E4M3:
      return 1;
  }
  return 0;
}

/// Whether the dtype stores a per-token-and-head f32 scale beside its elements (int8, fp8).
constexpr bool KvCacheDTypeHasScales(KvCacheDType dtype) {
  return dtype == KvCacheDType::kInt8 || dtype == KvCacheDType::kFp8E4M3;
}

/// Bytes one token's K (or V) vector of `head_dim` elements takes for one KV head, scale
/// included: f32 4·d; f16, bf16 2·d; int8, fp8 d + 4.
constexpr int64_t KvCacheDTypeVectorBytes(KvCacheDType dtype, int64_t head_dim) {
  return KvCacheDTypeElemBytes(dtype) * head_dim +
         (KvCacheDTypeHasScales(dtype) ? kKvQuantScaleBytes : 0);
}

}  // namespace kvserve

#endif  // KVSERVE_KERNELS_KV_DTYPE_H_
