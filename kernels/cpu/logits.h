#ifndef KVSERVE_KERNELS_CPU_LOGITS_H_
#define KVSERVE_KERNELS_CPU_LOGITS_H_

// Kernels over one row of vocabulary logits, for the sampler (worker/engine/sampler.cc): they
// run on every vocabulary entry of every sampled sequence of every step, on the engine's
// sampling threads. Each has an SSE2 baseline and an AVX-512 path (kernels/cpu/cpu_isa.h picks);
// both compute every element with the same float operations, so results are bit-identical
// across paths and machines (a seeded request samples the same tokens everywhere).

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

/// out[i] = exp((x[i] - shift) / divisor) for (x[i] - shift) / divisor <= 0 (callers shift by
/// the maximum; divisor > 0), exactly 0 below log(FLT_MIN) and for -inf; `out` may be `x`.
/// Within 2.5e-7 relative of exp in the normal range: Cody-Waite reduction x = k ln2 + r with
/// ln2 split into a part exact in float and a correction, a degree-6 minimax polynomial for
/// exp(r), and 2^k put into the exponent bits, all in float adds and multiplies (no FMA).
void ExpShifted(const float* x, int64_t n, float shift, float divisor, float* out);

namespace internal {
ArgMaxResult ArgMaxCheckedBase(const float* x, int64_t n);
ArgMaxResult ArgMaxCheckedAvx512(const float* x, int64_t n);
void ExpShiftedBase(const float* x, int64_t n, float shift, float divisor, float* out);
void ExpShiftedAvx512(const float* x, int64_t n, float shift, float divisor, float* out);
}  // namespace internal

}  // namespace kvserve::cpu

#endif  // KVSERVE_KERNELS_CPU_LOGITS_H_
