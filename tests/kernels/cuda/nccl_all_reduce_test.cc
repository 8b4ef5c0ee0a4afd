// NCCL all-reduce over every GPU of the machine (needs two or more; skips otherwise), through
// the Communicator interface of worker/tp/communicator.h.

#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tests/kernels/cuda/cuda_test_util.h"
#include "worker/tp/communicator.h"

namespace kvserve {
namespace {

using CreateGroupFn = int (*)(int, Communicator**, char*, size_t);

TEST(NcclAllReduceTest, SumsOnEveryRank) {
  std::vector<std::unique_ptr<Backend>> gpus;
  for (int d = 0; d < 8; ++d) {
    absl::StatusOr<std::unique_ptr<Backend>> b = testing_cuda::LoadTestBackend(d);
    if (!b.ok()) {
      if (d == 0) KVSERVE_SKIP_NO_DEVICE(b.status().message());
      break;
    }
    gpus.push_back(std::move(*b));
  }
  const int n = static_cast<int>(gpus.size());
  if (n < 2) GTEST_SKIP() << "no CUDA device: NCCL all-reduce needs 2 GPUs, found " << n;
  absl::StatusOr<void*> sym =
      CudaLibrarySymbol("kvserve_create_nccl_group", testing_cuda::UseSimulator());
  ASSERT_TRUE(sym.ok()) << sym.status();
  std::vector<Communicator*> raw(n);
  char error[256] = {0};
  ASSERT_EQ(reinterpret_cast<CreateGroupFn>(*sym)(n, raw.data(), error, sizeof(error)), 1) << error;
  std::vector<std::unique_ptr<Communicator>> comms(raw.begin(), raw.end());
  const int64_t kCount = testing_cuda::UseSimulator() ? 10007 : 1000003;
  std::vector<DeviceBuffer> data;
  for (int r = 0; r < n; ++r) {
    data.push_back(testing_cuda::Upload(gpus[r].get(), std::vector<float>(kCount, r + 1.0f)));
  }
  std::vector<absl::Status> status(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back(
        [&, r] { status[r] = comms[r]->AllReduceSum(data[r].as<float>(), kCount); });
  }
  for (auto& t : threads) t.join();
  const float want = n * (n + 1) / 2.0f;
  for (int r = 0; r < n; ++r) {
    ASSERT_TRUE(status[r].ok()) << status[r];
    const std::vector<float> got =
        testing_cuda::Download<float>(gpus[r].get(), data[r].get(), kCount);
    EXPECT_EQ(got.front(), want);
    EXPECT_EQ(got.back(), want);
  }
}

}  // namespace
}  // namespace kvserve
