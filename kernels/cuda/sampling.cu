#include <algorithm>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/ranking.cuh"
#include "kernels/cuda/sampling.h"

namespace kvserve::cuda {
namespace {

constexpr int kThreads = 256;  // a multiple of the warp size that divides kBins (FindBoundary)
constexpr int kWarps = kThreads / kWarp;
constexpr int kMaxK = 64;
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

__global__ void __launch_bounds__(kThreads) SampleKernel(SampleArgs a, int32_t k) {
  __shared__ uint32_t hist[kBins];
  __shared__ float cand_v[kCapacity];
  __shared__ int32_t cand_i[kCapacity];
  __shared__ uint32_t warp_sums[kWarps];
  __shared__ Boundary boundary;
  __shared__ uint32_t filled;
  const float* row = a.logits + blockIdx.x * a.stride;
  if (a.vocab <= 0) {
    if (threadIdx.x == 0) a.out[blockIdx.x] = -1;
    return;
  }
  if (threadIdx.x == 0) filled = 0;

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
    for (int64_t i = threadIdx.x; i < a.vocab; i += blockDim.x) {
      const uint32_t key = RankKey(row[i]);
      if ((key & mask) != prefix) continue;
      const uint32_t bin = (key >> shift) & digit_mask;
      if (bin != run_bin && run > 0) {
        atomicAdd(&hist[run_bin], run);
        run = 0;
      }
      run_bin = bin;
      ++run;
    }
    if (run > 0) atomicAdd(&hist[run_bin], run);
    __syncthreads();
    const Boundary b = FindBoundary(hist, uk - above, warp_sums, &boundary);
    above += b.above;
    prefix |= b.digit << shift;
    mask |= digit_mask << shift;
    const uint32_t selected = above + b.in_bin;  // the elements whose masked key >= prefix
    if (selected > static_cast<uint32_t>(kCapacity)) continue;  // crowded: the next digit
    // Gather: everything that ranks above the boundary bin (< k, all taken) and the bin itself;
    // the k best are among them.
    for (int64_t i = threadIdx.x; i < a.vocab; i += blockDim.x) {
      const float v = row[i];
      if ((RankKey(v) & mask) >= prefix) {
        const uint32_t slot = atomicAdd(&filled, 1u);
        cand_v[slot] = v;
        cand_i[slot] = static_cast<int32_t>(i);
      }
    }
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
      const float v = i < a.vocab ? row[i] : 0.0f;
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

  if (threadIdx.x != 0) return;
  // The CPU's softmax, nucleus cut and draw over the k best in rank order, operation for
  // operation, so the pick is the CPU's bit for bit.
  float e[kMaxK];
  const float top = cand_v[0];
  float sum = 0.0f;
  for (int32_t i = 0; i < k; ++i) {
    e[i] = expf((cand_v[i] - top) / a.temperature);
    sum += e[i];
  }
  int32_t n = k;
  float cum = 0.0f;
  for (int32_t i = 0; i < k; ++i) {
    cum += e[i];
    if (cum / sum >= a.top_p) {
      n = i + 1;
      break;
    }
  }
  float kept = 0.0f;
  for (int32_t i = 0; i < n; ++i) kept += e[i];
  const float target = a.uniforms[blockIdx.x] * kept;
  int32_t pick = n - 1;
  float walk = 0.0f;
  for (int32_t i = 0; i < n; ++i) {
    walk += e[i];
    if (walk > target) {
      pick = i;
      break;
    }
  }
  a.out[blockIdx.x] = cand_i[pick];
}

}  // namespace

cudaError_t SampleTopKTopP(const SampleArgs& args, cudaStream_t stream) {
  if (args.rows <= 0) return cudaSuccess;
  const int32_t k = static_cast<int32_t>(
      std::min<int64_t>(std::clamp(args.k, 1, kMaxK), std::max<int64_t>(args.vocab, 1)));
  KVSERVE_LAUNCH(SampleKernel, static_cast<unsigned>(args.rows), kThreads, 0, stream, args, k);
  return cudaGetLastError();
}

}  // namespace kvserve::cuda
