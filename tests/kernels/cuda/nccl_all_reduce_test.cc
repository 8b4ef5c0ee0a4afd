// NCCL all-reduce over every GPU of the machine (needs two or more; skips otherwise), through
// the Communicator interface of worker/tp/communicator.h.

#include <chrono>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "tests/kernels/cuda/cuda_test_util.h"
#include "worker/tp/communicator.h"
#include "worker/tp/nccl_group.h"
#include "worker/tp/stage_link.h"

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
  KVSERVE_REQUIRE_DEVICES(2);
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

// Communicators of two ranks of the device under test, or empty having skipped.
std::vector<std::unique_ptr<Communicator>> TwoRanks(std::vector<std::unique_ptr<Backend>>* gpus,
                                                    std::string* why) {
  for (int d = 0; d < 2; ++d) {
    absl::StatusOr<std::unique_ptr<Backend>> b = testing_cuda::LoadTestBackend(d);
    if (!b.ok()) {
      *why = std::string(b.status().message());
      return {};
    }
    gpus->push_back(std::move(*b));
  }
  absl::StatusOr<void*> sym =
      CudaLibrarySymbol("kvserve_create_nccl_group", testing_cuda::UseSimulator());
  if (!sym.ok()) {
    *why = std::string(sym.status().message());
    return {};
  }
  std::vector<Communicator*> raw(2);
  char error[256] = {0};
  if (reinterpret_cast<CreateGroupFn>(*sym)(2, raw.data(), error, sizeof(error)) != 1) {
    *why = error;
    return {};
  }
  return std::vector<std::unique_ptr<Communicator>>(raw.begin(), raw.end());
}

// One rank aborts the group while the other keeps calling collectives: every later call says
// ABORTED, none uses a communicator that ncclCommAbort freed (ASan watches on the simulator).
TEST(NcclAllReduceTest, AbortWhileAPeerIsInCollectives) {
  KVSERVE_REQUIRE_DEVICES(2);
  std::vector<std::unique_ptr<Backend>> gpus;
  std::string why;
  std::vector<std::unique_ptr<Communicator>> comms = TwoRanks(&gpus, &why);
  ASSERT_FALSE(comms.empty()) << why;
  DeviceBuffer d0 = testing_cuda::Upload(gpus[0].get(), std::vector<float>(64, 1.0f));
  DeviceBuffer d1 = testing_cuda::Upload(gpus[1].get(), std::vector<float>(64, 1.0f));
  absl::Status last0;
  int ok0 = 0;
  std::thread rank0([&] {
    for (int i = 0; i < 200; ++i) {
      last0 = comms[0]->AllReduceSum(d0.as<float>(), 64);
      if (last0.ok()) ++ok0;
    }
  });
  std::thread rank1([&] {
    for (int i = 0; i < 20; ++i) ASSERT_TRUE(comms[1]->AllReduceSum(d1.as<float>(), 64).ok());
    comms[1]->Abort();
  });
  rank1.join();
  rank0.join();
  // Round 20 may be reported ABORTED on rank 0 (the abort came before its check after the wait),
  // and round 21 may have completed before the abort.
  EXPECT_GE(ok0, 19);
  EXPECT_LE(ok0, 21);
  EXPECT_TRUE(absl::IsAborted(last0)) << last0;
  EXPECT_TRUE(absl::IsAborted(comms[1]->AllReduceSum(d1.as<float>(), 64)));
}

