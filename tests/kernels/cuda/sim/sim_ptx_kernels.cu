#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/ptx.cuh"
#include "tests/kernels/cuda/sim/sim_ptx_kernels.h"

namespace kvserve::simtest {
namespace {

using cuda::LdMatrixX4;
using cuda::LdMatrixX4Trans;

// Elements (r, c0) and (r, c0 + 1) of a row-major matrix with `cols` columns, c0 in the low half.
__device__ uint32_t RowPair(const uint16_t* m, int cols, int r, int c0) {
  return static_cast<uint32_t>(m[r * cols + c0]) |
         (static_cast<uint32_t>(m[r * cols + c0 + 1]) << 16);
}

// Elements (r0, c) and (r0 + 1, c), r0 in the low half.
__device__ uint32_t ColPair(const uint16_t* m, int cols, int r0, int c) {
  return static_cast<uint32_t>(m[r0 * cols + c]) |
         (static_cast<uint32_t>(m[(r0 + 1) * cols + c]) << 16);
}

__global__ void MmaKernel(const uint16_t* a, const uint16_t* b, const float* c, float* d,
                          bool f16) {
  const int g = threadIdx.x / 4;
  const int t = threadIdx.x % 4;
  const uint32_t fa[4] = {RowPair(a, 16, g, 2 * t), RowPair(a, 16, g + 8, 2 * t),
                          RowPair(a, 16, g, 2 * t + 8), RowPair(a, 16, g + 8, 2 * t + 8)};
  const uint32_t b0 = ColPair(b, 8, 2 * t, g);
  const uint32_t b1 = ColPair(b, 8, 2 * t + 8, g);
  float acc[4] = {c[g * 8 + 2 * t], c[g * 8 + 2 * t + 1], c[(g + 8) * 8 + 2 * t],
                  c[(g + 8) * 8 + 2 * t + 1]};
  if (f16) {
    cuda::Mma<cuda::MmaType::kF16>(acc, fa, b0, b1);
  } else {
    cuda::Mma<cuda::MmaType::kBf16>(acc, fa, b0, b1);
  }
  d[g * 8 + 2 * t] = acc[0];
  d[g * 8 + 2 * t + 1] = acc[1];
  d[(g + 8) * 8 + 2 * t] = acc[2];
  d[(g + 8) * 8 + 2 * t + 1] = acc[3];
}

__global__ void LdMatrixKernel(const uint16_t* src, uint32_t* out, bool trans) {
  // Row r of matrix i at shared row 8 i + 7 - r; 16 elements a row, the last 8 never read.
  __align__(16) __shared__ uint16_t tile[32 * 16];
  const int lane = threadIdx.x;
  for (int e = lane; e < 32 * 16; e += 32) {
    const int row = e / 16;
    const int col = e % 16;
    const int i = row / 8;
    const int r = 7 - row % 8;
    tile[e] = col < 8 ? src[i * 64 + r * 8 + col] : static_cast<uint16_t>(0xdead);
  }
  __syncthreads();
  const uint16_t* row = tile + (8 * (lane / 8) + 7 - lane % 8) * 16;
  uint32_t r[4];
  if (trans) {
    LdMatrixX4Trans(r, row);
  } else {
    LdMatrixX4(r, row);
  }
  for (int i = 0; i < 4; ++i) out[lane * 4 + i] = r[i];
}

__global__ void LdMatrixMmaKernel(const uint16_t* a, const uint16_t* kt, const uint16_t* v,
                                  float* d_kt, float* d_v) {
  constexpr int kS = 24;  // padded row stride (elements), as the prefill kernel pads its tiles
  __align__(16) __shared__ uint16_t as[16 * kS];
  __align__(16) __shared__ uint16_t kts[16 * kS];
  __align__(16) __shared__ uint16_t vs[16 * kS];
  const int lane = threadIdx.x;
  for (int e = lane; e < 256; e += 32) {
    as[e / 16 * kS + e % 16] = a[e];
    kts[e / 16 * kS + e % 16] = kt[e];
    vs[e / 16 * kS + e % 16] = v[e];
  }
  __syncthreads();
  uint32_t fa[4];
  LdMatrixX4(fa, as + (lane % 16) * kS + lane / 16 * 8);
  uint32_t kb[4];
  LdMatrixX4(kb, kts + (lane / 16 * 8 + lane % 8) * kS + lane / 8 % 2 * 8);
  uint32_t vb[4];
  LdMatrixX4Trans(vb, vs + (lane / 8 % 2 * 8 + lane % 8) * kS + lane / 16 * 8);
  float acc[4][4] = {};
  cuda::Mma<cuda::MmaType::kBf16>(acc[0], fa, kb[0], kb[1]);
  cuda::Mma<cuda::MmaType::kBf16>(acc[1], fa, kb[2], kb[3]);
  cuda::Mma<cuda::MmaType::kBf16>(acc[2], fa, vb[0], vb[1]);
  cuda::Mma<cuda::MmaType::kBf16>(acc[3], fa, vb[2], vb[3]);
  const int g = lane / 4;
  const int t = lane % 4;
  for (int n = 0; n < 2; ++n) {
    for (int e = 0; e < 4; ++e) {
      const int idx = (g + 8 * (e / 2)) * 16 + 8 * n + 2 * t + e % 2;
      d_kt[idx] = acc[n][e];
      d_v[idx] = acc[2 + n][e];
    }
  }
}

__global__ void Fp8x2ToHalf2Kernel(const uint16_t* codes, uint32_t* out, int n) {
  for (int i = threadIdx.x; i < n; i += blockDim.x) out[i] = cuda::Fp8x2ToHalf2Bits(codes[i]);
}

}  // namespace

cudaError_t LaunchFp8x2ToHalf2(const uint16_t* codes, uint32_t* out, int n) {
  KVSERVE_LAUNCH(Fp8x2ToHalf2Kernel, 1, 256, 0, nullptr, codes, out, n);
  return cudaGetLastError();
}

cudaError_t LaunchMma(const uint16_t* a, const uint16_t* b, const float* c, float* d, bool f16) {
  KVSERVE_LAUNCH(MmaKernel, 1, 32, 0, nullptr, a, b, c, d, f16);
  return cudaGetLastError();
}

cudaError_t LaunchLdMatrix(const uint16_t* src, uint32_t* out, bool trans) {
  KVSERVE_LAUNCH(LdMatrixKernel, 1, 32, 0, nullptr, src, out, trans);
  return cudaGetLastError();
}

cudaError_t LaunchLdMatrixMma(const uint16_t* a, const uint16_t* kt, const uint16_t* v, float* d_kt,
                              float* d_v) {
  KVSERVE_LAUNCH(LdMatrixMmaKernel, 1, 32, 0, nullptr, a, kt, v, d_kt, d_v);
  return cudaGetLastError();
}

}  // namespace kvserve::simtest
