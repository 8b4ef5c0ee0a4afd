// Portable attention inner loops.

#include <algorithm>
#include <cstring>
#include <limits>

#include "kernels/cpu/attention_kernels.h"
#include "kernels/cpu/kv_quant.h"
#include "kernels/cpu/logits.h"
#include "kernels/dtype.h"

namespace kvserve::cpu::internal {
namespace {

constexpr int kLanes = 8;

// Storage element and exact decode of each dtype (scales are applied by the loops).
template <KvCacheDType T>
struct Elem;
template <>
struct Elem<KvCacheDType::kF32> {
  using Type = float;
  static float Get(const float* p, int64_t i, const float*) { return p[i]; }
};
template <>
struct Elem<KvCacheDType::kF16> {
  using Type = uint16_t;
  static float Get(const uint16_t* p, int64_t i, const float*) { return HalfToFloat(p[i]); }
};
template <>
struct Elem<KvCacheDType::kBF16> {
  using Type = uint16_t;
  static float Get(const uint16_t* p, int64_t i, const float*) { return BF16ToFloat(p[i]); }
};
template <>
struct Elem<KvCacheDType::kInt8> {
  using Type = int8_t;
  static float Get(const int8_t* p, int64_t i, const float*) { return static_cast<float>(p[i]); }
};
template <>
struct Elem<KvCacheDType::kFp8E4M3> {
  using Type = uint8_t;
  static float Get(const uint8_t* p, int64_t i, const float* table) { return table[p[i]]; }
};

// One query's scores.
template <KvCacheDType T>
void QueryScores(const float* q, const void* k_bytes, const float* row_scales, int64_t count,
                 int64_t head_dim, float scale, float* scores) {
  using E = Elem<T>;
  const auto* k = static_cast<const typename E::Type*>(k_bytes);
  const float* table = T == KvCacheDType::kFp8E4M3 ? Fp8E4M3DecodeTable() : nullptr;
  for (int64_t key = 0; key < count; ++key) {
    const auto* kr = k + key * head_dim;
    float lane[kLanes] = {};
    int64_t d = 0;
    for (; d + kLanes <= head_dim; d += kLanes) {
      for (int l = 0; l < kLanes; ++l) lane[l] += q[d + l] * E::Get(kr, d + l, table);
    }
    for (int l = 0; d + l < head_dim; ++l) lane[l] += q[d + l] * E::Get(kr, d + l, table);
    float dot =
        ((lane[0] + lane[4]) + (lane[2] + lane[6])) + ((lane[1] + lane[5]) + (lane[3] + lane[7]));
    if constexpr (KvCacheDTypeHasScales(T)) dot *= row_scales[key];
    scores[key] = dot * scale;
  }
}

template <KvCacheDType T>
void Scores(const float* q, int64_t group, const void* k, const float* row_scales, int64_t count,
            int64_t head_dim, float scale, float* scores, int64_t scores_stride,
            RowPrefetch /*prefetch*/) {
  for (int64_t g = 0; g < group; ++g) {
    QueryScores<T>(q + g * head_dim, k, row_scales, count, head_dim, scale,
                   scores + g * scores_stride);
  }
}

// One query's accumulation.
template <KvCacheDType T>
void QueryAccumulate(const float* probs, const void* v_bytes, const float* row_scales,
                     int64_t count, int64_t head_dim, float* acc) {
  using E = Elem<T>;
  const auto* v = static_cast<const typename E::Type*>(v_bytes);
  const float* table = T == KvCacheDType::kFp8E4M3 ? Fp8E4M3DecodeTable() : nullptr;
  for (int64_t key = 0; key < count; ++key) {
    float p = probs[key];
    if constexpr (KvCacheDTypeHasScales(T)) p *= row_scales[key];
    const auto* vr = v + key * head_dim;
    for (int64_t d = 0; d < head_dim; ++d) acc[d] += p * E::Get(vr, d, table);
  }
}

template <KvCacheDType T>
void Accumulate(const float* probs, int64_t probs_stride, int64_t group, const void* v,
                const float* row_scales, int64_t count, int64_t head_dim, float* acc,
                RowPrefetch /*prefetch*/) {
  for (int64_t g = 0; g < group; ++g) {
    QueryAccumulate<T>(probs + g * probs_stride, v, row_scales, count, head_dim,
                       acc + g * head_dim);
  }
}

// The maximum of p[0, n), n >= 1 (exact in any order). Eight independent lanes, so that the
// baseline build vectorizes it (as LaneSum).
float MaxOf(const float* p, int64_t n) {
  float lane[kLanes];
  std::fill_n(lane, kLanes, -std::numeric_limits<float>::infinity());
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) lane[l] = std::max(lane[l], p[i + l]);
  }
  for (; i < n; ++i) lane[0] = std::max(lane[0], p[i]);
  return *std::max_element(lane, lane + kLanes);
}

// The sum of p[0, n) in AttentionSoftmaxFn's order: lane l adds p[i] for i = l mod 8 in order,
// then the fixed combine.
float LaneSum(const float* p, int64_t n) {
  float lane[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) lane[l] += p[i + l];
  }
  for (int l = 0; i < n; ++i, ++l) lane[l] += p[i];
  return ((lane[0] + lane[4]) + (lane[2] + lane[6])) + ((lane[1] + lane[5]) + (lane[3] + lane[7]));
}

void Softmax(float* probs, int64_t group, int64_t keys, float* inv_sum) {
  for (int64_t g = 0; g < group; ++g) {
    float* p = probs + g * keys;
    ExpShifted(p, keys, MaxOf(p, keys), 1.0f, p);
    inv_sum[g] = 1.0f / LaneSum(p, keys);
  }
}

}  // namespace

AttentionKernels AttentionKernelsScalar(KvCacheDType dtype) {
  return ForKvDType(dtype, []<KvCacheDType T>() {
    return AttentionKernels{&Scores<T>, &Accumulate<T>, &Softmax};
  });
}

}  // namespace kvserve::cpu::internal