// All-reduces enqueued on each rank's backend stream (EnqueueAllReduceSum): the calls return
// without waiting, the sums land in stream order, and a rank whose stream waits in a collective
// its peer never joins is released by Abort (the next enqueue says ABORTED).
TEST(NcclAllReduceTest, EnqueuedOnTheBackendStream) {
  KVSERVE_REQUIRE_DEVICES(2);
  std::vector<std::unique_ptr<Backend>> gpus;
  std::string why;
  std::vector<std::unique_ptr<Communicator>> comms = TwoRanks(&gpus, &why);
  ASSERT_FALSE(comms.empty()) << why;
  ASSERT_TRUE(comms[0]->enqueues_on_stream());
  ASSERT_NE(gpus[0]->native_stream(), nullptr);
  std::vector<DeviceBuffer> data;
  for (int r = 0; r < 2; ++r) {
    data.push_back(testing_cuda::Upload(gpus[r].get(), std::vector<float>(300, r + 1.0f)));
  }
  // Three rounds per rank, enqueued back to back from each rank's thread: 1+2, then doubled.
  std::vector<absl::Status> status(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      for (int i = 0; i < 3 && status[r].ok(); ++i) {
        status[r] =
            comms[r]->EnqueueAllReduceSum(data[r].as<float>(), 300, gpus[r]->native_stream());
      }
      if (status[r].ok()) status[r] = gpus[r]->Synchronize();
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(status[r].ok()) << status[r];
    const std::vector<float> got = testing_cuda::Download<float>(gpus[r].get(), data[r].get(), 300);
    EXPECT_EQ(got.front(), 12.0f);  // (1 + 2) * 2 * 2
    EXPECT_EQ(got.back(), 12.0f);
  }
  // Rank 0 enqueues a round rank 1 never joins; its stream waits until the group is aborted.
  ASSERT_TRUE(
      comms[0]->EnqueueAllReduceSum(data[0].as<float>(), 300, gpus[0]->native_stream()).ok());
  std::thread waiter([&] { status[0] = gpus[0]->Synchronize(); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  comms[1]->Abort();
  waiter.join();  // returns: the abort released the stream
  EXPECT_TRUE(absl::IsAborted(
      comms[0]->EnqueueAllReduceSum(data[0].as<float>(), 300, gpus[0]->native_stream())));
}

// A rank that cannot be set up fails the group and frees every communicator already made
// (LeakSanitizer checks on the simulator's ASan run). Simulator only: a GPU's memory cannot be
// exhausted repeatably.
TEST(NcclAllReduceTest, FailedGroupSetUpLeaksNothing) {
  KVSERVE_SIMULATOR_ONLY();
  absl::StatusOr<std::unique_ptr<Backend>> rank1 = testing_cuda::LoadTestBackend(1);
  ASSERT_TRUE(rank1.ok()) << rank1.status();
  absl::StatusOr<std::pair<int64_t, int64_t>> memory = (*rank1)->MemoryInfo();
  ASSERT_TRUE(memory.ok());
  absl::StatusOr<DeviceBuffer> hog = (*rank1)->AllocBuffer(static_cast<size_t>(memory->first));
  ASSERT_TRUE(hog.ok()) << hog.status();
  absl::StatusOr<void*> sym = CudaLibrarySymbol("kvserve_create_nccl_group", true);
  ASSERT_TRUE(sym.ok());
  std::vector<Communicator*> raw(2, nullptr);
  char error[256] = {0};
  EXPECT_EQ(reinterpret_cast<CreateGroupFn>(*sym)(2, raw.data(), error, sizeof(error)), 0);
  EXPECT_NE(std::string(error).find("cannot set up NCCL rank 1"), std::string::npos) << error;
}

// Pipeline stage links (worker/tp/stage_link.h) between two stages of tp 2, both in this process
// (simulator only: each stage's rank t is device t, and a real GPU cannot hold two ranks of one
// communicator): every rank's hand-over reaches the same rank of the next stage, in order; a
// formation whose other stage never opens its links times out instead of hanging; an abort ends
// a receive that waits for a peer.
TEST(NcclAllReduceTest, StageLinksHandOverRankToRankAndNeverHang) {
  KVSERVE_SIMULATOR_ONLY();
  std::vector<std::unique_ptr<Backend>> gpus;
  for (int d = 0; d < 2; ++d) {
    absl::StatusOr<std::unique_ptr<Backend>> b = testing_cuda::LoadTestBackend(d);
    ASSERT_TRUE(b.ok()) << b.status();
    gpus.push_back(std::move(*b));
  }
  const StageLinkFactory factory = NcclStageLinks(2, /*simulator=*/true);
  absl::StatusOr<std::string> id = factory.new_id();
  ASSERT_TRUE(id.ok()) << id.status();
  absl::StatusOr<std::vector<std::shared_ptr<StageLink>>> first, second;
  std::thread opener([&] { second = factory.open(*id, 2, 1, absl::Seconds(20)); });
  first = factory.open(*id, 2, 0, absl::Seconds(20));
  opener.join();
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(second.ok()) << second.status();
  ASSERT_EQ(first->size(), 2u);
  constexpr int64_t kCount = 3000;
  std::vector<std::thread> ranks;
  std::vector<std::vector<float>> got(2);
  std::vector<absl::Status> sent(2), received(2);
  for (int t = 0; t < 2; ++t) {
    ranks.emplace_back([&, t] {
      DeviceBuffer a = testing_cuda::Upload(gpus[t].get(), std::vector<float>(kCount, t + 1.0f));
      DeviceBuffer b = testing_cuda::Upload(gpus[t].get(), std::vector<float>(kCount, t + 10.0f));
      sent[t] = (*first)[t]->Send(a.as<float>(), kCount);
      if (sent[t].ok()) sent[t] = (*first)[t]->Send(b.as<float>(), kCount);
      DeviceBuffer in = testing_cuda::Upload(gpus[t].get(), std::vector<float>(2 * kCount, 0.0f));
      received[t] = (*second)[t]->Recv(in.as<float>(), kCount);
      if (received[t].ok()) received[t] = (*second)[t]->Recv(in.as<float>() + kCount, kCount);
      got[t] = testing_cuda::Download<float>(gpus[t].get(), in.get(), 2 * kCount);
    });
  }
  for (std::thread& r : ranks) r.join();
  for (int t = 0; t < 2; ++t) {
    ASSERT_TRUE(sent[t].ok()) << sent[t];
    ASSERT_TRUE(received[t].ok()) << received[t];
    EXPECT_EQ(got[t].front(), t + 1.0f) << "rank " << t;
    EXPECT_EQ(got[t].back(), t + 10.0f) << "rank " << t;
  }
  // The first stage cannot receive, the last cannot send.
  EXPECT_TRUE(absl::IsFailedPrecondition((*first)[0]->Recv(nullptr, 1)));
  EXPECT_TRUE(absl::IsFailedPrecondition((*second)[0]->Send(nullptr, 1)));

  // An abort (a lost stage) ends a receive whose sender never sends, and later calls fail.
  DeviceBuffer in = testing_cuda::Upload(gpus[0].get(), std::vector<float>(8, 0.0f));
  absl::Status waiting;
  std::thread receiver([&] { waiting = (*second)[0]->Recv(in.as<float>(), 8); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  (*second)[1]->Abort();  // any link of the formation aborts them all
  receiver.join();
  EXPECT_TRUE(absl::IsUnavailable(waiting)) << waiting;
  EXPECT_TRUE(IsStageLinkError(waiting)) << waiting;
  EXPECT_TRUE(absl::IsUnavailable((*second)[1]->Recv(in.as<float>(), 8)));

  // A formation whose other stage never comes: opening times out.
  absl::StatusOr<std::string> lonely = factory.new_id();
  ASSERT_TRUE(lonely.ok());
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<std::vector<std::shared_ptr<StageLink>>> alone =
      factory.open(*lonely, 2, 0, absl::Milliseconds(300));
  EXPECT_TRUE(absl::IsUnavailable(alone.status())) << alone.status();
  EXPECT_NE(alone.status().message().find("timed out"), std::string::npos) << alone.status();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

}  // namespace
}  // namespace kvserve
