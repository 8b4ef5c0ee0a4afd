#ifndef KVSERVE_KERNELS_CUDA_PTX_CUH_
#define KVSERVE_KERNELS_CUDA_PTX_CUH_

// The one place kvserve's kernels use inline PTX. Each function here has two bodies: the PTX
// nvcc compiles, and the simulator's twin (KVSERVE_CUDA_SIM, kernels/cuda/sim), which follows
// the PTX ISA's semantics closely enough that a kernel wrong on the GPU is wrong in CI too:
//
//   - cp.async: the twin performs each copy at the latest moment the program may rely on it (the
//     cp.async.wait_group that covers it), so a kernel that reads its shared-memory tile before
//     waiting reads stale bytes and fails its test; the copy's shared-memory write enters the race
//     check at that moment, so a missing __syncthreads after the wait is reported too.
//
// Kernels include this header and never write asm() themselves.

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/cuda_common.cuh"

namespace kvserve::cuda {

// ---- Asynchronous global -> shared copies (cp.async, sm_80+) ----------------------------------

/// Copies 16 bytes from global `src` to shared `dst` (both 16-byte aligned) asynchronously,
/// bypassing L1 (cp.async.cg). With `valid` false, writes 16 zero bytes and reads nothing (the
/// src-size 0 form), so out-of-range rows of a tile need no branch around the copy.
__device__ __forceinline__ void CpAsync16(void* dst, const void* src, bool valid = true) {
#ifdef KVSERVE_CUDA_SIM
  ::kvsim::AsyncCopy(dst, src, 16, valid ? 16 : 0);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src),
               "r"(valid ? 16 : 0)
               : "memory");
#else
  if (valid) {
    *static_cast<uint4*>(dst) = *static_cast<const uint4*>(src);
  } else {
    *static_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
  }
#endif
}

/// Closes the group of this thread's cp.async copies issued since the last commit.
__device__ __forceinline__ void CpAsyncCommit() {
#ifdef KVSERVE_CUDA_SIM
  ::kvsim::AsyncCommit();
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

/// Waits until at most `N` of this thread's committed groups are still in flight. Other threads'
/// copies become visible only after a __syncthreads that follows their own wait.
template <int N>
__device__ __forceinline__ void CpAsyncWait() {
#ifdef KVSERVE_CUDA_SIM
  ::kvsim::AsyncWait(N);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

// ---- Conversions --------------------------------------------------------------------------------

/// Two OCP FP8 E4M3 codes (low byte first) -> two floats, with sm_89+'s cvt.rn.f16x2.e4m3x2 (every
/// e4m3 value is exact in f16). Elsewhere, and in the simulator, the same values in software.
__device__ __forceinline__ float2 Fp8x2ToFloat2(uint16_t codes) {
#if !defined(KVSERVE_CUDA_SIM) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  uint32_t h2;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(h2) : "h"(codes));
  return make_float2(__half2float(__ushort_as_half(static_cast<unsigned short>(h2 & 0xffffu))),
                     __half2float(__ushort_as_half(static_cast<unsigned short>(h2 >> 16))));
#else
  return make_float2(Fp8ToFloat(static_cast<uint8_t>(codes & 0xffu)),
                     Fp8ToFloat(static_cast<uint8_t>(codes >> 8)));
#endif
}

}  // namespace kvserve::cuda

#endif  // KVSERVE_KERNELS_CUDA_PTX_CUH_
