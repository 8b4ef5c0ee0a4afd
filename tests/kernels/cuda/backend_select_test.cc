// Device selection on any machine (label kernels, no GPU needed): --device names parse, auto
// always yields a working backend, and an explicit cuda request without a usable GPU fails with
// a reason instead of aborting.

#include <cmath>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu_backend.h"

namespace kvserve {
namespace {

TEST(BackendSelectTest, ParsesDeviceNames) {
  EXPECT_EQ(DeviceChoiceFromName("cpu"), DeviceChoice::kCpu);
  EXPECT_EQ(DeviceChoiceFromName("CUDA"), DeviceChoice::kCuda);
  EXPECT_EQ(DeviceChoiceFromName("Auto"), DeviceChoice::kAuto);
  EXPECT_EQ(DeviceChoiceFromName("cuda-sim"), DeviceChoice::kCudaSim);
  EXPECT_EQ(DeviceChoiceFromName("gpu"), std::nullopt);
  EXPECT_EQ(DeviceChoiceName(DeviceChoice::kAuto), "auto");
  EXPECT_EQ(DeviceChoiceName(DeviceChoice::kCudaSim), "cuda-sim");
}

// --device cuda-sim loads the simulated CUDA backend through the same entry point; it reports
// the simulated device, and CUDA is never silently replaced by it (or by the CPU).
TEST(BackendSelectTest, CudaSimLoadsTheSimulatedBackend) {
  absl::StatusOr<std::unique_ptr<Backend>> sim =
      CreateBackend(DeviceChoice::kCudaSim, BackendOptions{}, nullptr);
  ASSERT_TRUE(sim.ok()) << sim.status();
  EXPECT_EQ((*sim)->name(), "cuda");
  EXPECT_FALSE((*sim)->host_memory());
  EXPECT_NE((*sim)->description().find("kvsim simulated H200"), std::string::npos)
      << (*sim)->description();
  absl::StatusOr<std::unique_ptr<Backend>> cuda =
      CreateBackend(DeviceChoice::kCuda, BackendOptions{}, nullptr);
  if (cuda.ok()) {
    EXPECT_EQ((*cuda)->description().find("kvsim"), std::string::npos);
  }
}

TEST(BackendSelectTest, AutoAlwaysGivesAWorkingBackend) {
  absl::StatusOr<std::unique_ptr<Backend>> b =
      CreateBackend(DeviceChoice::kAuto, BackendOptions{}, nullptr);
  ASSERT_TRUE(b.ok()) << b.status();
  absl::StatusOr<std::unique_ptr<Backend>> cuda = LoadCudaBackend(BackendOptions{});
  if (cuda.ok()) {
    EXPECT_EQ((*b)->name(), "cuda");
  } else {
    EXPECT_EQ((*b)->name(), "cpu");
    EXPECT_EQ(cuda.status().code(), absl::StatusCode::kUnavailable);
    EXPECT_FALSE(cuda.status().message().empty());
    absl::StatusOr<std::unique_ptr<Backend>> forced =
        CreateBackend(DeviceChoice::kCuda, BackendOptions{}, nullptr);
    EXPECT_EQ(forced.status().code(), absl::StatusCode::kUnavailable);
  }
  // The backend runs an op end to end through its own memory.
  Backend& be = **b;
  const std::vector<float> logits = {0.5f, 3.0f, -1.0f, 3.0f};
  absl::StatusOr<DeviceBuffer> dl = be.AllocBuffer(sizeof(float) * logits.size());
  absl::StatusOr<DeviceBuffer> dout = be.AllocBuffer(sizeof(int32_t));
  ASSERT_TRUE(dl.ok() && dout.ok());
  ASSERT_TRUE(be.CopyToDevice(dl->get(), logits.data(), sizeof(float) * logits.size()).ok());
  be.ArgMax(dl->as<float>(), 1, 4, 4, dout->as<int32_t>());
  int32_t got = -1;
  ASSERT_TRUE(be.CopyToHost(&got, dout->get(), sizeof(got)).ok());
  EXPECT_EQ(got, 1);  // ties go to the lower index
}

TEST(BackendSelectTest, CpuSamplingHelperFollowsTopKAndTopP) {
  cpu::CpuBackend cpu(nullptr);
  const std::vector<float> logits = {1.0f, 5.0f, 4.0f, -3.0f, 4.5f};
  auto sample = [&](double uniform, float top_p) {
    const SampleRowParams p{.uniform = uniform, .top_p = top_p, .top_k = 3};
    int32_t out = -2;
    cpu.SampleTopKTopP({logits.data(), 5, 5, &p, 1, &out});
    return out;
  };
  EXPECT_EQ(sample(0.0, 1.0f), 1);    // u = 0 takes the best candidate
  EXPECT_EQ(sample(0.999, 1.0f), 2);  // the last of the top 3 (5, 4.5, 4)
  EXPECT_EQ(sample(0.999, 0.1f), 1);  // top_p 0.1: only the best survives
  const std::vector<float> bad = {1.0f, std::nanf(""), 2.0f};
  const SampleRowParams p{.top_k = 2};
  int32_t out = 0;
  cpu.SampleTopKTopP({bad.data(), 3, 3, &p, 1, &out});
  EXPECT_EQ(out, -1);  // the host sampler refuses NaN logits
}

}  // namespace
}  // namespace kvserve
