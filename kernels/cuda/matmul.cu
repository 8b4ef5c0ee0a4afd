#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <tuple>
#include <type_traits>

#include "kernels/cuda/convert_weights.h"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/fp8_gemm.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/matmul.h"

namespace kvserve::cuda {
namespace {

// Launches of ConvertRows since the library loaded (kvserve_cuda_activation_conversions).
std::atomic<int64_t> g_conversions{0};

// An activation element of `type` (f32, bf16 or f16) at p[i], as f32.
__device__ __forceinline__ float LoadTyped(const void* p, int64_t i, DType type) {
  if (type == DType::kF32) return static_cast<const float*>(p)[i];
  const uint16_t bits = static_cast<const uint16_t*>(p)[i];
  return type == DType::kBF16 ? Bf16BitsToFloat(bits) : HalfBitsToFloat(bits);
}

// The one activation pass outside the GEMMs, for what cuBLAS cannot do in one call:
// dst[r, c] = src[r, c] (+ bias[c]) for r < m, c < n, converted from src_type to dst_type (f32,
// bf16, f16; rounded once). Rows are strided (elements); dst may be src itself (same type).
// Used to give a GEMM x in the weights' type, and to add a bias to (and round) an f32 result.
__global__ void ConvertRows(const void* src, DType src_type, int64_t src_stride, const float* bias,
                            void* dst, DType dst_type, int64_t dst_stride, int64_t m, int64_t n) {
  const int64_t total = m * n;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < total;
       e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = e / n;
    const int64_t c = e % n;
    const float v = LoadTyped(src, r * src_stride + c, src_type) + (bias != nullptr ? bias[c] : 0.0f);
    const int64_t at = r * dst_stride + c;
    if (dst_type == DType::kF32) {
      static_cast<float*>(dst)[at] = v;
    } else {
      static_cast<uint16_t*>(dst)[at] =
          dst_type == DType::kBF16 ? FloatToBf16Bits(v) : __half_as_ushort(__float2half_rn(v));
    }
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

// Four consecutive activations of x (f32: 16-byte aligned; bf16: 8-byte aligned) as f32.
template <typename X>
__device__ __forceinline__ float4 LoadX4(const X* p) {
  if constexpr (std::is_same_v<X, float>) {
    return *reinterpret_cast<const float4*>(p);
  } else {
    const uint2 v = *reinterpret_cast<const uint2*>(p);  // bf16 pairs, low half first
    return make_float4(__uint_as_float(v.x << 16), __uint_as_float(v.x & 0xffff0000u),
                       __uint_as_float(v.y << 16), __uint_as_float(v.y & 0xffff0000u));
  }
}

// One activation of x (float, or uint16_t bits of a bf16) as f32.
template <typename X>
__device__ __forceinline__ float LoadX(const X* p, int64_t i) {
  if constexpr (std::is_same_v<X, float>) {
    return p[i];
  } else {
    return Bf16BitsToFloat(p[i]);
  }
}

// One 32-element q8_0 / q4_0 block of a weight row against `m` x rows: acc[r] += d · Σ q·x.
template <DType W, typename X>
__device__ __forceinline__ void BlockDot(const uint8_t* block, const X* x, int64_t x_stride,
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
    const X* xr = x + r * x_stride;
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const float4 v = LoadX4(xr + 4 * i);
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
template <DType W, typename X>
__device__ __forceinline__ void SubBlockDotK(const uint8_t* block, int j, const X* x,
                                             int64_t x_stride, int m, float* acc) {
  float q[32];
  float s0, s1 = 0.0f, bias = 0.0f;  // weights: s0·q (first 16), s1·q (last 16, q6_K), − bias
  if constexpr (W == DType::kQ6_K) {
#pragma unroll
    for (int l = 0; l < 32; ++l) q[l] = static_cast<float>(Q6KQuant(block, j, l));
    const float d = LoadHalfAt(block + 208);
    s0 = d * static_cast<float>(static_cast<int8_t>(block[192 + 2 * j]));
    s1 = d * static_cast<float>(static_cast<int8_t>(block[193 + 2 * j]));
  } else {
    const uint8_t* qh = W == DType::kQ5_K ? block + 16 : nullptr;
    const uint8_t* qs = block + (W == DType::kQ5_K ? 48 : 16);
#pragma unroll
    for (int l = 0; l < 32; ++l) q[l] = static_cast<float>(Q45KQuant(qh, qs, j, l));
    const KScaleMin sm = Q45KScaleMin(block + 4, j);
    s0 = s1 = LoadHalfAt(block) * static_cast<float>(sm.scale);
    bias = LoadHalfAt(block + 2) * static_cast<float>(sm.min);
  }
#pragma unroll
  for (int r = 0; r < kGemvMaxRows; ++r) {
    if (r >= m) break;
    const X* xr = x + r * x_stride;
    float lo = 0.0f, hi = 0.0f, sum_x = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const float4 v = LoadX4(xr + 4 * i);
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
// dequantized weights and the activations x (X = float, or uint16_t for bf16); y is f32 or bf16
// (y_bf16), rounded once after the bias.
template <DType W, typename X>
__global__ void __launch_bounds__(kGemvWarps* kWarp)
    QuantGemvKernel(cpu::MatmulArgs a, DType dtype, int64_t row_bytes, bool x_vec4, bool y_bf16) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kGemvWarps + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (j >= a.n) return;
  const int m = static_cast<int>(a.m);
  const uint8_t* row = static_cast<const uint8_t*>(a.w) + j * row_bytes;
  const X* x = reinterpret_cast<const X*>(a.x);
  float acc[kGemvMaxRows] = {};
  bool blocked = false;  // read by whole blocks (else element by element)
  if constexpr (W == DType::kQ8_0 || W == DType::kQ4_0) {
    if (x_vec4) {
      const int64_t block_bytes = W == DType::kQ8_0 ? 34 : 18;
      for (int64_t b = lane; b < a.k / 32; b += kWarp) {
        BlockDot<W>(row + b * block_bytes, x + b * 32, a.x_stride, m, acc);
      }
      blocked = true;
    }
  } else if constexpr (W == DType::kQ4_K || W == DType::kQ5_K || W == DType::kQ6_K) {
    if (x_vec4) {
      const int64_t block_bytes = W == DType::kQ4_K ? 144 : (W == DType::kQ5_K ? 176 : 210);
      for (int64_t i = lane; i < a.k / 32; i += kWarp) {
        SubBlockDotK<W>(row + (i / 8) * block_bytes, static_cast<int>(i % 8), x + i * 32,
                        a.x_stride, m, acc);
      }
      blocked = true;
    }
  }
  if (!blocked) {
    for (int64_t c = lane; c < a.k; c += kWarp) {
      const float w = LoadWeight(row, dtype, c);
      for (int r = 0; r < m; ++r) acc[r] += w * LoadX(x, r * a.x_stride + c);
    }
  }
#pragma unroll
  for (int r = 0; r < kGemvMaxRows; ++r) {
    if (r >= m) break;
    const float v = WarpSum(acc[r]);
    if (lane == 0) {
      StoreAct(a.y, r * a.y_stride + j, v + (a.bias != nullptr ? a.bias[j] : 0.0f), y_bf16);
    }
  }
}

const char* QuantGemv(const cpu::MatmulArgs& a, cudaStream_t stream) {
  const int64_t row_bytes = DTypeRowBytes(a.w_dtype, a.k);
  const bool x_bf16 = a.x_dtype == DType::kBF16;
  const bool y_bf16 = a.y_dtype == DType::kBF16;
  // Four-element reads of x (float4, or 8 bytes of bf16) need aligned rows and base.
  const int64_t x4_bytes = x_bf16 ? 8 : 16;
  const bool x_vec4 = reinterpret_cast<uintptr_t>(a.x) % x4_bytes == 0 && a.x_stride % 4 == 0;
  const unsigned blocks = static_cast<unsigned>(CeilDiv(a.n, kGemvWarps));
  cudaError_t err = cudaSuccess;
  auto launch = [&](auto format) {
    constexpr DType W = decltype(format)::value;
    if (x_bf16) {
      err = LaunchWithSharedMemory<QuantGemvKernel<W, uint16_t>>(blocks, kGemvWarps * kWarp, 0, stream,
                                                           a, a.w_dtype, row_bytes, x_vec4, y_bf16);
    } else {
      err = LaunchWithSharedMemory<QuantGemvKernel<W, float>>(blocks, kGemvWarps * kWarp, 0, stream, a,
                                                        a.w_dtype, row_bytes, x_vec4, y_bf16);
    }
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
  return err == cudaSuccess ? nullptr : "quantized GEMV launch failed";
}

// Weight rows per slab when quantized weights meet more than kGemvMaxRows x rows.
int64_t SlabRows(const cpu::MatmulArgs& a) {
  return std::clamp<int64_t>(kSlabBytes / (2 * std::max<int64_t>(a.k, 1)), 64, a.n);
}

int64_t Aligned(int64_t bytes) { return (bytes + 255) / 256 * 256; }

int64_t ElemBytes(DType t) { return t == DType::kF32 ? 4 : 2; }

cudaDataType_t CudaType(DType t) {
  return t == DType::kF32 ? CUDA_R_32F : (t == DType::kBF16 ? CUDA_R_16BF : CUDA_R_16F);
}

// How Matmul runs a call. cublasGemmEx takes x in the weights' type (bf16 for dequantized
// slabs) and writes a bf16 y only from bf16 inputs; a bias must be in before a bf16 y is
// rounded. What the GEMM cannot take or give directly goes through the scratch and ConvertRows.
struct GemmPlan {
  bool gemv = false;        // quantized weights at m <= kGemvMaxRows: QuantGemv does it all
  DType in = DType::kF32;   // the GEMM's input type
  bool convert_x = false;   // x is not in `in`: converted into the scratch first
  bool stage_y = false;     // the GEMM writes f32 into the scratch; bias + rounding then into y
  bool bias_after = false;  // the bias is added in place to an f32 y after the GEMM
  int64_t n_part = 0;       // weight rows per GEMM (a slab for quantized weights, else n)
};

GemmPlan PlanGemm(const cpu::MatmulArgs& a) {
  GemmPlan p;
  const bool quantized = DTypeIsQuantized(a.w_dtype);
  if (quantized && a.m <= kGemvMaxRows) {
    p.gemv = true;
    return p;
  }
  p.in = quantized ? DType::kBF16 : a.w_dtype;
  p.convert_x = a.x_dtype != p.in;
  p.n_part = quantized ? SlabRows(a) : a.n;
  p.stage_y = a.y_dtype != DType::kF32 && (p.in != DType::kBF16 || a.bias != nullptr);
  p.bias_after = a.bias != nullptr && !p.stage_y;
  return p;
}

// Launches ConvertRows (counted in g_conversions).
const char* Convert(const void* src, DType src_type, int64_t src_stride, const float* bias,
                    void* dst, DType dst_type, int64_t dst_stride, int64_t m, int64_t n,
                    cudaStream_t stream) {
  g_conversions.fetch_add(1, std::memory_order_relaxed);
  KVSERVE_LAUNCH(ConvertRows, Blocks(m * n), 256, 0, stream, src, src_type, src_stride, bias, dst,
                 dst_type, dst_stride, m, n);
  return cudaGetLastError() == cudaSuccess ? nullptr : "activation conversion launch failed";
}

// ---- FP8 E4M3 weights ---------------------------------------------------------------------------

// Largest f32 staging of an FP8 GEMM's result (rows of it per cuBLASLt call).
constexpr int64_t kFp8StageBytes = int64_t{8} << 20;

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// The alignment cuBLASLt may assume of an operand: the largest power of two up to 256 dividing
// its address (cuBLASLt's heuristics assume 256 unless told).
uint32_t AlignmentOf(const void* p) {
  const auto at = reinterpret_cast<uintptr_t>(p);
  return at % 256 == 0 ? 256u : static_cast<uint32_t>(at & (~at + 1));
}

// How Matmul runs an FP8 call (MatmulScratchBytes sizes the same plan).
struct Fp8Plan {
  bool gemv = false;       // Fp8Gemv in kFp8GemvMaxRows-row chunks
  bool scaled = false;     // cuBLASLt applies the row scales (outer-vector scaling)
  bool stage = false;      // cuBLASLt writes f32 into the scratch; Fp8ScaleRows stores y
  int64_t xq_stride = 0;   // bytes between the quantized x rows
  int64_t stage_rows = 0;  // x rows per staged GEMM
};

Fp8Plan PlanFp8(const cpu::MatmulArgs& a, const BlasHandles& blas) {
  Fp8Plan p;
  p.xq_stride = (a.k + 15) / 16 * 16;
  // cuBLASLt's FP8 GEMMs take the TN layout with 16-byte aligned operands and k % 16 == 0.
  if (a.m <= kFp8GemvMaxRows || blas.lt == nullptr || a.k % 16 != 0 || !Aligned16(a.w)) {
    p.gemv = true;
    return p;
  }
  p.scaled = blas.fp8_outer_vector;
  const int64_t y_bytes = a.y_dtype == DType::kF32 ? 4 : 2;
  const bool y_aligned = Aligned16(a.y) && (a.y_stride * y_bytes) % 16 == 0;
  p.stage = !p.scaled || a.bias != nullptr || !y_aligned;
  // Chunks of a multiple of 16 rows keep every chunk's x rows 256-byte and scales 64-byte aligned.
  if (p.stage) {
    p.stage_rows = std::min(a.m, std::max<int64_t>(16, kFp8StageBytes / (4 * a.n) / 16 * 16));
  }
  return p;
}

// Scratch of an FP8 call: the quantized rows, their scales, the staged result.
struct Fp8Scratch {
  uint8_t* xq;
  float* xs;
  float* stage;
};

Fp8Scratch Fp8ScratchAt(const cpu::MatmulArgs& a, const Fp8Plan& p, void* scratch) {
  auto* at = static_cast<uint8_t*>(scratch);
  Fp8Scratch s;
  s.xq = at;
  at += Aligned(a.m * p.xq_stride);
  s.xs = reinterpret_cast<float*>(at);
  at += Aligned(a.m * 4);
  s.stage = p.stage ? reinterpret_cast<float*>(at) : nullptr;
  return s;
}

size_t Fp8ScratchBytes(const cpu::MatmulArgs& a, const Fp8Plan& p) {
  return static_cast<size_t>(Aligned(a.m * p.xq_stride) + Aligned(a.m * 4) +
                             (p.stage ? Aligned(p.stage_rows * a.n * 4) : 0));
}

// The algorithm cuBLASLt's heuristic picks for an FP8 problem, asked once per shape, operand
// alignments and device.
struct Fp8Algo {
  bool found = false;
  cublasLtMatmulAlgo_t algo;
};

// One FP8 GEMM on cuBLASLt, column-major as cuBLAS sees our row-major operands: D [n, rows] =
// W [n, k] (A: k x n, transposed) times xq^T (B: k x rows, ld xq_stride), f32 accumulation; with
// `scaled`, D[j, r] is also multiplied by w_scale[j] * xs[r] (outer-vector scales). With
// `query_only` it only asks whether an algorithm exists. NOT_SUPPORTED when none does.
cublasStatus_t LtFp8Gemm(const BlasHandles& blas, const uint8_t* w, const float* w_scale, int64_t n,
                         const uint8_t* xq, int64_t xq_stride, const float* xs, int64_t rows,
                         int64_t k, void* d, cudaDataType_t d_type, int64_t ldd, bool scaled,
                         cudaStream_t stream, bool query_only = false) {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a_layout = nullptr, b_layout = nullptr, d_layout = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
  auto step = [&st](cublasStatus_t s) {
    if (st == CUBLAS_STATUS_SUCCESS) st = s;
  };
  step(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const int32_t op_t = CUBLAS_OP_T;
  const int32_t op_n = CUBLAS_OP_N;
  if (st == CUBLAS_STATUS_SUCCESS) {
    step(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_t, sizeof(op_t)));
    step(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_n, sizeof(op_n)));
    if (scaled) {
      const int32_t mode = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
      step(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode,
                                          sizeof(mode)));
      step(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode,
                                          sizeof(mode)));
      step(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &w_scale,
                                          sizeof(w_scale)));
      step(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &xs,
                                          sizeof(xs)));
    }
  }
  step(cublasLtMatrixLayoutCreate(&a_layout, CUDA_R_8F_E4M3, static_cast<uint64_t>(k),
                                  static_cast<uint64_t>(n), k));
  step(cublasLtMatrixLayoutCreate(&b_layout, CUDA_R_8F_E4M3, static_cast<uint64_t>(k),
                                  static_cast<uint64_t>(rows), xq_stride));
  step(cublasLtMatrixLayoutCreate(&d_layout, d_type, static_cast<uint64_t>(n),
                                  static_cast<uint64_t>(rows), ldd));
  step(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t workspace_bytes = blas.workspace_bytes;
  // The operands' real alignments, so the algorithm chosen can take them (x rows of a chunk and
  // a y inside a larger buffer may be 16-byte aligned only).
  const uint32_t align_a = AlignmentOf(w), align_b = AlignmentOf(xq), align_d = AlignmentOf(d);
  if (st == CUBLAS_STATUS_SUCCESS) {
    step(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                              &workspace_bytes, sizeof(workspace_bytes)));
    step(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                              &align_a, sizeof(align_a)));
    step(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                              &align_b, sizeof(align_b)));
    step(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                              &align_d, sizeof(align_d)));
    step(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                              &align_d, sizeof(align_d)));
  }
  Fp8Algo found;
  auto ask = [&] {
    cublasLtMatmulHeuristicResult_t result{};
    int count = 0;
    const cublasStatus_t h = cublasLtMatmulAlgoGetHeuristic(
        blas.lt, desc, a_layout, b_layout, d_layout, d_layout, pref, 1, &result, &count);
    Fp8Algo entry;
    entry.found = h == CUBLAS_STATUS_SUCCESS && count > 0 && result.state == CUBLAS_STATUS_SUCCESS;
    if (entry.found) entry.algo = result.algo;
    return entry;
  };
  if (st == CUBLAS_STATUS_SUCCESS && query_only) {
    found = ask();  // a backend's one question, not cached
  } else if (st == CUBLAS_STATUS_SUCCESS) {
    // Heuristics cost host time: one query per problem shape and device.
    static std::mutex mu;
    static std::map<
        std::tuple<int, int64_t, int64_t, int64_t, int, bool, uint32_t, uint32_t, uint32_t>,
        Fp8Algo>
        cache;
    int device = 0;
    cudaGetDevice(&device);
    const auto key = std::make_tuple(device, n, rows, k, static_cast<int>(d_type), scaled, align_a,
                                     align_b, align_d);
    std::lock_guard<std::mutex> lock(mu);
    auto it = cache.find(key);
    if (it == cache.end()) it = cache.emplace(key, ask()).first;
    found = it->second;
  }
  if (st == CUBLAS_STATUS_SUCCESS && !found.found) st = CUBLAS_STATUS_NOT_SUPPORTED;
  if (st == CUBLAS_STATUS_SUCCESS && !query_only) {
    const float one = 1.0f;
    const float zero = 0.0f;
    st = cublasLtMatmul(blas.lt, desc, &one, w, a_layout, xq, b_layout, &zero, d, d_layout, d,
                        d_layout, &found.algo, blas.workspace, blas.workspace_bytes, stream);
  }
  if (pref != nullptr) cublasLtMatmulPreferenceDestroy(pref);
  if (d_layout != nullptr) cublasLtMatrixLayoutDestroy(d_layout);
  if (b_layout != nullptr) cublasLtMatrixLayoutDestroy(b_layout);
  if (a_layout != nullptr) cublasLtMatrixLayoutDestroy(a_layout);
  if (desc != nullptr) cublasLtMatmulDescDestroy(desc);
  return st;
}

