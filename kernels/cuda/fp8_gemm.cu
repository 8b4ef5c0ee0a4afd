#include <algorithm>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/fp8_gemm.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/ptx.cuh"

namespace kvserve::cuda {
namespace {

constexpr int kQuantThreads = 256;
constexpr int kGemvWarps = 4;  // weight rows per 128-thread block

// Element i of an f32 / f16 / bf16 array, as f32.
__device__ __forceinline__ float LoadFloat(const void* p, int64_t i, DType type) {
  if (type == DType::kF32) return static_cast<const float*>(p)[i];
  const uint16_t bits = static_cast<const uint16_t*>(p)[i];
  return type == DType::kBF16 ? Bf16BitsToFloat(bits) : HalfBitsToFloat(bits);
}

// The block's largest `amax` (every thread gets it); NaN never wins, as in cpu::EncodeKvVector.
__device__ __forceinline__ float BlockMax(float amax) {
  __shared__ float warp_max[kQuantThreads / kWarp];
  amax = WarpMax(amax);
  if (threadIdx.x % kWarp == 0) warp_max[threadIdx.x / kWarp] = amax;
  __syncthreads();
  float block_max = 0.0f;
#pragma unroll
  for (int w = 0; w < kQuantThreads / kWarp; ++w) block_max = fmaxf(block_max, warp_max[w]);
  return block_max;
}

// One block per row, any layout: the row's absmax, its scale absmax / 448, then every element
// divided by it and rounded to E4M3 (the row is read twice).
__global__ void __launch_bounds__(kQuantThreads)
    QuantizeRowsFp8Kernel(const void* src, DType src_dtype, int64_t src_stride, int64_t cols,
                          uint8_t* codes, int64_t codes_stride, float* scales) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * src_stride;
  float amax = 0.0f;
  for (int64_t c = threadIdx.x; c < cols; c += kQuantThreads) {
    amax = fmaxf(amax, fabsf(LoadFloat(src, row + c, src_dtype)));
  }
  const float s = BlockMax(amax) / 448.0f;
  if (threadIdx.x == 0) scales[blockIdx.x] = s;
  uint8_t* out = codes + static_cast<int64_t>(blockIdx.x) * codes_stride;
  for (int64_t c = threadIdx.x; c < cols; c += kQuantThreads) {
    out[c] = s == 0.0f ? 0 : FloatToFp8(LoadFloat(src, row + c, src_dtype) / s);
  }
}

// 16-byte vectors a thread of QuantizeRowsFp8VecKernel keeps: rows of up to 16 KiB.
constexpr int kQuantVectors = 4;

// QuantizeRowsFp8Kernel for rows of whole, 16-byte aligned vectors of at most kQuantVectors per
// thread: each thread reads its vectors once into registers and stores its codes 4 or 8 at a
// time (the same bytes: the same arithmetic per element). E: the source type, named as the KV
// dtype of the same encoding (f32, f16, bf16) so DecodeChunk (ptx.cuh) widens it.
template <KvCacheDType E>
__global__ void __launch_bounds__(kQuantThreads)
    QuantizeRowsFp8VecKernel(const void* src, int64_t src_stride, int64_t cols, uint8_t* codes,
                             int64_t codes_stride, float* scales) {
  constexpr int kPer = E == KvCacheDType::kF32 ? 4 : 8;  // elements of a 16-byte vector
  const int64_t vectors = cols / kPer;
  const auto* row = reinterpret_cast<const uint4*>(static_cast<const uint8_t*>(src)) +
                    static_cast<int64_t>(blockIdx.x) * (src_stride / kPer);
  float v[kQuantVectors][kPer];
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < kQuantVectors; ++i) {
    const int64_t at = threadIdx.x + i * kQuantThreads;
    if (at < vectors) {
      DecodeChunk<E>(row[at], v[i]);
#pragma unroll
      for (int e = 0; e < kPer; ++e) amax = fmaxf(amax, fabsf(v[i][e]));
    }
  }
  const float s = BlockMax(amax) / 448.0f;
  if (threadIdx.x == 0) scales[blockIdx.x] = s;
  uint8_t* out = codes + static_cast<int64_t>(blockIdx.x) * codes_stride;
#pragma unroll
  for (int i = 0; i < kQuantVectors; ++i) {
    const int64_t at = threadIdx.x + i * kQuantThreads;
    if (at >= vectors) break;
    uint32_t packed[kPer / 4] = {};
#pragma unroll
    for (int e = 0; e < kPer; ++e) {
      const uint32_t code = s == 0.0f ? 0u : FloatToFp8(v[i][e] / s);
      packed[e / 4] |= code << (8 * (e % 4));
    }
    if constexpr (kPer == 8) {
      reinterpret_cast<uint2*>(out)[at] = make_uint2(packed[0], packed[1]);
    } else {
      reinterpret_cast<uint32_t*>(out)[at] = packed[0];
    }
  }
}

