#include <algorithm>
#include <type_traits>

#include "kernels/cuda/convert_weights.h"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/matmul.h"

namespace kvserve::cuda {
namespace {

// x [m, k] (row stride x_stride) -> dense [m, k] in 16-bit `to_bf16 ? bf16 : f16`.
__global__ void ConvertActivations(const float* x, int64_t x_stride, int64_t m, int64_t k,
                                   bool to_bf16, uint16_t* out) {
  const int64_t total = m * k;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < total;
       e += int64_t{gridDim.x} * blockDim.x) {
    const float v = x[(e / k) * x_stride + e % k];
    out[e] = to_bf16 ? FloatToBf16Bits(v) : __half_as_ushort(__float2half_rn(v));
  }
}

__global__ void AddBias(float* y, int64_t y_stride, int64_t m, int64_t n, const float* bias) {
  const int64_t total = m * n;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < total;
       e += int64_t{gridDim.x} * blockDim.x) {
    y[(e / n) * y_stride + e % n] += bias[e % n];
  }
}

unsigned Blocks(int64_t total) {
  return static_cast<unsigned>(std::clamp<int64_t>(CeilDiv(total, 256), 1, 65535));
}

// ---- Quantized weights in their packed layout -------------------------------------------------

constexpr int kGemvMaxRows = 8;  // x rows up to which quantized weights take the GEMV kernel
constexpr int kGemvWarps = 4;    // output columns per 128-thread block
// Weight rows dequantized to bf16 per GEMM slab, for larger m: at most this many bytes of scratch.
constexpr int64_t kSlabBytes = int64_t{8} << 20;

// One 32-element q8_0 / q4_0 block of a weight row against `m` x rows: acc[r] += d · Σ q·x.
template <DType W>
__device__ __forceinline__ void BlockDot(const uint8_t* block, const float* x, int64_t x_stride,
                                         int m, float* acc) {
  const float d = LoadHalfAt(block);
  float q[32];
  if constexpr (W == DType::kQ8_0) {
    // Blocks are 34 bytes: the quants start 2-byte aligned.
    const uint16_t* qs = reinterpret_cast<const uint16_t*>(block + 2);
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      const uint16_t two = qs[i];
      q[2 * i] = static_cast<float>(static_cast<int8_t>(two & 0xffu));
      q[2 * i + 1] = static_cast<float>(static_cast<int8_t>(two >> 8));
    }
  } else {
    const uint16_t* qs = reinterpret_cast<const uint16_t*>(block + 2);  // 18-byte blocks
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const uint16_t two = qs[i];
      q[2 * i] = static_cast<float>(static_cast<int>(two & 0xfu) - 8);
      q[2 * i + 1] = static_cast<float>(static_cast<int>((two >> 8) & 0xfu) - 8);
      q[2 * i + 16] = static_cast<float>(static_cast<int>((two >> 4) & 0xfu) - 8);
      q[2 * i + 17] = static_cast<float>(static_cast<int>(two >> 12) - 8);
    }
  }
#pragma unroll
  for (int r = 0; r < kGemvMaxRows; ++r) {
    if (r >= m) break;
    const float4* xr = reinterpret_cast<const float4*>(x + r * x_stride);
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const float4 v = xr[i];
      sum += q[4 * i] * v.x + q[4 * i + 1] * v.y + q[4 * i + 2] * v.z + q[4 * i + 3] * v.w;
    }
    acc[r] += d * sum;
  }
}

