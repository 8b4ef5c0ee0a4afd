#include <algorithm>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/silu_mul.h"

namespace kvserve::cuda {
namespace {

constexpr int kThreads = 256;
// Elements a thread takes at once: 16 bytes (eight bf16, four f32).
template <bool kBf16>
constexpr int kVec = kBf16 ? 8 : 4;

// kVec elements at element index i of p (16-byte aligned), widened to f32.
template <bool kBf16>
__device__ __forceinline__ void LoadVec(const float* p, int64_t i, float* v) {
  if constexpr (kBf16) {
    const uint4 w = *reinterpret_cast<const uint4*>(reinterpret_cast<const uint16_t*>(p) + i);
    const uint32_t words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      v[2 * j] = __uint_as_float(words[j] << 16);
      v[2 * j + 1] = __uint_as_float(words[j] & 0xffff0000u);
    }
  } else {
    const float4 f = *reinterpret_cast<const float4*>(p + i);
    v[0] = f.x, v[1] = f.y, v[2] = f.z, v[3] = f.w;
  }
}

template <bool kBf16>
__device__ __forceinline__ void StoreVec(float* p, int64_t i, const float* v) {
  if constexpr (kBf16) {
    uint32_t words[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      words[j] =
          FloatToBf16Bits(v[2 * j]) | (static_cast<uint32_t>(FloatToBf16Bits(v[2 * j + 1])) << 16);
    }
    *reinterpret_cast<uint4*>(reinterpret_cast<uint16_t*>(p) + i) =
        make_uint4(words[0], words[1], words[2], words[3]);
  } else {
    *reinterpret_cast<float4*>(p + i) = make_float4(v[0], v[1], v[2], v[3]);
  }
}

__device__ __forceinline__ float Silu(float g, float u) { return g / (1.0f + expf(-g)) * u; }

// gate, up and out in a.dtype (f32 or bf16), computed in f32. Grid y walks the rows, x the
// row's elements, kVec a thread (16-byte loads and stores with kVector: SiluMul checked the
// alignment; the row's last dim % kVec elements one by one). One element a thread with a 64-bit
// division for its row and column held this op to half the bandwidth on an H200.
template <bool kBf16, bool kVector>
__global__ void __launch_bounds__(kThreads) SiluMulKernel(SiluMulArgs a) {
  constexpr int V = kVec<kBf16>;
  const int64_t step = int64_t{gridDim.x} * blockDim.x * V;
  for (int64_t r = blockIdx.y; r < a.rows; r += gridDim.y) {
    const int64_t g0 = r * a.gate_stride, u0 = r * a.up_stride, o0 = r * a.out_stride;
    for (int64_t i = (int64_t{blockIdx.x} * blockDim.x + threadIdx.x) * V; i < a.dim;
         i += step) {
      if (kVector && i + V <= a.dim) {
        float g[V], u[V], out[V];
        LoadVec<kBf16>(a.gate, g0 + i, g);
        LoadVec<kBf16>(a.up, u0 + i, u);
#pragma unroll
        for (int e = 0; e < V; ++e) out[e] = Silu(g[e], u[e]);
        StoreVec<kBf16>(a.out, o0 + i, out);
        continue;
      }
      const int64_t end = min(i + V, a.dim);
      for (int64_t e = i; e < end; ++e) {
        StoreAct(a.out, o0 + e, Silu(LoadAct(a.gate, g0 + e, kBf16), LoadAct(a.up, u0 + e, kBf16)),
                 kBf16);
      }
    }
  }
}

template <bool kBf16>
cudaError_t Launch(const SiluMulArgs& args, cudaStream_t stream) {
  const int64_t elem = kBf16 ? 2 : 4;
  const auto aligned = [&](const void* p, int64_t stride) {
    return reinterpret_cast<uintptr_t>(p) % 16 == 0 && (stride * elem) % 16 == 0;
  };
  const bool vector = aligned(args.gate, args.gate_stride) && aligned(args.up, args.up_stride) &&
                      aligned(args.out, args.out_stride);
  const dim3 grid(static_cast<unsigned>(CeilDiv(args.dim, int64_t{kThreads} * kVec<kBf16>)),
                  static_cast<unsigned>(std::min<int64_t>(args.rows, 65535)));
  return vector
             ? LaunchWithSharedMemory<SiluMulKernel<kBf16, true>>(grid, kThreads, 0, stream, args)
             : LaunchWithSharedMemory<SiluMulKernel<kBf16, false>>(grid, kThreads, 0, stream, args);
}

}  // namespace

cudaError_t SiluMul(const SiluMulArgs& args, cudaStream_t stream) {
  if (args.rows <= 0 || args.dim <= 0) return cudaSuccess;
  return args.dtype == DType::kBF16 ? Launch<true>(args, stream) : Launch<false>(args, stream);
}

}  // namespace kvserve::cuda