// Sixteen E4M3 codes (a 16-byte load, first code in the low byte of .x) as floats.
__device__ __forceinline__ void Decode16(const uint4 v, float* out) {
  Fp8x4ToFloats(v.x, out);
  Fp8x4ToFloats(v.y, out + 4);
  Fp8x4ToFloats(v.z, out + 8);
  Fp8x4ToFloats(v.w, out + 12);
}

// One warp per weight row j: lanes on consecutive 16-code pieces of the row (vec16) or single
// codes; every weight piece decoded once for all m x rows. The products of two E4M3 values are
// exact in f32; only the summation order is the kernel's.
__global__ void __launch_bounds__(kGemvWarps* kWarp)
    Fp8GemvKernel(cpu::MatmulArgs a, const uint8_t* xq, int64_t xq_stride, const float* xs,
                  bool vec16, bool y_bf16) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kGemvWarps + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (j >= a.n) return;
  const int m = static_cast<int>(a.m);
  const uint8_t* w = static_cast<const uint8_t*>(a.w) + j * a.k;
  float acc[kFp8GemvMaxRows] = {};
  if (vec16) {
    // The 16 weights at c against the x rows' 16 codes there.
    auto piece = [&](const uint4 codes, int64_t c) {
      float wf[16];
      Decode16(codes, wf);
#pragma unroll
      for (int r = 0; r < kFp8GemvMaxRows; ++r) {
        if (r >= m) break;
        float xf[16];
        Decode16(*reinterpret_cast<const uint4*>(xq + r * xq_stride + c), xf);
        float sum = acc[r];
#pragma unroll
        for (int e = 0; e < 16; ++e) sum = fmaf(wf[e], xf[e], sum);
        acc[r] = sum;
      }
    };
    // Two 16-byte weight loads in flight per lane before either is used.
    constexpr int64_t kSpan = 16 * kWarp;  // bytes of the row one warp-wide load covers
    for (int64_t c = 16 * lane; c < a.k; c += 2 * kSpan) {
      const bool second = c + kSpan < a.k;
      const uint4 w0 = *reinterpret_cast<const uint4*>(w + c);
      const uint4 w1 = second ? *reinterpret_cast<const uint4*>(w + c + kSpan) : uint4{};
      piece(w0, c);
      if (second) piece(w1, c + kSpan);
    }
  } else {
    for (int64_t c = lane; c < a.k; c += kWarp) {
      const float wv = Fp8ToFloat(w[c]);
      for (int r = 0; r < m; ++r) acc[r] = fmaf(wv, Fp8ToFloat(xq[r * xq_stride + c]), acc[r]);
    }
  }
  const float w_scale = a.w_scale[j];
  const float bias = a.bias != nullptr ? a.bias[j] : 0.0f;
#pragma unroll
  for (int r = 0; r < kFp8GemvMaxRows; ++r) {
    if (r >= m) break;
    const float v = WarpSum(acc[r]);
    if (lane == 0) StoreAct(a.y, r * a.y_stride + j, v * (xs[r] * w_scale) + bias, y_bf16);
  }
}