// Sub-block j (< 8: 32 elements) of a 256-element K-quant super-block against `m` x rows (`x`
// at the sub-block's first element), in the GGUF layouts cpu::DequantizeRow reads:
//   q4_K / q5_K: w = d · sc_j · q − dmin · m_j (6-bit sc_j, m_j packed in 12 bytes; q 4 bits,
//                q5_K's 5th bit from qh), summed as d · sc_j · Σ q·x − dmin · m_j · Σ x;
//   q6_K:        w = d · scale[e / 16] · (q − 32), two int8 scales a sub-block.
template <DType W>
__device__ __forceinline__ void SubBlockDotK(const uint8_t* block, int j, const float* x,
                                             int64_t x_stride, int m, float* acc) {
  float q[32];
  float s0, s1 = 0.0f, bias = 0.0f;  // weights: s0·q (first 16), s1·q (last 16, q6_K), − bias
  if constexpr (W == DType::kQ6_K) {
    const int h = j / 4;
    const int g = j % 4;
    const uint8_t* ql = block + 64 * h + 32 * (g & 1);
    const uint8_t* qh = block + 128 + 32 * h;
#pragma unroll
    for (int l = 0; l < 32; ++l) {
      const int nibble = g < 2 ? (ql[l] & 0xf) : (ql[l] >> 4);
      q[l] = static_cast<float>((nibble | (((qh[l] >> (2 * g)) & 3) << 4)) - 32);
    }
    const float d = LoadHalfAt(block + 208);
    s0 = d * static_cast<float>(static_cast<int8_t>(block[192 + 2 * j]));
    s1 = d * static_cast<float>(static_cast<int8_t>(block[193 + 2 * j]));
  } else {
    const uint8_t* sc = block + 4;
    const int scale = j < 4 ? (sc[j] & 63) : ((sc[j + 4] & 0xf) | ((sc[j - 4] >> 6) << 4));
    const int min = j < 4 ? (sc[j + 4] & 63) : ((sc[j + 4] >> 4) | ((sc[j] >> 6) << 4));
    const uint8_t* qs = block + (W == DType::kQ5_K ? 48 : 16) + 32 * (j / 2);
    const int shift = 4 * (j % 2);
#pragma unroll
    for (int l = 0; l < 32; ++l) {
      int v = (qs[l] >> shift) & 0xf;
      if constexpr (W == DType::kQ5_K) v |= ((block[16 + l] >> j) & 1) << 4;
      q[l] = static_cast<float>(v);
    }
    s0 = s1 = LoadHalfAt(block) * static_cast<float>(scale);
    bias = LoadHalfAt(block + 2) * static_cast<float>(min);
  }
#pragma unroll
  for (int r = 0; r < kGemvMaxRows; ++r) {
    if (r >= m) break;
    const float4* xr = reinterpret_cast<const float4*>(x + r * x_stride);
    float lo = 0.0f, hi = 0.0f, sum_x = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const float4 v = xr[i];
      const float dot = q[4 * i] * v.x + q[4 * i + 1] * v.y + q[4 * i + 2] * v.z + q[4 * i + 3] * v.w;
      (i < 4 ? lo : hi) += dot;
      sum_x += (v.x + v.y) + (v.z + v.w);
    }
    acc[r] += s0 * lo + s1 * hi - bias * sum_x;
  }
}