// Fp8Gemv over x rows [r0, m) in chunks of kFp8GemvMaxRows.
const char* Fp8GemvRows(const cpu::MatmulArgs& a, const Fp8Scratch& s, int64_t xq_stride,
                        int64_t r0, cudaStream_t stream) {
  const int64_t y_bytes = a.y_dtype == DType::kF32 ? 4 : 2;
  for (; r0 < a.m; r0 += kFp8GemvMaxRows) {
    cpu::MatmulArgs chunk = a;
    chunk.m = std::min<int64_t>(kFp8GemvMaxRows, a.m - r0);
    chunk.y = reinterpret_cast<float*>(reinterpret_cast<uint8_t*>(a.y) + r0 * a.y_stride * y_bytes);
    if (Fp8Gemv(chunk, s.xq + r0 * xq_stride, xq_stride, s.xs + r0, stream) != cudaSuccess) {
      return "FP8 GEMV launch failed";
    }
  }
  return nullptr;
}

const char* Fp8Matmul(const cpu::MatmulArgs& a, const BlasHandles& blas, void* scratch,
                      cudaStream_t stream) {
  if (a.w_scale == nullptr) return "FP8 weights without their row scales (MatmulArgs::w_scale)";
  const Fp8Plan p = PlanFp8(a, blas);
  const Fp8Scratch s = Fp8ScratchAt(a, p, scratch);
  if (QuantizeRowsFp8(a.x, a.x_dtype, a.x_stride, a.m, a.k, s.xq, p.xq_stride, s.xs, stream) !=
      cudaSuccess) {
    return "FP8 activation quantization launch failed";
  }
  if (p.gemv) return Fp8GemvRows(a, s, p.xq_stride, 0, stream);
  const auto* w = static_cast<const uint8_t*>(a.w);
  if (!p.stage) {
    const cublasStatus_t st =
        LtFp8Gemm(blas, w, a.w_scale, a.n, s.xq, p.xq_stride, s.xs, a.m, a.k, a.y,
                  CudaType(a.y_dtype), a.y_stride, /*scaled=*/true, stream);
    if (st == CUBLAS_STATUS_NOT_SUPPORTED) return Fp8GemvRows(a, s, p.xq_stride, 0, stream);
    return st == CUBLAS_STATUS_SUCCESS ? nullptr : cublasGetStatusString(st);
  }
  const int64_t y_bytes = a.y_dtype == DType::kF32 ? 4 : 2;
  for (int64_t r0 = 0; r0 < a.m; r0 += p.stage_rows) {
    const int64_t rows = std::min(p.stage_rows, a.m - r0);
    const cublasStatus_t st =
        LtFp8Gemm(blas, w, a.w_scale, a.n, s.xq + r0 * p.xq_stride, p.xq_stride, s.xs + r0, rows,
                  a.k, s.stage, CUDA_R_32F, a.n, p.scaled, stream);
    if (st == CUBLAS_STATUS_NOT_SUPPORTED) return Fp8GemvRows(a, s, p.xq_stride, r0, stream);
    if (st != CUBLAS_STATUS_SUCCESS) return cublasGetStatusString(st);
    g_conversions.fetch_add(1, std::memory_order_relaxed);
    if (Fp8ScaleRows(s.stage, a.n, p.scaled ? nullptr : s.xs + r0, p.scaled ? nullptr : a.w_scale,
                     a.bias, reinterpret_cast<uint8_t*>(a.y) + r0 * a.y_stride * y_bytes, a.y_dtype,
                     a.y_stride, rows, a.n, stream) != cudaSuccess) {
      return "FP8 result scaling launch failed";
    }
  }
  return nullptr;
}

}  // namespace