__global__ void Fp8ScaleRowsKernel(const float* acc, int64_t acc_stride, const float* xs,
                                   const float* ws, const float* bias, void* y, bool y_bf16,
                                   int64_t y_stride, int64_t m, int64_t n) {
  const int64_t total = m * n;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < total;
       e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = e / n;
    const int64_t c = e % n;
    float v = acc[r * acc_stride + c];
    if (xs != nullptr) v *= xs[r] * ws[c];
    StoreAct(y, r * y_stride + c, v + (bias != nullptr ? bias[c] : 0.0f), y_bf16);
  }
}

}  // namespace

cudaError_t QuantizeRowsFp8(const void* src, DType src_dtype, int64_t src_stride, int64_t rows,
                            int64_t cols, uint8_t* codes, int64_t codes_stride, float* scales,
                            cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  const auto grid = static_cast<unsigned>(rows);
  // Whole 16-byte vectors, aligned, few enough to stay in registers; codes stored a vector's
  // worth (4 or 8 bytes) at a time.
  const int per = src_dtype == DType::kF32 ? 4 : 8;
  const bool vec = reinterpret_cast<uintptr_t>(src) % 16 == 0 && src_stride % per == 0 &&
                   cols % per == 0 && cols / per <= int64_t{kQuantVectors} * kQuantThreads &&
                   reinterpret_cast<uintptr_t>(codes) % per == 0 && codes_stride % per == 0;
  if (vec && src_dtype == DType::kF32) {
    KVSERVE_LAUNCH(QuantizeRowsFp8VecKernel<KvCacheDType::kF32>, grid, kQuantThreads, 0, stream,
                   src, src_stride, cols, codes, codes_stride, scales);
  } else if (vec && src_dtype == DType::kBF16) {
    KVSERVE_LAUNCH(QuantizeRowsFp8VecKernel<KvCacheDType::kBF16>, grid, kQuantThreads, 0, stream,
                   src, src_stride, cols, codes, codes_stride, scales);
  } else if (vec && src_dtype == DType::kF16) {
    KVSERVE_LAUNCH(QuantizeRowsFp8VecKernel<KvCacheDType::kF16>, grid, kQuantThreads, 0, stream,
                   src, src_stride, cols, codes, codes_stride, scales);
  } else {
    KVSERVE_LAUNCH(QuantizeRowsFp8Kernel, grid, kQuantThreads, 0, stream, src, src_dtype,
                   src_stride, cols, codes, codes_stride, scales);
  }
  return cudaGetLastError();
}

cudaError_t Fp8Gemv(const cpu::MatmulArgs& a, const uint8_t* xq, int64_t xq_stride, const float* xs,
                    cudaStream_t stream) {
  if (a.m <= 0 || a.n <= 0) return cudaSuccess;
  const bool vec16 = a.k % 16 == 0 && reinterpret_cast<uintptr_t>(a.w) % 16 == 0 &&
                     reinterpret_cast<uintptr_t>(xq) % 16 == 0 && xq_stride % 16 == 0;
  const auto blocks = static_cast<unsigned>(CeilDiv(a.n, kGemvWarps));
  KVSERVE_LAUNCH(Fp8GemvKernel, blocks, kGemvWarps * kWarp, 0, stream, a, xq, xq_stride, xs, vec16,
                 a.y_dtype == DType::kBF16);
  return cudaGetLastError();
}

cudaError_t Fp8ScaleRows(const float* acc, int64_t acc_stride, const float* xs, const float* ws,
                         const float* bias, void* y, DType y_dtype, int64_t y_stride, int64_t m,
                         int64_t n, cudaStream_t stream) {
  if (m <= 0 || n <= 0) return cudaSuccess;
  const auto blocks = static_cast<unsigned>(std::clamp<int64_t>(CeilDiv(m * n, 256), 1, 65535));
  KVSERVE_LAUNCH(Fp8ScaleRowsKernel, blocks, 256, 0, stream, acc, acc_stride, xs, ws, bias, y,
                 y_dtype == DType::kBF16, y_stride, m, n);
  return cudaGetLastError();
}

}  // namespace kvserve::cuda
