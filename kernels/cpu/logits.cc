#include "kernels/cpu/logits.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/logits_exp.h"

namespace kvserve::cpu {
namespace internal {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

int64_t FirstBad(const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    if (!(x[i] < kInf)) return i;
  }
  return -1;
}

// One element of ExpShifted, with exactly the vector paths' operations and rounding.
float ExpOne(float x, float shift, float scale) {
  using namespace exp_constants;
  const float v = (x - shift) * scale;
  if (!(v >= kLowest)) return 0.0f;
  const float t = v * kLog2e + 0.5f;
  float k = static_cast<float>(static_cast<int32_t>(t));  // truncation, then floor
  if (k > t) k -= 1.0f;
  float r = v - k * kLn2Hi;
  r = r - k * kLn2Lo;
  float y = kP[0];
  for (int i = 1; i < 6; ++i) y = y * r + kP[i];
  y = (y * (r * r) + r) + 1.0f;
  const int32_t bits = (static_cast<int32_t>(k) + 127) << 23;
  float two_k;
  std::memcpy(&two_k, &bits, sizeof(two_k));
  return y * two_k;
}

}  // namespace

ArgMaxResult ArgMaxCheckedBase(const float* x, int64_t n) {
  // Pass 1: the maximum and whether anything is NaN or +inf, without branches or dependencies
  // between lanes; pass 2: the first index holding the maximum.
  float max = -kInf;
  bool bad = false;
  int64_t i = 0;
#if defined(__SSE2__)
  const __m128 inf = _mm_set1_ps(kInf);
  __m128 m[4] = {_mm_set1_ps(-kInf), _mm_set1_ps(-kInf), _mm_set1_ps(-kInf), _mm_set1_ps(-kInf)};
  __m128 below = _mm_castsi128_ps(_mm_set1_epi32(-1));
  for (; i + 16 <= n; i += 16) {
    for (int j = 0; j < 4; ++j) {
      const __m128 v = _mm_loadu_ps(x + i + 4 * j);
      below = _mm_and_ps(below, _mm_cmplt_ps(v, inf));  // NaN compares false
      m[j] = _mm_max_ps(v, m[j]);                        // v > m ? v : m
    }
  }
  bad = _mm_movemask_ps(below) != 0xf;
  alignas(16) float lanes[16];
  for (int j = 0; j < 4; ++j) _mm_store_ps(lanes + 4 * j, m[j]);
  for (float v : lanes) max = v > max ? v : max;
#endif
  for (; i < n; ++i) {
    bad |= !(x[i] < kInf);
    max = x[i] > max ? x[i] : max;
  }
  ArgMaxResult result;
  if (bad) {
    result.bad = FirstBad(x, n);
    return result;
  }
  result.index = std::find(x, x + n, max) - x;
  return result;
}

#if defined(__SSE2__)
// Four elements of ExpShifted (the same operations as ExpOne).
__m128 ExpVec(__m128 x, __m128 shift, __m128 scale) {
  using namespace exp_constants;
  const __m128 lowest = _mm_set1_ps(kLowest);
  const __m128 v = _mm_mul_ps(_mm_sub_ps(x, shift), scale);
  const __m128 keep = _mm_cmpge_ps(v, lowest);  // false for -inf
  const __m128 xv = _mm_max_ps(v, lowest);
  const __m128 t = _mm_add_ps(_mm_mul_ps(xv, _mm_set1_ps(kLog2e)), _mm_set1_ps(0.5f));
  __m128 k = _mm_cvtepi32_ps(_mm_cvttps_epi32(t));
  k = _mm_sub_ps(k, _mm_and_ps(_mm_cmpgt_ps(k, t), _mm_set1_ps(1.0f)));
  __m128 r = _mm_sub_ps(xv, _mm_mul_ps(k, _mm_set1_ps(kLn2Hi)));
  r = _mm_sub_ps(r, _mm_mul_ps(k, _mm_set1_ps(kLn2Lo)));
  __m128 y = _mm_set1_ps(kP[0]);
  for (int j = 1; j < 6; ++j) y = _mm_add_ps(_mm_mul_ps(y, r), _mm_set1_ps(kP[j]));
  y = _mm_add_ps(_mm_add_ps(_mm_mul_ps(y, _mm_mul_ps(r, r)), r), _mm_set1_ps(1.0f));
  const __m128i e = _mm_slli_epi32(_mm_add_epi32(_mm_cvtps_epi32(k), _mm_set1_epi32(127)), 23);
  return _mm_and_ps(keep, _mm_mul_ps(y, _mm_castsi128_ps(e)));
}
#endif

void ExpShiftedBase(const float* x, int64_t n, float shift, float scale, float* out) {
  int64_t i = 0;
#if defined(__SSE2__)
  const __m128 vshift = _mm_set1_ps(shift);
  const __m128 vscale = _mm_set1_ps(scale);
  for (; i + 4 <= n; i += 4) _mm_storeu_ps(out + i, ExpVec(_mm_loadu_ps(x + i), vshift, vscale));
#endif
  for (; i < n; ++i) out[i] = ExpOne(x[i], shift, scale);
}

