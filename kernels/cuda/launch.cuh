#ifndef KVSERVE_KERNELS_CUDA_LAUNCH_CUH_
#define KVSERVE_KERNELS_CUDA_LAUNCH_CUH_

// The one way kvserve's CUDA code launches kernels and declares dynamic shared memory, so that
// the same sources run under nvcc and under the CUDA simulator (kernels/cuda/sim): there the
// launch goes to the simulator's executor, and dynamic shared memory is the block's buffer of
// exactly the requested size. Inline PTX, with its simulator twins, is in kernels/cuda/ptx.cuh.
//
//   KVSERVE_LAUNCH(kernel, grid, block, shared_bytes, stream, args...);
//   KVSERVE_DYNAMIC_SHARED(float, smem);  // in a kernel: float* smem (extern __shared__ float[])

#include <cuda_runtime.h>

#include <cstddef>
#include <utility>

#ifdef KVSERVE_CUDA_SIM
#define KVSERVE_LAUNCH(kernel, grid, block, shared_bytes, stream, ...) \
  ::kvsim::Launch<kernel>(grid, block, shared_bytes, stream __VA_OPT__(, ) __VA_ARGS__)
#define KVSERVE_DYNAMIC_SHARED(type, name) type* name = static_cast<type*>(::kvsim::DynamicShared())
#else
#define KVSERVE_LAUNCH(kernel, grid, block, shared_bytes, stream, ...) \
  kernel<<<grid, block, shared_bytes, stream>>>(__VA_ARGS__)
#define KVSERVE_DYNAMIC_SHARED(type, name) extern __shared__ type name[]
#endif

namespace kvserve::cuda {

/// Launches kKernel with `shared_bytes` of dynamic shared memory, first raising the kernel's
/// limit when it asks for more than the default 48 KiB (up to the device's, 227 KiB on sm_90).
/// Returns the launch's error.
template <auto kKernel, typename... A>
cudaError_t LaunchWithSharedMemory(dim3 grid, dim3 block, size_t shared_bytes,
                                   cudaStream_t stream, A&&... args) {
  if (shared_bytes > 48 * 1024) {
    const cudaError_t err = cudaFuncSetAttribute(
        kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared_bytes));
    if (err != cudaSuccess) return err;
  }
  KVSERVE_LAUNCH(kKernel, grid, block, shared_bytes, stream, std::forward<A>(args)...);
  return cudaGetLastError();
}

}  // namespace kvserve::cuda

#endif  // KVSERVE_KERNELS_CUDA_LAUNCH_CUH_
