#include "kernels/cuda/launch.cuh"
#include "tests/kernels/cuda/sim/sim_test_kernels.h"

namespace kvserve::simtest {
namespace {

__global__ void IndicesKernel(uint32_t* out) {
  const unsigned block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  const unsigned thread = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  const unsigned per_block = blockDim.x * blockDim.y * blockDim.z;
  out[block * per_block + thread] = (block << 16) | thread;
}

__global__ void BlockSumKernel(const float* in, int n, float* out, int* counts) {
  KVSERVE_DYNAMIC_SHARED(float, smem);
  const float* row = in + static_cast<int64_t>(blockIdx.x) * n;
  float v = 0.0f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) v += row[i];
  smem[threadIdx.x] = v;
  const int positive =
      __syncthreads_count(threadIdx.x < static_cast<unsigned>(n) && row[threadIdx.x] > 0);
  for (unsigned half = blockDim.x / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) smem[threadIdx.x] += smem[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    out[blockIdx.x] = smem[0];
    counts[blockIdx.x] = positive;
  }
}

__global__ void WarpOpsKernel(const int* in, int* xor_sum, int* up, int* down, int* idx,
                              unsigned* ballot, int* any, int* all) {
  const int i = threadIdx.x;
  const int v = in[i];
  int s = v;
  for (int o = 16; o > 0; o /= 2) s += __shfl_xor_sync(0xffffffffu, s, o);
  xor_sum[i] = s;
  up[i] = __shfl_up_sync(0xffffffffu, v, 3);
  down[i] = __shfl_down_sync(0xffffffffu, v, 5, 16);
  // A source lane of its own for every lane.
  idx[i] = __shfl_sync(0xffffffffu, v, (7 * i + 3) % 32);
  ballot[i] = __ballot_sync(0xffffffffu, v % 3 == 0);
  any[i] = __any_sync(0xffffffffu, v == 40);
  all[i] = __all_sync(0xffffffffu, v >= 0);
}

__global__ void AffineKernel(const float* x, float* y, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i] * 2.0f + 1.0f;
}

__global__ void DivergentBarrierKernel() {
  if (threadIdx.x < 32) {
    __syncthreads();
  } else {
    __syncthreads();
  }
}

__global__ void ShuffleDeadlockKernel() {
  if (threadIdx.x < 16) {
    (void)__shfl_xor_sync(0xffffffffu, 1, 1);
  } else {
    __syncthreads();
  }
}

__global__ void MaskKernel() { (void)__shfl_xor_sync(0xffffffffu, 1.0f, 1); }

__global__ void MaskExitedKernel() {
  if (threadIdx.x >= 16) return;
  (void)__shfl_xor_sync(0xffffffffu, 1.0f, 1);
}

__global__ void SharedOverrunKernel(int n) {
  KVSERVE_DYNAMIC_SHARED(float, smem);
  smem[threadIdx.x] = 1.0f;
  if (threadIdx.x == 0) smem[n] = 2.0f;  // one past the request
}

__global__ void NeighbourKernel(bool with_barrier, float* out) {
  KVSERVE_DYNAMIC_SHARED(float, smem);
  smem[threadIdx.x] = static_cast<float>(threadIdx.x);
  if (with_barrier) __syncthreads();
  out[threadIdx.x] = smem[(threadIdx.x + 1) % blockDim.x];
}

__global__ void StaticNeighbourKernel(float* out) {
  __shared__ float buf[64];
  buf[threadIdx.x] = static_cast<float>(threadIdx.x);
  out[threadIdx.x] = buf[(threadIdx.x + 1) % 64];
}

__global__ void WarpExchangeKernel(float* out) {
  KVSERVE_DYNAMIC_SHARED(float, smem);
  smem[threadIdx.x] = static_cast<float>(threadIdx.x) * 0.5f;
  __syncwarp();
  out[threadIdx.x] = smem[threadIdx.x ^ 1];
}

__global__ void WildReadKernel(const float* p, float* out) {
  out[threadIdx.x] = p[threadIdx.x == 5 ? (int64_t{1} << 40) : 0];
}

__global__ void ConfigKernel() {}

}  // namespace

cudaError_t LaunchIndices(dim3 grid, dim3 block, uint32_t* out, cudaStream_t stream) {
  KVSERVE_LAUNCH(IndicesKernel, grid, block, 0, stream, out);
  return cudaGetLastError();
}

cudaError_t LaunchBlockSum(const float* in, int n, int blocks, float* out, int* counts) {
  constexpr int kThreads = 64;
  KVSERVE_LAUNCH(BlockSumKernel, blocks, kThreads, sizeof(float) * kThreads, nullptr, in, n, out,
                 counts);
  return cudaGetLastError();
}

cudaError_t LaunchWarpOps(const int* in, int* xor_sum, int* up, int* down, int* idx,
                          unsigned* ballot, int* any, int* all) {
  KVSERVE_LAUNCH(WarpOpsKernel, 1, 64, 0, nullptr, in, xor_sum, up, down, idx, ballot, any, all);
  return cudaGetLastError();
}

cudaError_t LaunchAffine(const float* x, float* y, int n, cudaStream_t stream) {
  KVSERVE_LAUNCH(AffineKernel, (n + 127) / 128, 128, 0, stream, x, y, n);
  return cudaGetLastError();
}

cudaError_t LaunchDivergentBarrier() {
  KVSERVE_LAUNCH(DivergentBarrierKernel, 1, 64, 0, nullptr);
  return cudaGetLastError();
}

cudaError_t LaunchShuffleDeadlock() {
  KVSERVE_LAUNCH(ShuffleDeadlockKernel, 1, 32, 0, nullptr);
  return cudaGetLastError();
}

cudaError_t LaunchMaskBeyondBlock() {
  KVSERVE_LAUNCH(MaskKernel, 1, 16, 0, nullptr);
  return cudaGetLastError();
}

cudaError_t LaunchMaskExitedLanes() {
  KVSERVE_LAUNCH(MaskExitedKernel, 1, 32, 0, nullptr);
  return cudaGetLastError();
}

cudaError_t LaunchSharedOverrun() {
  KVSERVE_LAUNCH(SharedOverrunKernel, 1, 32, sizeof(float) * 32, nullptr, 32);
  return cudaGetLastError();
}

cudaError_t LaunchNeighbourRead(bool with_barrier, float* out) {
  KVSERVE_LAUNCH(NeighbourKernel, 1, 64, sizeof(float) * 64, nullptr, with_barrier, out);
  return cudaGetLastError();
}

cudaError_t LaunchStaticNeighbourRead(float* out) {
  KVSERVE_LAUNCH(StaticNeighbourKernel, 1, 64, 0, nullptr, out);
  return cudaGetLastError();
}

cudaError_t LaunchWarpSyncedExchange(float* out) {
  KVSERVE_LAUNCH(WarpExchangeKernel, 1, 32, sizeof(float) * 32, nullptr, out);
  return cudaGetLastError();
}

cudaError_t LaunchWildRead(const float* p, float* out) {
  KVSERVE_LAUNCH(WildReadKernel, 1, 32, 0, nullptr, p, out);
  return cudaGetLastError();
}

cudaError_t LaunchWithConfig(dim3 block, size_t shared_bytes) {
  KVSERVE_LAUNCH(ConfigKernel, 1, block, shared_bytes, nullptr);
  return cudaGetLastError();
}

cudaError_t AllowSharedBytes(int bytes) {
  return cudaFuncSetAttribute(ConfigKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
}

}  // namespace kvserve::simtest