// y[r, j] = x[r, :] · W[j, :] (+ bias[j]) for r < m <= kGemvMaxRows, W read in its GGUF blocks:
// one warp per weight row, each block decoded once for all m x rows, lanes on consecutive pieces
// of the row (a warp reads one contiguous span). q8_0 and q4_0: a lane per 32-element block;
// K-quants: a lane per 32-element sub-block of a 256-element super-block (8 lanes a super-block);
// q4_1 and q5_* go element by element through LoadWeight. The sum runs in f32 over the exact
// dequantized weights and f32 activations.
template <DType W>
__global__ void __launch_bounds__(kGemvWarps* kWarp)
    QuantGemvKernel(cpu::MatmulArgs a, DType dtype, int64_t row_bytes, bool x_vec4) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kGemvWarps + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (j >= a.n) return;
  const int m = static_cast<int>(a.m);
  const uint8_t* row = static_cast<const uint8_t*>(a.w) + j * row_bytes;
  float acc[kGemvMaxRows] = {};
  bool blocked = false;  // read by whole blocks (else element by element)
  if constexpr (W == DType::kQ8_0 || W == DType::kQ4_0) {
    if (x_vec4) {
      const int64_t block_bytes = W == DType::kQ8_0 ? 34 : 18;
      for (int64_t b = lane; b < a.k / 32; b += kWarp) {
        BlockDot<W>(row + b * block_bytes, a.x + b * 32, a.x_stride, m, acc);
      }
      blocked = true;
    }
  } else if constexpr (W == DType::kQ4_K || W == DType::kQ5_K || W == DType::kQ6_K) {
    if (x_vec4) {
      const int64_t block_bytes = W == DType::kQ4_K ? 144 : (W == DType::kQ5_K ? 176 : 210);
      for (int64_t i = lane; i < a.k / 32; i += kWarp) {
        SubBlockDotK<W>(row + (i / 8) * block_bytes, static_cast<int>(i % 8), a.x + i * 32,
                        a.x_stride, m, acc);
      }
      blocked = true;
    }
  }
  if (!blocked) {
    for (int64_t c = lane; c < a.k; c += kWarp) {
      const float w = LoadWeight(row, dtype, c);
      for (int r = 0; r < m; ++r) acc[r] += w * a.x[r * a.x_stride + c];
    }
  }
#pragma unroll
  for (int r = 0; r < kGemvMaxRows; ++r) {
    if (r >= m) break;
    const float v = WarpSum(acc[r]);
    if (lane == 0) a.y[r * a.y_stride + j] = v + (a.bias != nullptr ? a.bias[j] : 0.0f);
  }
}

const char* QuantGemv(const cpu::MatmulArgs& a, cudaStream_t stream) {
  const int64_t row_bytes = DTypeRowBytes(a.w_dtype, a.k);
  // float4 reads of x need 16-byte rows and base.
  const bool x_vec4 = reinterpret_cast<uintptr_t>(a.x) % 16 == 0 && a.x_stride % 4 == 0;
  const unsigned blocks = static_cast<unsigned>(CeilDiv(a.n, kGemvWarps));
  auto launch = [&](auto format) {
    KVSERVE_LAUNCH(QuantGemvKernel<decltype(format)::value>, blocks, kGemvWarps * kWarp, 0,
                   stream, a, a.w_dtype, row_bytes, x_vec4);
  };
  // The formats with a block decoder of their own; kF32 stands for the element-wise rest.
  switch (a.w_dtype) {
    case DType::kQ8_0:
      launch(std::integral_constant<DType, DType::kQ8_0>{});
      break;
    case DType::kQ4_0:
      launch(std::integral_constant<DType, DType::kQ4_0>{});
      break;
    case DType::kQ4_K:
      launch(std::integral_constant<DType, DType::kQ4_K>{});
      break;
    case DType::kQ5_K:
      launch(std::integral_constant<DType, DType::kQ5_K>{});
      break;
    case DType::kQ6_K:
      launch(std::integral_constant<DType, DType::kQ6_K>{});
      break;
    default:
      launch(std::integral_constant<DType, DType::kF32>{});
      break;
  }
  return cudaGetLastError() == cudaSuccess ? nullptr : "quantized GEMV launch failed";
}

// Weight rows per slab when quantized weights meet more than kGemvMaxRows x rows.
int64_t SlabRows(const cpu::MatmulArgs& a) {
  return std::clamp<int64_t>(kSlabBytes / (2 * std::max<int64_t>(a.k, 1)), 64, a.n);
}

}  // namespace

size_t MatmulScratchBytes(const cpu::MatmulArgs& a) {
  if (a.w_dtype == DType::kF32) return 0;
  if (DTypeIsQuantized(a.w_dtype)) {
    if (a.m <= kGemvMaxRows) return 0;
    return sizeof(uint16_t) * (a.m * a.k + SlabRows(a) * a.k);
  }
  return sizeof(uint16_t) * a.m * a.k;
}

