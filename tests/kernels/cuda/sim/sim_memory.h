#ifndef KVSERVE_TESTS_KERNELS_CUDA_SIM_SIM_MEMORY_H_
#define KVSERVE_TESTS_KERNELS_CUDA_SIM_SIM_MEMORY_H_

// Device buffers for the simulator's own tests (cuda_sim_test, sim_nccl_p2p_test): allocation
// and copies that record a failure instead of returning it.

#include <cuda_runtime.h>

#include <cstddef>
#include <vector>

#include "gtest/gtest.h"

namespace kvserve::simtest {

template <typename T>
T* DeviceAlloc(size_t n) {
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, sizeof(T) * n), cudaSuccess);
  return static_cast<T*>(p);
}

template <typename T>
T* Upload(const std::vector<T>& host) {
  T* d = DeviceAlloc<T>(host.size());
  EXPECT_EQ(cudaMemcpy(d, host.data(), sizeof(T) * host.size(), cudaMemcpyHostToDevice),
            cudaSuccess);
  return d;
}

template <typename T>
std::vector<T> Download(const T* d, size_t n) {
  std::vector<T> host(n);
  EXPECT_EQ(cudaMemcpy(host.data(), d, sizeof(T) * n, cudaMemcpyDeviceToHost), cudaSuccess);
  return host;
}

}  // namespace kvserve::simtest

#endif  // KVSERVE_TESTS_KERNELS_CUDA_SIM_SIM_MEMORY_H_