void ExpBlockSumsBase(const float* x, int64_t n, float shift, float scale, float* sums) {
  int64_t i = 0;
#if defined(__SSE2__)
  const __m128 vshift = _mm_set1_ps(shift);
  const __m128 vscale = _mm_set1_ps(scale);
  for (; i + kExpBlock <= n; i += kExpBlock) {
    __m128 q[4];
    for (int k = 0; k < 4; ++k) {
      const __m128 a = ExpVec(_mm_loadu_ps(x + i + 4 * k), vshift, vscale);
      // lane 0: e0 + e1, lane 2: e2 + e3; then lane 0: (e0 + e1) + (e2 + e3).
      const __m128 p = _mm_add_ps(a, _mm_shuffle_ps(a, a, _MM_SHUFFLE(2, 3, 0, 1)));
      q[k] = _mm_add_ps(p, _mm_shuffle_ps(p, p, _MM_SHUFFLE(1, 0, 3, 2)));
    }
    const __m128 total = _mm_add_ps(_mm_add_ps(q[0], q[1]), _mm_add_ps(q[2], q[3]));
    sums[i / kExpBlock] = _mm_cvtss_f32(total);
  }
#endif
  for (; i < n; i += kExpBlock) {
    float e[kExpBlock] = {};
    for (int64_t j = 0; j < kExpBlock && i + j < n; ++j) e[j] = ExpOne(x[i + j], shift, scale);
    sums[i / kExpBlock] = BuildExpBlockTree(e).sum();
  }
}

}  // namespace internal

ExpBlockTree BuildExpBlockTree(const float* e) {
  ExpBlockTree t;
  for (int j = 0; j < 8; ++j) t.l1[j] = e[2 * j] + e[2 * j + 1];
  for (int j = 0; j < 4; ++j) t.l2[j] = t.l1[2 * j] + t.l1[2 * j + 1];
  for (int j = 0; j < 2; ++j) t.l3[j] = t.l2[2 * j] + t.l2[2 * j + 1];
  return t;
}

int64_t PickExpWeighted(const float* x, int64_t n, float shift, float scale, double u,
                        float* block_sums) {
  // The inverse CDF in index order, with each block's partial sums grouped as the tree groups
  // them: at each node go left when the left subtree's sum takes the running total past u *
  // total. A subtree summing to 0 never takes the total past the target.
  const int64_t blocks = (n + kExpBlock - 1) / kExpBlock;
  ExpBlockSums(x, n, shift, scale, block_sums);
  double total = 0.0;
  for (int64_t b = 0; b < blocks; ++b) total += block_sums[b];
  const double target = u * total;
  double before = 0.0;
  int64_t b = 0;
  for (; b + 1 < blocks && !(before + block_sums[b] > target); ++b) before += block_sums[b];
  // Block b; zero-weight blocks before it are never chosen (their sum cannot pass target) and
  // rounding can only push the walk to the last block, whose sum is positive if it got there.
  while (block_sums[b] == 0.0f && b > 0) before -= block_sums[--b];
  const int64_t first = b * kExpBlock;
  float e[kExpBlock] = {};
  ExpShifted(x + first, std::min(kExpBlock, n - first), shift, scale, e);
  // The block's tree as ExpBlockSums added it, descended from the root's children to a leaf.
  const ExpBlockTree tree = BuildExpBlockTree(e);
  int64_t node = 0;  // index within the current level
  const float* levels[] = {tree.l3, tree.l2, tree.l1, e};
  for (const float* level : levels) {
    const float left = level[2 * node];
    if (before + left > target && left > 0.0f) {
      node = 2 * node;
    } else {
      before += left;
      node = 2 * node + 1;
    }
  }
  // The leaf has a positive weight unless rounding steered the walk off the end of the positive
  // ones; then take the nearest positive weight before it (there is one: the block's sum is
  // positive).
  while (e[node] == 0.0f && node > 0) --node;
  while (e[node] == 0.0f && node + 1 < kExpBlock) ++node;
  return first + node;
}

ArgMaxResult ArgMaxChecked(const float* x, int64_t n) {
  return ActiveCpuIsa() == CpuIsa::kAvx512 ? internal::ArgMaxCheckedAvx512(x, n)
                                           : internal::ArgMaxCheckedBase(x, n);
}

void ExpShifted(const float* x, int64_t n, float shift, float scale, float* out) {
  switch (ActiveCpuIsa()) {
    case CpuIsa::kAvx512:
      return internal::ExpShiftedAvx512(x, n, shift, scale, out);
    case CpuIsa::kAvx2:
      return internal::ExpShiftedAvx2(x, n, shift, scale, out);
    case CpuIsa::kScalar:
      break;
  }
  internal::ExpShiftedBase(x, n, shift, scale, out);
}

void ExpBlockSums(const float* x, int64_t n, float shift, float scale, float* sums) {
  switch (ActiveCpuIsa()) {
    case CpuIsa::kAvx512:
      return internal::ExpBlockSumsAvx512(x, n, shift, scale, sums);
    case CpuIsa::kAvx2:
      return internal::ExpBlockSumsAvx2(x, n, shift, scale, sums);
    case CpuIsa::kScalar:
      break;
  }
  internal::ExpBlockSumsBase(x, n, shift, scale, sums);
}

}  // namespace kvserve::cpu
