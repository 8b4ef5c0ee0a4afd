#ifndef KVSERVE_TESTS_KERNELS_CUDA_CUDA_TEST_UTIL_H_
#define KVSERVE_TESTS_KERNELS_CUDA_CUDA_TEST_UTIL_H_

// Test helpers for the CUDA backend: load it once (skip with the reason when there is no
// device) and move vectors between host and device. Tests link no CUDA library: the backend is
// dlopen'ed like in production.

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/backend.h"

namespace kvserve::testing_cuda {

/// The CUDA backend of this process, or null with `reason` set (loaded once).
inline Backend* Cuda(std::string* reason) {
  static std::unique_ptr<Backend> backend;
  static std::string why;
  static bool tried = false;
  if (!tried) {
    tried = true;
    BackendOptions options;
    options.keep_f32_weights = true;
    options.enable_graphs = true;
    absl::StatusOr<std::unique_ptr<Backend>> b = LoadCudaBackend(options);
    if (b.ok()) {
      backend = std::move(*b);
    } else {
      why = std::string(b.status().message());
    }
  }
  *reason = why;
  return backend.get();
}

/// In a TEST body: `Backend* gpu = ...; KVSERVE_REQUIRE_CUDA(gpu);` skips without a device.
#define KVSERVE_REQUIRE_CUDA(var)                                     \
  std::string kvserve_skip_reason;                                    \
  Backend* var = ::kvserve::testing_cuda::Cuda(&kvserve_skip_reason); \
  if (var == nullptr) GTEST_SKIP() << "no CUDA device: " << kvserve_skip_reason

/// A device copy of a host vector.
template <typename T>
DeviceBuffer Upload(Backend* b, const std::vector<T>& host) {
  absl::StatusOr<DeviceBuffer> buf = b->AllocBuffer(sizeof(T) * std::max<size_t>(host.size(), 1));
  EXPECT_TRUE(buf.ok()) << buf.status();
  EXPECT_TRUE(b->CopyToDevice(buf->get(), host.data(), sizeof(T) * host.size()).ok());
  return std::move(*buf);
}

/// Reads n elements back from the device (after the queued ops finish).
template <typename T>
std::vector<T> Download(Backend* b, const void* device, size_t n) {
  std::vector<T> host(n);
  absl::Status s = b->CopyToHost(host.data(), device, sizeof(T) * n);
  EXPECT_TRUE(s.ok()) << s;
  return host;
}

/// n floats uniform in [lo, hi) from a fixed seed.
inline std::vector<float> Random(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

/// Largest |a - b| over two vectors of the same size.
inline float MaxAbsDiff(const std::vector<float>& a, const std::vector<float>& b) {
  float m = 0.0f;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

}  // namespace kvserve::testing_cuda

#endif  // KVSERVE_TESTS_KERNELS_CUDA_CUDA_TEST_UTIL_H_
