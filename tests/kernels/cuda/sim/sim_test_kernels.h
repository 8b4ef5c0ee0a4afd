#ifndef KVSERVE_TESTS_KERNELS_CUDA_SIM_SIM_TEST_KERNELS_H_
#define KVSERVE_TESTS_KERNELS_CUDA_SIM_SIM_TEST_KERNELS_H_

// Small kernels that exercise the CUDA simulator (sim_test_kernels.cu): correct ones, and ones
// with the bugs the simulator must catch. Each returns cudaGetLastError() after its launch.

#include <cuda_runtime.h>

#include <cstdint>

namespace kvserve::simtest {

/// out[global linear thread] = (block linear id << 16) | thread linear id, over a 3-D launch.
cudaError_t LaunchIndices(dim3 grid, dim3 block, uint32_t* out, cudaStream_t stream);
/// out[b] = sum of in[b * n .. b * n + n) through dynamic shared memory and barriers;
/// counts[b] = __syncthreads_count(in > 0) of the first n values.
cudaError_t LaunchBlockSum(const float* in, int n, int blocks, float* out, int* counts);
/// Per warp of 64 threads: shfl_xor sum, shfl_up/down/idx and ballot results per lane.
cudaError_t LaunchWarpOps(const int* in, int* xor_sum, int* up, int* down, int* idx,
                          unsigned* ballot, int* any, int* all);
/// y[i] = x[i] * 2 + 1 (for graph capture tests).
cudaError_t LaunchAffine(const float* x, float* y, int n, cudaStream_t stream);

// Bugs.
/// Half of a block waits at one __syncthreads, the other half at another.
cudaError_t LaunchDivergentBarrier();
/// Lanes 0-15 shuffle with a full mask while lanes 16-31 wait at a barrier.
cudaError_t LaunchShuffleDeadlock();
/// A 16-thread block shuffles with mask 0xffffffff.
cudaError_t LaunchMaskBeyondBlock();
/// Lanes 16-31 return; lanes 0-15 then shuffle with a full mask.
cudaError_t LaunchMaskExitedLanes();
/// Writes one float past the dynamic shared memory the launch requested.
cudaError_t LaunchSharedOverrun();
/// Each thread writes smem[tid] and reads smem[tid + 1]; `with_barrier` puts a
/// __syncthreads between (correct) or not (a race).
cudaError_t LaunchNeighbourRead(bool with_barrier, float* out);
/// The same race on a static __shared__ array.
cudaError_t LaunchStaticNeighbourRead(float* out);
/// Lanes of one warp pass values through shared memory ordered only by __syncwarp (correct).
cudaError_t LaunchWarpSyncedExchange(float* out);
/// Thread 5 reads 2^40 floats past `p`.
cudaError_t LaunchWildRead(const float* p, float* out);
/// An oversized block (2048 threads) or shared-memory request, to check launch validation.
cudaError_t LaunchWithConfig(dim3 block, size_t shared_bytes);
/// Raises the dynamic shared-memory limit of the kernel LaunchWithConfig uses.
cudaError_t AllowSharedBytes(int bytes);

}  // namespace kvserve::simtest

#endif  // KVSERVE_TESTS_KERNELS_CUDA_SIM_SIM_TEST_KERNELS_H_