bool Fp8OuterVectorScaling(const BlasHandles& blas) {
  if (blas.lt == nullptr) return false;
  // Stand-in operand pointers: a query reads none of them.
  const auto* p = static_cast<const uint8_t*>(blas.workspace);
  return LtFp8Gemm(blas, p, reinterpret_cast<const float*>(p), 64, p, 64,
                   reinterpret_cast<const float*>(p), 64, 64, blas.workspace, CUDA_R_16BF, 64,
                   /*scaled=*/true, nullptr, /*query_only=*/true) == CUBLAS_STATUS_SUCCESS;
}

size_t MatmulScratchBytes(const cpu::MatmulArgs& a, const BlasHandles& blas) {
  if (a.w_dtype == DType::kF8E4M3) return Fp8ScratchBytes(a, PlanFp8(a, blas));
  const GemmPlan p = PlanGemm(a);
  if (p.gemv) return 0;
  int64_t bytes = 0;
  if (p.convert_x) bytes += Aligned(a.m * a.k * ElemBytes(p.in));
  if (DTypeIsQuantized(a.w_dtype)) bytes += Aligned(p.n_part * a.k * 2);
  if (p.stage_y) bytes += Aligned(a.m * p.n_part * 4);
  return static_cast<size_t>(bytes);
}

