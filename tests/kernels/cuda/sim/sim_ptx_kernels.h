#ifndef KVSERVE_TESTS_KERNELS_CUDA_SIM_SIM_PTX_KERNELS_H_
#define KVSERVE_TESTS_KERNELS_CUDA_SIM_SIM_PTX_KERNELS_H_

// One-warp kernels over the tensor-core functions of kernels/cuda/ptx.cuh (sim_ptx_kernels.cu),
// for checking the simulator's twins against the PTX ISA's fragment layouts. Matrices are b16
// bit patterns (bf16 or f16), row-major. Each returns cudaGetLastError() after its launch.

#include <cuda_runtime.h>

#include <cstdint>

namespace kvserve::simtest {

/// d (16 x 8 f32) = a (16 x 16) b (16 x 8, [k][n]) + c (16 x 8 f32) through one MmaBf16 (or
/// MmaF16 with `f16`), each lane building its fragments from global memory by the ISA's layout.
cudaError_t LaunchMma(const uint16_t* a, const uint16_t* b, const float* c, float* d, bool f16);

/// Four 8 x 8 matrices src[i] (src + 64 i, row-major) copied to shared memory with their rows in
/// reverse order, then LdMatrixX4 (LdMatrixX4Trans with `trans`), each lane giving the address
/// of row lane % 8 of matrix lane / 8; out[4 lane + i] = the lane's register i.
cudaError_t LaunchLdMatrix(const uint16_t* src, uint32_t* out, bool trans);

/// As the prefill kernel uses them, from padded shared tiles: d_kt (16 x 16) = a (16 x 16) kt^T
/// with kt [n][k] read by LdMatrixX4 (S = Q K^T), and d_v (16 x 16) = a v with v [k][n] read by
/// LdMatrixX4Trans (O = P V); bf16.
cudaError_t LaunchLdMatrixMma(const uint16_t* a, const uint16_t* kt, const uint16_t* v, float* d_kt,
                              float* d_v);

/// out[i] = Fp8x2ToHalf2Bits(codes[i]) for i < n (one block of 256 threads).
cudaError_t LaunchFp8x2ToHalf2(const uint16_t* codes, uint32_t* out, int n);

}  // namespace kvserve::simtest

#endif  // KVSERVE_TESTS_KERNELS_CUDA_SIM_SIM_PTX_KERNELS_H_
