// The in-process CPU communicator: sums in rank order, identical bits on every rank, many rounds,
// size mismatches, abort, all-gather.

#include "worker/tp/cpu_communicator.h"

#include <cstring>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace kvserve {
namespace {

// Runs fn(rank, comm) on one thread per rank and joins them.
void RunRanks(CpuCommGroup& group, const std::function<void(int, Communicator*)>& fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < group.size(); ++r) {
    threads.emplace_back([&, r] { fn(r, group.communicator(r)); });
  }
  for (auto& t : threads) t.join();
}

// A value that makes float addition order visible: big terms that cancel plus small ones.
float Value(int rank, int64_t i, int round) {
  const float big = (rank % 2 == 0 ? 1.0e8f : -1.0e8f) * static_cast<float>(1 + (i + round) % 3);
  return big + 0.37f * static_cast<float>(rank + 1) + 0.001f * static_cast<float>(i % 17);
}

// The sum in the documented order: rank 0, then 1, ..., size-1.
float OrderedSum(int size, int64_t i, int round) {
  float sum = Value(0, i, round);
  for (int r = 1; r < size; ++r) sum += Value(r, i, round);
  return sum;
}

class CommSizeTest : public ::testing::TestWithParam<int> {};

TEST_P(CommSizeTest, AllReduceSumsInRankOrderOnEveryRank) {
  const int size = GetParam();
  auto group = *CpuCommGroup::Create(size);
  // Odd lengths, lengths shorter than the rank count, and zero.
  const std::vector<int64_t> lengths = {1, 2, 3, 7, 97, 1000, 0, 4097};
  std::vector<std::vector<std::vector<float>>> results(size);
  RunRanks(*group, [&](int rank, Communicator* comm) {
    EXPECT_EQ(comm->rank(), rank);
    EXPECT_EQ(comm->size(), size);
    for (size_t round = 0; round < lengths.size(); ++round) {
      const int64_t n = lengths[round];
      std::vector<float> data(n);
      for (int64_t i = 0; i < n; ++i) data[i] = Value(rank, i, static_cast<int>(round));
      ASSERT_TRUE(comm->AllReduceSum(data.data(), n).ok());
      results[rank].push_back(std::move(data));
    }
  });
  for (size_t round = 0; round < lengths.size(); ++round) {
    const int64_t n = lengths[round];
    for (int64_t i = 0; i < n; ++i) {
      const float expected = OrderedSum(size, i, static_cast<int>(round));
      ASSERT_EQ(results[0][round][i], expected) << "round " << round << " i " << i;
    }
    for (int r = 1; r < size; ++r) {
      // (memcmp of an empty round would pass null pointers: undefined behaviour.)
      ASSERT_TRUE(results[0][round] == results[r][round])
          << "rank " << r << " differs in round " << round;
    }
  }
}

TEST_P(CommSizeTest, ManyRoundsAreDeterministic) {
  const int size = GetParam();
  constexpr int kRounds = 300;
  // Each round's output feeds the next one (plus a per-rank term), so a rank reading another's
  // buffer a round early or late would show. Every rank records every result; the records must
  // agree across ranks and across two independent runs, bit for bit.
  std::vector<float> runs[2];
  for (auto& run : runs) {
    auto group = *CpuCommGroup::Create(size);
    std::vector<std::vector<float>> trail(size);
    RunRanks(*group, [&](int rank, Communicator* comm) {
      std::vector<float> data(33);
      for (int64_t i = 0; i < 33; ++i) data[i] = Value(rank, i, 0);
      for (int round = 0; round < kRounds; ++round) {
        const int64_t n = 1 + round % 33;
        ASSERT_TRUE(comm->AllReduceSum(data.data(), n).ok());
        trail[rank].insert(trail[rank].end(), data.begin(), data.begin() + n);
        for (int64_t i = 0; i < n; ++i) data[i] = data[i] * 0.5f + static_cast<float>(rank);
      }
    });
    for (int r = 1; r < size; ++r) {
      ASSERT_EQ(trail[r].size(), trail[0].size());
      ASSERT_EQ(0, std::memcmp(trail[r].data(), trail[0].data(), trail[0].size() * 4))
          << "rank " << r;
    }
    run = trail[0];
  }
  ASSERT_EQ(runs[0].size(), runs[1].size());
  EXPECT_EQ(0, std::memcmp(runs[0].data(), runs[1].data(), runs[0].size() * 4));
}

TEST_P(CommSizeTest, AllGatherAndBarrier) {
  const int size = GetParam();
  auto group = *CpuCommGroup::Create(size);
  std::vector<std::vector<float>> recv(size, std::vector<float>(size * 5));
  RunRanks(*group, [&](int rank, Communicator* comm) {
    for (int round = 0; round < 20; ++round) {
      std::vector<float> send(5);
      for (int i = 0; i < 5; ++i) send[i] = static_cast<float>(rank * 100 + i + round);
      ASSERT_TRUE(comm->AllGather(send.data(), 5, recv[rank].data()).ok());
      ASSERT_TRUE(comm->Barrier().ok());
      for (int r = 0; r < size; ++r) {
        for (int i = 0; i < 5; ++i) {
          ASSERT_EQ(recv[rank][r * 5 + i], static_cast<float>(r * 100 + i + round));
        }
      }
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Sizes, CommSizeTest, ::testing::Values(1, 2, 3, 4));

TEST(CpuCommunicatorTest, SizeMismatchIsAnErrorOnEveryRank) {
  auto group = *CpuCommGroup::Create(3);
  std::vector<absl::Status> status(3);
  RunRanks(*group, [&](int rank, Communicator* comm) {
    std::vector<float> data(10, 1.0f);
    status[rank] = comm->AllReduceSum(data.data(), rank == 2 ? 9 : 10);
    // The group is still usable afterwards.
    std::vector<float> ok(4, 1.0f);
    ASSERT_TRUE(comm->AllReduceSum(ok.data(), 4).ok());
    EXPECT_EQ(ok[3], 3.0f);
  });
  for (const absl::Status& s : status) {
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
    EXPECT_NE(s.message().find("rank 2 passed 9"), std::string::npos) << s;
  }
}

TEST(CpuCommunicatorTest, AbortUnblocksWaitingRanksAndResetRearms) {
  auto group = *CpuCommGroup::Create(4);
  std::vector<absl::Status> status(4);
  RunRanks(*group, [&](int rank, Communicator* comm) {
    if (rank == 3) {
      group->Abort();  // rank 3 "fails" and never reaches the collective
      return;
    }
    std::vector<float> data(8, 1.0f);
    status[rank] = comm->AllReduceSum(data.data(), 8);
  });
  for (int r = 0; r < 3; ++r) EXPECT_TRUE(absl::IsAborted(status[r])) << status[r];
  EXPECT_TRUE(group->aborted());
  group->Reset();
  EXPECT_FALSE(group->aborted());
  RunRanks(*group, [&](int rank, Communicator* comm) {
    std::vector<float> data(8, static_cast<float>(rank));
    ASSERT_TRUE(comm->AllReduceSum(data.data(), 8).ok());
    EXPECT_EQ(data[0], 6.0f);
  });
}

TEST(CpuCommunicatorTest, RejectsBadSizes) {
  EXPECT_TRUE(absl::IsInvalidArgument(CpuCommGroup::Create(0).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(CpuCommGroup::Create(-2).status()));
  auto group = *CpuCommGroup::Create(2);
  EXPECT_EQ(group->communicator(2), nullptr);
  EXPECT_EQ(group->communicator(-1), nullptr);
}

}  // namespace
}  // namespace kvserve