const char* Matmul(const cpu::MatmulArgs& a, cublasHandle_t handle, void* scratch,
                   cudaStream_t stream) {
  if (a.m <= 0 || a.n <= 0) return nullptr;
  const float alpha = 1.0f;
  const float beta = 0.0f;
  // Row-major y[m, n] is column-major y^T [n, m] = W [n, k] (column-major W^T, ld k, transposed)
  // times x^T [k, m] (column-major, ld x_stride).
  const void* x = a.x;
  int64_t ldx = a.x_stride;
  cudaDataType_t type = CUDA_R_32F;
  if (DTypeIsQuantized(a.w_dtype)) {
    if (a.m <= kGemvMaxRows) return QuantGemv(a, stream);
    // Larger batches: x to bf16 once, then each slab of weight rows dequantized to bf16 in the
    // scratch and multiplied there (the packed weights stay the only copy in memory).
    uint16_t* xb = static_cast<uint16_t*>(scratch);
    uint16_t* slab = xb + a.m * a.k;
    KVSERVE_LAUNCH(ConvertActivations, Blocks(a.m * a.k), 256, 0, stream, a.x, a.x_stride, a.m, a.k,
                   true, xb);
    if (cudaGetLastError() != cudaSuccess) return "activation conversion launch failed";
    const int64_t row_bytes = DTypeRowBytes(a.w_dtype, a.k);
    const int64_t slab_rows = SlabRows(a);
    for (int64_t r0 = 0; r0 < a.n; r0 += slab_rows) {
      const int64_t rows = std::min(slab_rows, a.n - r0);
      if (ConvertWeights(static_cast<const uint8_t*>(a.w) + r0 * row_bytes, a.w_dtype, rows, a.k,
                         DType::kBF16, slab, stream) != cudaSuccess) {
        return "weight slab conversion launch failed";
      }
      const cublasStatus_t st = cublasGemmEx(
          handle, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(rows), static_cast<int>(a.m),
          static_cast<int>(a.k), &alpha, slab, CUDA_R_16BF, static_cast<int>(a.k), xb,
          CUDA_R_16BF, static_cast<int>(a.k), &beta, a.y + r0, CUDA_R_32F,
          static_cast<int>(a.y_stride), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
      if (st != CUBLAS_STATUS_SUCCESS) return cublasGetStatusString(st);
    }
    if (a.bias != nullptr) {
      KVSERVE_LAUNCH(AddBias, Blocks(a.m * a.n), 256, 0, stream, a.y, a.y_stride, a.m, a.n, a.bias);
      if (cudaGetLastError() != cudaSuccess) return "bias launch failed";
    }
    return nullptr;
  }
  if (a.w_dtype == DType::kBF16 || a.w_dtype == DType::kF16) {
    const bool bf16 = a.w_dtype == DType::kBF16;
    KVSERVE_LAUNCH(ConvertActivations, Blocks(a.m * a.k), 256, 0, stream, a.x, a.x_stride, a.m, a.k,
                   bf16, static_cast<uint16_t*>(scratch));
    if (cudaGetLastError() != cudaSuccess) return "activation conversion launch failed";
    x = scratch;
    ldx = a.k;
    type = bf16 ? CUDA_R_16BF : CUDA_R_16F;
  }
  const cublasStatus_t st =
      cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(a.n), static_cast<int>(a.m),
                   static_cast<int>(a.k), &alpha, a.w, type, static_cast<int>(a.k), x, type,
                   static_cast<int>(ldx), &beta, a.y, CUDA_R_32F, static_cast<int>(a.y_stride),
                   CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  if (st != CUBLAS_STATUS_SUCCESS) return cublasGetStatusString(st);
  if (a.bias != nullptr) {
    KVSERVE_LAUNCH(AddBias, Blocks(a.m * a.n), 256, 0, stream, a.y, a.y_stride, a.m, a.n, a.bias);
    if (cudaGetLastError() != cudaSuccess) return "bias launch failed";
  }
  return nullptr;
}

}  // namespace kvserve::cuda