int64_t ActivationConversions() { return g_conversions.load(std::memory_order_relaxed); }

const char* Matmul(const cpu::MatmulArgs& a, const BlasHandles& blas, void* scratch,
                   cudaStream_t stream) {
  if (a.m <= 0 || a.n <= 0) return nullptr;
  if (a.w_dtype == DType::kF8E4M3) return Fp8Matmul(a, blas, scratch, stream);
  cublasHandle_t handle = blas.blas;
  const GemmPlan p = PlanGemm(a);
  if (p.gemv) return QuantGemv(a, stream);
  const float alpha = 1.0f;
  const float beta = 0.0f;
  const bool quantized = DTypeIsQuantized(a.w_dtype);
  auto* next = static_cast<uint8_t*>(scratch);
  // Row-major y[m, n] is column-major y^T [n, m] = W [n, k] (column-major W^T, ld k, transposed)
  // times x^T [k, m] (column-major, ld x_stride).
  const void* x = a.x;
  int64_t ldx = a.x_stride;
  if (p.convert_x) {
    if (const char* e = Convert(a.x, a.x_dtype, a.x_stride, nullptr, next, p.in, a.k, a.m, a.k,
                                stream)) {
      return e;
    }
    x = next;
    ldx = a.k;
    next += Aligned(a.m * a.k * ElemBytes(p.in));
  }
  // Quantized weights: each slab of weight rows dequantized to bf16 here and multiplied (the
  // packed weights stay the only copy in memory).
  uint8_t* slab = nullptr;
  if (quantized) {
    slab = next;
    next += Aligned(p.n_part * a.k * 2);
  }
  float* staged = p.stage_y ? reinterpret_cast<float*>(next) : nullptr;  // [m, rows] f32
  const int64_t row_bytes = DTypeRowBytes(a.w_dtype, a.k);
  auto* y = reinterpret_cast<uint8_t*>(a.y);
  for (int64_t r0 = 0; r0 < a.n; r0 += p.n_part) {
    const int64_t rows = std::min(p.n_part, a.n - r0);
    const void* w = a.w;
    if (quantized) {
      if (ConvertWeights(static_cast<const uint8_t*>(a.w) + r0 * row_bytes, a.w_dtype, rows, a.k,
                         DType::kBF16, slab, stream) != cudaSuccess) {
        return "weight slab conversion launch failed";
      }
      w = slab;
    }
    void* c = p.stage_y ? static_cast<void*>(staged) : y + r0 * ElemBytes(a.y_dtype);
    const cudaDataType_t c_type = p.stage_y ? CUDA_R_32F : CudaType(a.y_dtype);
    const int64_t ldc = p.stage_y ? rows : a.y_stride;
    const cublasStatus_t st =
        cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(rows),
                     static_cast<int>(a.m), static_cast<int>(a.k), &alpha, w, CudaType(p.in),
                     static_cast<int>(a.k), x, CudaType(p.in), static_cast<int>(ldx), &beta, c,
                     c_type, static_cast<int>(ldc), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (st != CUBLAS_STATUS_SUCCESS) return cublasGetStatusString(st);
    if (p.stage_y) {
      if (const char* e = Convert(staged, DType::kF32, rows,
                                  a.bias != nullptr ? a.bias + r0 : nullptr,
                                  y + r0 * ElemBytes(a.y_dtype), a.y_dtype, a.y_stride, a.m, rows,
                                  stream)) {
        return e;
      }
    }
  }
  if (p.bias_after) {
    return Convert(a.y, DType::kF32, a.y_stride, a.bias, a.y, DType::kF32, a.y_stride, a.m, a.n,
                   stream);
  }
  return nullptr;
}

}  // namespace kvserve::cuda
