#include <algorithm>

#include "kernels/cpu/logits_exp.h"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/ranking.cuh"
#include "kernels/cuda/sampling.h"

namespace kvserve::cuda {
namespace {

// ExpShifted's constants (kernels/cpu/logits_exp.h), as scalars: device code cannot index a
// host array at run time.
namespace ec = cpu::internal::exp_constants;
constexpr float kExpLowest = ec::kLowest, kLog2e = ec::kLog2e, kLn2Hi = ec::kLn2Hi,
                kLn2Lo = ec::kLn2Lo, kP0 = ec::kP[0], kP1 = ec::kP[1], kP2 = ec::kP[2],
                kP3 = ec::kP[3], kP4 = ec::kP[4], kP5 = ec::kP[5];
constexpr int kExpBlock = 16;  // cpu::kExpBlock

// Float adds and multiplies rounded one by one, never fused: the CPU's ExpShifted and the
// host sampler use no FMA, and nvcc would contract a * b + c.
#if defined(__CUDA_ARCH__)
__device__ __forceinline__ float Mul(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ float Add(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ float Sub(float a, float b) { return __fsub_rn(a, b); }
#else
__device__ __forceinline__ float Mul(float a, float b) { return a * b; }
__device__ __forceinline__ float Add(float a, float b) { return a + b; }
__device__ __forceinline__ float Sub(float a, float b) { return a - b; }
#endif

// One value of cpu::ExpShifted(x, shift 0, scale 1), operation for operation (logits.cc's
// ExpOne): Cody-Waite reduction, the degree-6 polynomial, the exact multiply by 2^k.
__device__ float ExpOne(float x) {
  const float v = Mul(Sub(x, 0.0f), 1.0f);
  if (!(v >= kExpLowest)) return 0.0f;
  const float t = Add(Mul(v, kLog2e), 0.5f);
  float k = static_cast<float>(static_cast<int32_t>(t));
  if (k > t) k = Sub(k, 1.0f);
  float r = Sub(v, Mul(k, kLn2Hi));
  r = Sub(r, Mul(k, kLn2Lo));
  float y = kP0;
  y = Add(Mul(y, r), kP1);
  y = Add(Mul(y, r), kP2);
  y = Add(Mul(y, r), kP3);
  y = Add(Mul(y, r), kP4);
  y = Add(Mul(y, r), kP5);
  y = Add(Add(Mul(y, Mul(r, r)), r), 1.0f);
  return Mul(y, __int_as_float((static_cast<int32_t>(k) + 127) << 23));
}

// cpu::BuildExpBlockTree's pairwise sum of a block's 16 values.
__device__ float BlockSum(const float* e) {
  float l1[8], l2[4];
  for (int j = 0; j < 8; ++j) l1[j] = Add(e[2 * j], e[2 * j + 1]);
  for (int j = 0; j < 4; ++j) l2[j] = Add(l1[2 * j], l1[2 * j + 1]);
  return Add(Add(l2[0], l2[1]), Add(l2[2], l2[3]));
}

// The host Sampler's draw over the n best candidates v[0, n) in rank order (values after its
// temperature step): TopPStep, then Sampler::Draw and Pick, with its float and double
// arithmetic (CpuBackend's PickCandidate is the same code on the CPU). Every thread of the block
// calls it; the exponentials are computed side by side (one candidate a thread), the sums and
// the search in the sampler's order by thread 0, which gets the candidate's position. `ed` and
// `ef` are shared scratch for n doubles and n floats (rounded up to whole blocks of 16), `cut` for
// one word.
__device__ int32_t PickCandidate(const float* v, int32_t n, float top_p, double uniform, double* ed,
                                 float* ef, int32_t* cut) {
  const int tid = static_cast<int>(threadIdx.x);
  if (top_p < 1.0f) {
    const double max_logit = v[0];
    for (int32_t i = tid; i < n; i += blockDim.x)
      ed[i] = exp(static_cast<double>(v[i]) - max_logit);
    __syncthreads();
    if (tid == 0) {
      double total = 0.0;
      for (int32_t i = 0; i < n; ++i) total += ed[i];
      const double mass_limit = static_cast<double>(top_p) * total;
      double mass_above = 0.0;
      int32_t keep = 0;
      while (keep < n && mass_above < mass_limit) mass_above += ed[keep++];
      cut[0] = keep > 1 ? keep : 1;
    }
    __syncthreads();
    n = cut[0];
  }
  // Every thread finds the same maximum of the first n.
  float max_logit = -INFINITY;
  for (int32_t i = 0; i < n; ++i) max_logit = max_logit < v[i] ? v[i] : max_logit;
  // Pick(w, n, shift 0, scale 1, uniform) over w = v - max: block sums of 16 exponentials (zeros
  // past n), their double total, the block the inverse CDF lands in, then a descent of that
  // block's tree.
  const int32_t blocks = (n + kExpBlock - 1) / kExpBlock;
  for (int32_t i = tid; i < blocks * kExpBlock; i += blockDim.x) {
    ef[i] = i < n ? ExpOne(Sub(v[i], max_logit)) : 0.0f;
  }
  __syncthreads();
  if (tid != 0) return 0;
  float sums[kMaxSampleTopK / kExpBlock];
  for (int32_t b = 0; b < blocks; ++b) sums[b] = BlockSum(ef + b * kExpBlock);
  double total = 0.0;
  for (int32_t b = 0; b < blocks; ++b) total += sums[b];
  const double target = uniform * total;
  double before = 0.0;
  int32_t b = 0;
  for (; b + 1 < blocks && !(before + sums[b] > target); ++b) before += sums[b];
  while (sums[b] == 0.0f && b > 0) before -= sums[--b];
  const int32_t first = b * kExpBlock;
  const float* e = ef + first;
  float l1[8], l2[4], l3[2];
  for (int j = 0; j < 8; ++j) l1[j] = Add(e[2 * j], e[2 * j + 1]);
  for (int j = 0; j < 4; ++j) l2[j] = Add(l1[2 * j], l1[2 * j + 1]);
  for (int j = 0; j < 2; ++j) l3[j] = Add(l2[2 * j], l2[2 * j + 1]);
  const float* levels[] = {l3, l2, l1, e};
  int32_t node = 0;
  for (const float* level : levels) {
    const float left = level[2 * node];
    if (before + left > target && left > 0.0f) {
      node = 2 * node;
    } else {
      before += left;
      node = 2 * node + 1;
    }
  }
  while (e[node] == 0.0f && node > 0) --node;
  while (e[node] == 0.0f && node + 1 < kExpBlock) ++node;
  return first + node;
}

// A multiple of the warp size that divides kBins (FindBoundary). One block reads a whole row, so
// its loads in flight set the speed: each thread issues kLoadBatch independent loads before
// using any (ForRow). One thread's loop with a load and a shared atomic per element waited out
// the memory latency on every element: 0.28 ms for a 128256-logit row on an H200, at any batch.
constexpr int kThreads = 512;
constexpr int kLoadBatch = 16;
constexpr int kWarps = kThreads / kWarp;
constexpr int kMaxK = kMaxSampleTopK;
// Histogram bins: the widest digit. 16 KiB of counters.
constexpr int kDigitBits = 12;
constexpr int kBins = 1 << kDigitBits;
constexpr int kBinsPerThread = kBins / kThreads;
// The key's digits, most significant first: bits 31..20, 19..8 and 7..0. The first alone already
// separates sign, exponent and 3 mantissa bits, which usually leaves the k-th logit's bin small
// enough to gather; the later ones only run when it is crowded. (Functions, not constexpr
// arrays: device code cannot index a host array at run time.)
constexpr int kLevels = 3;
__device__ __forceinline__ int DigitShift(int level) {
  return level == 0 ? 20 : level == 1 ? 8 : 0;
}
__device__ __forceinline__ int DigitWidth(int level) { return level == 2 ? 8 : kDigitBits; }
// Candidates gathered into shared memory (16 KiB as value + index); a power of two for the
// bitonic sort, and at least kMaxK for the tie gather.
constexpr int kCapacity = 2048;
static_assert(kBins % kThreads == 0 && kThreads % kWarp == 0, "bins and warps split evenly");
static_assert(kCapacity >= kMaxK && (kCapacity & (kCapacity - 1)) == 0, "candidate buffer size");
static_assert(kMaxK % kExpBlock == 0 && kMaxK * (8 + 4) + 8 <= kBins * 4,
              "the draw's scratch fits");

// An order-preserving key for RanksBefore's value order: a larger key ranks first, and two
// logits have one key exactly when RanksBefore orders them by index alone (equal values, or both
// NaN). Hence -0.0 and +0.0 share the key of +0.0 (they compare equal), and every NaN gets 0,
// below -inf's 0x007fffff.
__device__ __forceinline__ uint32_t RankKey(float v) {
  if (isnan(v)) return 0u;
  if (v == 0.0f) return 0x80000000u;
  const uint32_t u = __float_as_uint(v);
  return (u & 0x80000000u) != 0 ? ~u : (u | 0x80000000u);
}

// Where the need-th best element (1-based) falls in `hist` (counts per digit, larger digit
// first): `digit`, how many elements have a larger digit (`above` < need) and how many share it
// (above + in_bin >= need). Every thread gets the answer.
struct Boundary {
  uint32_t digit, above, in_bin;
};

__device__ Boundary FindBoundary(const uint32_t* hist, uint32_t need, uint32_t* warp_sums,
                                 Boundary* shared) {
  // Each thread sums a run of kBinsPerThread digits, thread 0 the largest; a block-wide scan of
  // those sums tells each thread how many elements lie above its run, so only the thread whose
  // run holds the boundary walks its bins: kBinsPerThread steps instead of kBins.
  const int top = kBins - 1 - static_cast<int>(threadIdx.x) * kBinsPerThread;
  uint32_t mine = 0;
  for (int j = 0; j < kBinsPerThread; ++j) mine += hist[top - j];
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  const int warp = static_cast<int>(threadIdx.x) / kWarp;
  uint32_t inclusive = mine;
  for (int o = 1; o < kWarp; o *= 2) {
    const uint32_t before = __shfl_up_sync(0xffffffffu, inclusive, o);
    if (lane >= o) inclusive += before;
  }
  if (lane == kWarp - 1) warp_sums[warp] = inclusive;
  __syncthreads();
  uint32_t above = inclusive - mine;
  for (int w = 0; w < warp; ++w) above += warp_sums[w];
  if (above < need && need <= above + mine) {
    for (int j = 0; j < kBinsPerThread; ++j) {
      const uint32_t h = hist[top - j];
      if (need <= above + h) {
        *shared = Boundary{static_cast<uint32_t>(top - j), above, h};
        break;
      }
      above += h;
    }
  }
  __syncthreads();
  return *shared;
}

// Sorts cand_v/cand_i[0, n) (n >= 1) into RanksBefore's order: a bitonic sort over the next
// power of two, padded with (NaN, INT32_MAX), which ranks after every real entry.
__device__ void SortCandidates(float* cand_v, int32_t* cand_i, int n) {
  int size = 1;
  while (size < n) size *= 2;
  for (int j = n + static_cast<int>(threadIdx.x); j < size; j += blockDim.x) {
    cand_v[j] = __uint_as_float(0x7fc00000u);
    cand_i[j] = INT32_MAX;
  }
  __syncthreads();
  for (int run = 2; run <= size; run *= 2) {
    for (int stride = run / 2; stride > 0; stride /= 2) {
      for (int t = static_cast<int>(threadIdx.x); t < size / 2; t += blockDim.x) {
        const int a = 2 * t - (t & (stride - 1));  // the pair (a, a + stride)
        const int b = a + stride;
        const bool forward = (a & run) == 0;  // this run goes in rank order, else reversed
        if (RanksBefore(cand_v[b], cand_i[b], cand_v[a], cand_i[a]) == forward) {
          const float v = cand_v[a];
          const int32_t i = cand_i[a];
          cand_v[a] = cand_v[b];
          cand_i[a] = cand_i[b];
          cand_v[b] = v;
          cand_i[b] = i;
        }
      }
      __syncthreads();
    }
  }
}

// f(i, row[i]) for this thread's elements i = threadIdx.x + j * blockDim.x of row[0, vocab), in
// increasing j, kLoadBatch loads issued before the first of them is used.
template <class F>
__device__ __forceinline__ void ForRow(const float* row, int64_t vocab, F&& f) {
  const int64_t stride = blockDim.x;
  for (int64_t base = threadIdx.x; base < vocab; base += kLoadBatch * stride) {
    float v[kLoadBatch];
#pragma unroll
    for (int u = 0; u < kLoadBatch; ++u) {
      const int64_t i = base + u * stride;
      v[u] = i < vocab ? row[i] : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < kLoadBatch; ++u) {
      const int64_t i = base + u * stride;
      if (i < vocab) f(i, v[u]);
    }
  }
}

// The largest of row[0, vocab) (NaN ignored), in every thread.
__device__ float BlockMax(const float* row, int64_t vocab, float* warp_max) {
  float m = -INFINITY;
  ForRow(row, vocab, [&](int64_t, float v) { m = v > m ? v : m; });
  for (int o = kWarp / 2; o > 0; o /= 2) {
    const float other = __shfl_xor_sync(0xffffffffu, m, o);
    m = other > m ? other : m;
  }
  if (threadIdx.x % kWarp == 0) warp_max[threadIdx.x / kWarp] = m;
  __syncthreads();
  float all = warp_max[0];
  for (int w = 1; w < kWarps; ++w) all = warp_max[w] > all ? warp_max[w] : all;
  __syncthreads();
  return all;
}

// A row's candidates rank and weigh by the host sampler's temperature step: (logit - max) *
// (1 / temperature) in float, or the logit itself at temperature 1 (no step).
struct Scaling {
  bool on;
  float max, scale;
  __device__ float operator()(float v) const { return on ? Mul(Sub(v, max), scale) : v; }
};

__global__ void __launch_bounds__(kThreads) SampleKernel(SampleTopKTopPArgs a) {
  __align__(16) __shared__ uint32_t hist[kBins];  // 16: the draw reuses it for doubles
  __shared__ float cand_v[kCapacity];
  __shared__ int32_t cand_i[kCapacity];
  __shared__ uint32_t warp_sums[kWarps];
  __shared__ float warp_max[kWarps];
  __shared__ Boundary boundary;
  __shared__ uint32_t filled;
  const SampleRowParams p = a.params[blockIdx.x];
  const float* row = a.logits + p.row * a.stride;
  if (a.vocab <= 0) {
    if (threadIdx.x == 0) a.out[blockIdx.x] = -1;
    return;
  }
  const int64_t top_k = p.top_k < 1 ? 1 : p.top_k > kMaxK ? kMaxK : p.top_k;
  const int32_t k = static_cast<int32_t>(top_k < a.vocab ? top_k : a.vocab);
  if (threadIdx.x == 0) filled = 0;
  // The temperature step needs the row's maximum first: one more pass, only when it applies.
  Scaling scaled{p.temperature != 1.0f, 0.0f, 0.0f};
  if (scaled.on) {
    scaled.max = BlockMax(row, a.vocab, warp_max);
    scaled.scale = 1.0f / p.temperature;
  }

  // Radix selection of the threshold: each level histograms the next digit of the keys that
  // share the digits chosen so far (`prefix` under `mask`), then picks the digit holding the
  // k-th best. `above` counts the elements already known to rank higher (a larger prefix).
  const uint32_t uk = static_cast<uint32_t>(k);
  uint32_t prefix = 0, mask = 0, above = 0;
  bool gathered = false;
  for (int level = 0; level < kLevels && !gathered; ++level) {
    const int shift = DigitShift(level);
    const uint32_t digit_mask = (1u << DigitWidth(level)) - 1u;
    for (int j = threadIdx.x; j < kBins; j += blockDim.x) hist[j] = 0;
    __syncthreads();
    // Each thread adds a run of one bin at once: a crowded bin (a masked vocabulary is mostly
    // -inf) would otherwise serialize the whole row on one shared counter.
    uint32_t run_bin = 0, run = 0;
    bool bad = false;  // NaN or +inf: the host sampler refuses the row
    ForRow(row, a.vocab, [&](int64_t, float raw) {
      bad = bad || !(raw < INFINITY);
      const uint32_t key = RankKey(scaled(raw));
      if ((key & mask) != prefix) return;
      const uint32_t bin = (key >> shift) & digit_mask;
      if (bin != run_bin && run > 0) {
        atomicAdd(&hist[run_bin], run);
        run = 0;
      }
      run_bin = bin;
      ++run;
    });
    if (run > 0) atomicAdd(&hist[run_bin], run);
    // Level 0 reads every logit: the block agrees there whether the row is refused.
    if (__syncthreads_or(bad)) {
      if (threadIdx.x == 0) a.out[blockIdx.x] = -1;
      return;
    }
    const Boundary b = FindBoundary(hist, uk - above, warp_sums, &boundary);
    above += b.above;
    prefix |= b.digit << shift;
    mask |= digit_mask << shift;
    const uint32_t selected = above + b.in_bin;  // the elements whose masked key >= prefix
    if (selected > static_cast<uint32_t>(kCapacity)) continue;  // crowded: the next digit
    // Gather: everything that ranks above the boundary bin (< k, all taken) and the bin itself;
    // the k best are among them.
    ForRow(row, a.vocab, [&](int64_t i, float raw) {
      const float v = scaled(raw);
      if ((RankKey(v) & mask) >= prefix) {
        const uint32_t slot = atomicAdd(&filled, 1u);
        cand_v[slot] = v;
        cand_i[slot] = static_cast<int32_t>(i);
      }
    });
    __syncthreads();
    SortCandidates(cand_v, cand_i, static_cast<int>(selected));
    gathered = true;
  }

  if (!gathered) {
    // Even the whole key leaves more than kCapacity at the boundary: these are exact ties (one
    // value, e.g. a vocabulary masked to -inf, or all NaN), which rank by index. Take the `above`
    // better ones wherever they are and the first k - above ties in index order, counting ties
    // tile by tile with ballots; stop once both are complete.
    const uint32_t need = uk - above;
    const int lane = static_cast<int>(threadIdx.x) % kWarp;
    const int warp = static_cast<int>(threadIdx.x) / kWarp;
    uint32_t found = 0;  // ties seen in earlier tiles; the same in every thread
    for (int64_t base = 0; base < a.vocab; base += blockDim.x) {
      const int64_t i = base + threadIdx.x;
      const float v = i < a.vocab ? scaled(row[i]) : 0.0f;
      const uint32_t key = i < a.vocab ? RankKey(v) : 0u;
      const bool tie = i < a.vocab && key == prefix;
      if (i < a.vocab && key > prefix) {
        const uint32_t slot = atomicAdd(&filled, 1u);
        cand_v[slot] = v;
        cand_i[slot] = static_cast<int32_t>(i);
      }
      const unsigned ballot = __ballot_sync(0xffffffffu, tie);
      if (lane == 0) warp_sums[warp] = static_cast<uint32_t>(__popc(ballot));
      __syncthreads();
      uint32_t pos = found + static_cast<uint32_t>(__popc(ballot & ((1u << lane) - 1u)));
      for (int w = 0; w < kWarps; ++w) {
        if (w < warp) pos += warp_sums[w];
        found += warp_sums[w];
      }
      if (tie && pos < need) {
        cand_v[above + pos] = v;
        cand_i[above + pos] = static_cast<int32_t>(i);
      }
      const bool done = found >= need && filled == above;
      __syncthreads();
      if (done) break;
    }
    SortCandidates(cand_v, cand_i, k);
  }

  // Every logit -inf (NaN after the temperature step): the host sampler refuses the row. (The
  // sort ended on a barrier: every thread sees the same cand_v[0].)
  if (!(cand_v[0] > -INFINITY)) {
    if (threadIdx.x == 0) a.out[blockIdx.x] = -1;
    return;
  }
  // The histogram is free again: the draw's scratch goes there.
  double* ed = reinterpret_cast<double*>(hist);
  float* ef = reinterpret_cast<float*>(ed + kMaxK);
  int32_t* cut = reinterpret_cast<int32_t*>(ef + kMaxK);
  const int32_t pick = PickCandidate(cand_v, k, p.top_p, p.uniform, ed, ef, cut);
  if (threadIdx.x == 0) a.out[blockIdx.x] = cand_i[pick];
}

}  // namespace

cudaError_t SampleTopKTopP(const SampleTopKTopPArgs& args, cudaStream_t stream) {
  if (args.rows <= 0) return cudaSuccess;
  KVSERVE_LAUNCH(SampleKernel, static_cast<unsigned>(args.rows), kThreads, 0, stream, args);
  return cudaGetLastError();
}

}  // namespace kvserve::cuda
