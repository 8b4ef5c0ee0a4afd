#ifndef KVSERVE_KERNELS_CPU_LOGITS_H_
#define KVSERVE_KERNELS_CPU_LOGITS_H_

// Kernels over one row of vocabulary logits, for the sampler (worker/engine/sampler.cc): they
// run on every vocabulary entry of every sampled sequence of every step, on the engine's
// sampling threads. Each has an SSE2 baseline and an AVX-512 path, the exps an AVX2 path too
// (kernels/cpu/cpu_isa.h picks); all compute every element with the same float operations, so
// results are bit-identical across paths and machines (a seeded request samples the same tokens
// everywhere). Paged attention's softmax uses ExpShifted as well.

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace kvserve::cpu {

/// What ArgMaxChecked found.
struct ArgMaxResult {
  int64_t index = 0;  // first index of the largest value
  int64_t bad = -1;   // first index holding NaN or +inf, -1 when none
};

/// The first index of the maximum of x[0, n) (n >= 1) and the first NaN or +inf, in one pass.
/// When `bad` is set, `index` is unspecified. -inf entries are fine (masked tokens).
ArgMaxResult ArgMaxChecked(const float* x, int64_t n);

/// out[i] = exp((x[i] - shift) * scale) for (x[i] - shift) * scale <= 0 (callers shift by the
/// maximum; scale > 0), exactly 0 below log(FLT_MIN) and for -inf; `out` may be `x`. Within
/// 2.5e-7 relative of exp in the normal range: Cody-Waite reduction x = k ln2 + r with ln2 split
/// into a part exact in float and a correction, a degree-6 minimax polynomial for exp(r), and
/// an exact multiplication by 2^k (a float built from k's exponent bits; AVX-512's scalef), all
/// in float adds and multiplies (no FMA).
void ExpShifted(const float* x, int64_t n, float shift, float scale, float* out);

/// Elements per block of ExpBlockSums.
inline constexpr int64_t kExpBlock = 16;

/// sums[b] = the sum of ExpShifted's values for x[16 b, 16 b + 16) (past n: 0), added as a
/// pairwise tree in index order: ((e0 + e1) + (e2 + e3)) + ... up to (sum of 0..7) + (sum of
/// 8..15). `sums` holds ceil(n / 16) floats. The exps are not stored: a sampler sums them all
/// once, then recomputes the 16 of the block it lands in (ExpShifted gives the same bits).
void ExpBlockSums(const float* x, int64_t n, float shift, float scale, float* sums);

/// The pairwise tree ExpBlockSums adds a block's 16 values in, level by level: l1[j] =
/// e[2j] + e[2j+1], l2[j] = l1[2j] + l1[2j+1], l3[j] = l2[2j] + l2[2j+1], and the block sum is
/// l3[0] + l3[1] (bit-identical to ExpBlockSums). A sampler that lands in a block descends it.
struct ExpBlockTree {
  float l1[8], l2[4], l3[2];
  float sum() const { return l3[0] + l3[1]; }
};
ExpBlockTree BuildExpBlockTree(const float* e);

/// The index the inverse CDF of the weights w_i = exp((x[i] - shift) * scale), i < n (n >= 1,
/// some weight positive), picks for a uniform u in [0, 1): the weights summed once per block
/// (ExpBlockSums into `block_sums`, ceil(n / kExpBlock) floats of scratch), the block sums added
/// in order in double, the landing block's 16 weights recomputed and its pairwise tree descended.
/// Zero weights (-inf logits) are never picked. The seeded sampler (worker/engine/sampler.cc) and
/// the CPU backend's batched sampling both draw with it; the CUDA sampling kernel repeats it.
int64_t PickExpWeighted(const float* x, int64_t n, float shift, float scale, double u,
                        float* block_sums);

/// How many of n >= 1 candidates in rank order (best first; value_at(i) is candidate i's logit)
/// top-p sampling keeps: the fewest whose weights exp(logit - best), summed in order in double,
/// reach top_p of their total, and at least one. TopPStep (worker/engine/sampling_steps.cc) and
/// the CPU backend's batched sampling cut with it; the CUDA sampling kernel repeats it.
template <typename ValueAt>
int64_t NucleusSize(int64_t n, float top_p, ValueAt value_at) {
  const double max_logit = value_at(0);
  double total = 0.0;
  for (int64_t i = 0; i < n; ++i) total += std::exp(static_cast<double>(value_at(i)) - max_logit);
  const double mass_limit = static_cast<double>(top_p) * total;
  double mass_above = 0.0;
  int64_t keep = 0;
  while (keep < n && mass_above < mass_limit) {
    mass_above += std::exp(static_cast<double>(value_at(keep)) - max_logit);
    ++keep;
  }
  return std::max<int64_t>(keep, 1);
}

namespace internal {
ArgMaxResult ArgMaxCheckedBase(const float* x, int64_t n);
ArgMaxResult ArgMaxCheckedAvx512(const float* x, int64_t n);
void ExpShiftedBase(const float* x, int64_t n, float shift, float scale, float* out);
void ExpShiftedAvx2(const float* x, int64_t n, float shift, float scale, float* out);
void ExpShiftedAvx512(const float* x, int64_t n, float shift, float scale, float* out);
void ExpBlockSumsBase(const float* x, int64_t n, float shift, float scale, float* sums);
void ExpBlockSumsAvx2(const float* x, int64_t n, float shift, float scale, float* sums);
void ExpBlockSumsAvx512(const float* x, int64_t n, float shift, float scale, float* sums);
}  // namespace internal

}  // namespace kvserve::cpu

#endif  // KVSERVE_KERNELS_CPU_LOGITS_H_
