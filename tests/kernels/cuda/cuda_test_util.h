#ifndef KVSERVE_TESTS_KERNELS_CUDA_CUDA_TEST_UTIL_H_
#define KVSERVE_TESTS_KERNELS_CUDA_CUDA_TEST_UTIL_H_

// Test helpers for the CUDA backend: load it once (skip with the reason when there is no
// device) and move vectors between host and device. Tests link no CUDA library: the backend is
// dlopen'ed like in production.
//
// Environment:
//   KVSERVE_TEST_DEVICE=cuda-sim  run against the CUDA simulator (libkvserve_cuda_sim.so, ctest
//                                 label `sim`) instead of a GPU (`cuda`, the default);
//   KVSERVE_REQUIRE_GPU=1         fail instead of skipping when the device is unusable
//                                 (scripts/gpu-check.sh, where a skip would hide a broken GPU).
//   CI (tests/test_util/ci_skip.h) a "no CUDA device" skip fails when the backend library was
//                                 built but does not load; no device is a declared reason.

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "tests/test_util/ci_skip.h"

namespace kvserve::testing_cuda {

/// Whether KVSERVE_TEST_DEVICE asks for the CUDA simulator.
inline bool UseSimulator() {
  const char* d = std::getenv("KVSERVE_TEST_DEVICE");
  return d != nullptr && std::strcmp(d, "cuda-sim") == 0;
}

/// Whether an unusable device fails the test (KVSERVE_REQUIRE_GPU=1) instead of skipping it.
inline bool RequireDevice() {
  const char* r = std::getenv("KVSERVE_REQUIRE_GPU");
  return r != nullptr && std::strcmp(r, "1") == 0;
}

/// The --device the tests run on.
inline DeviceChoice TestDevice() {
  return UseSimulator() ? DeviceChoice::kCudaSim : DeviceChoice::kCuda;
}

/// Backend options for device `index` of the device under test (f32 weights kept as f32).
inline BackendOptions DeviceOptions(int index = 0) {
  BackendOptions options;
  options.device_index = index;
  options.keep_f32_weights = true;
  options.simulator = UseSimulator();
  return options;
}

/// Loads a backend of the device under test.
inline absl::StatusOr<std::unique_ptr<Backend>> LoadTestBackend(int index = 0) {
  return LoadCudaBackend(DeviceOptions(index));
}

/// The CUDA backend of this process, or null with `reason` set (loaded once).
inline Backend* Cuda(std::string* reason) {
  static std::unique_ptr<Backend> backend;
  static std::string why;
  static bool tried = false;
  if (!tried) {
    tried = true;
    BackendOptions options = DeviceOptions();
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

/// How a "no CUDA device" skip stands in CI (tests/test_util/ci_skip.h). Declared where the
/// backend library loads and finds no usable device (CI machines have no GPU), or where this
/// build has no CUDA backend at all (CI installs no CUDA toolkit); undeclared, so CI fails, when
/// the library was built (or is the simulator's) but does not load: a broken build or install.
inline std::string NoDeviceCiDeclaration() {
  if (CudaLibrarySymbol(kCudaBackendEntryPoint, UseSimulator()).ok()) {
    return testing_ci::DeclaredCiSkip("no usable CUDA device here; CI machines have no GPU");
  }
#ifndef KVSERVE_TEST_CUDA_BACKEND_BUILT
  if (!UseSimulator()) {
    return testing_ci::DeclaredCiSkip("built without CUDA; CI installs no CUDA toolkit");
  }
#endif
  return "";
}

/// Skips the test (or fails it, under KVSERVE_REQUIRE_GPU=1) for want of a device; in CI the
/// skip fails too when the backend library does not load (NoDeviceCiDeclaration).
#define KVSERVE_SKIP_NO_DEVICE(reason)                                  \
  do {                                                                  \
    if (::kvserve::testing_cuda::RequireDevice()) {                     \
      FAIL() << "no usable CUDA device: " << (reason);                  \
    } else {                                                            \
      GTEST_SKIP() << "no CUDA device: " << (reason)                    \
                   << ::kvserve::testing_cuda::NoDeviceCiDeclaration(); \
    }                                                                   \
  } while (0)

/// Devices of the device under test that load (0..7), counted once.
inline int UsableDevices() {
  static const int count = [] {
    int n = 0;
    while (n < 8 && LoadTestBackend(n).ok()) ++n;
    return n;
  }();
  return count;
}

// The two skips a GPU machine may show without failing (scripts/gpu-check.sh accepts exactly
// these texts): a test that needs more devices than the machine has, and one that only means
// something on the CUDA simulator.
#define KVSERVE_REQUIRE_DEVICES(n)                                                           \
  do {                                                                                       \
    const int kvserve_have = ::kvserve::testing_cuda::UsableDevices();                       \
    if (kvserve_have < (n)) {                                                                \
      GTEST_SKIP() << "needs " << (n) << " CUDA devices, " << kvserve_have << " present"     \
                   << ::kvserve::testing_ci::DeclaredCiSkip("a machine with fewer devices"); \
    }                                                                                        \
  } while (0)
#define KVSERVE_SIMULATOR_ONLY()                                                         \
  do {                                                                                   \
    if (!::kvserve::testing_cuda::UseSimulator()) {                                      \
      GTEST_SKIP() << "runs on the CUDA simulator only"                                  \
                   << ::kvserve::testing_ci::DeclaredCiSkip("CI runs it as <test>_sim"); \
    }                                                                                    \
  } while (0)

/// In a TEST body: `KVSERVE_REQUIRE_CUDA(gpu);` declares `Backend* gpu`, skipping without a device.
#define KVSERVE_REQUIRE_CUDA(var)                                     \
  std::string kvserve_skip_reason;                                    \
  Backend* var = ::kvserve::testing_cuda::Cuda(&kvserve_skip_reason); \
  if (var == nullptr) KVSERVE_SKIP_NO_DEVICE(kvserve_skip_reason)

/// A device copy of a host vector.
template <typename T>
DeviceBuffer Upload(Backend* b, const std::vector<T>& host) {
  absl::StatusOr<DeviceBuffer> buf = b->AllocBuffer(sizeof(T) * std::max<size_t>(host.size(), 1));
  EXPECT_TRUE(buf.ok()) << buf.status();
  if (!buf.ok()) return DeviceBuffer();  // e.g. after a kernel fault made the device unusable
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
