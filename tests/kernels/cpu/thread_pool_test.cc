#include "kernels/cpu/thread_pool.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

namespace kvserve::cpu {
namespace {

using Chunks = std::vector<std::pair<int64_t, int64_t>>;

// Runs one ParallelFor, checking every index in [0, n) is visited exactly once; returns the
// chunks in order of their begin.
Chunks RunAndCheck(ThreadPool& pool, int64_t n, int64_t min_chunk) {
  std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
  std::mutex mu;
  Chunks chunks;
  pool.ParallelFor(n, min_chunk, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) hits[i].fetch_add(1);
    const std::lock_guard<std::mutex> lock(mu);
    chunks.emplace_back(begin, end);
  });
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(hits[i].load(), 1) << "index " << i;
  std::sort(chunks.begin(), chunks.end());
  return chunks;
}

TEST(ThreadPoolTest, CoversEveryIndexOnceWithContiguousChunks) {
  for (int threads : {1, 2, 3, 4}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.num_threads(), threads);
    for (int64_t n : {1, 2, 3, 7, 16, 100, 1001}) {
      for (int64_t min_chunk : {0, 1, 3, 16, 2000}) {
        const Chunks chunks = RunAndCheck(pool, n, min_chunk);
        ASSERT_FALSE(chunks.empty());
        EXPECT_LE(static_cast<int>(chunks.size()), threads);
        EXPECT_EQ(static_cast<int>(chunks.size()), pool.NumChunks(n, min_chunk));
        EXPECT_EQ(chunks.front().first, 0);
        EXPECT_EQ(chunks.back().second, n);
        for (size_t c = 0; c < chunks.size(); ++c) {
          EXPECT_LT(chunks[c].first, chunks[c].second);
          if (c > 0) {
            EXPECT_EQ(chunks[c - 1].second, chunks[c].first);
          }
          if (chunks.size() > 1) {
            EXPECT_GE(chunks[c].second - chunks[c].first, min_chunk);
          }
        }
        // The split is a function of (n, min_chunk, threads) only.
        EXPECT_EQ(RunAndCheck(pool, n, min_chunk), chunks);
      }
    }
  }
}

TEST(ThreadPoolTest, DynamicPiecesAreFixedByNAndGrain) {
  // Which thread runs a piece may vary; the pieces themselves may not: [i*grain, (i+1)*grain)
  // clipped to n, each exactly once.
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{64}, int64_t{1001}}) {
      for (int64_t grain : {int64_t{0}, int64_t{1}, int64_t{8}, int64_t{100}}) {
        std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
        std::mutex mu;
        Chunks pieces;
        pool.ParallelForDynamic(n, grain, [&](int64_t begin, int64_t end) {
          for (int64_t i = begin; i < end; ++i) hits[i].fetch_add(1);
          const std::lock_guard<std::mutex> lock(mu);
          pieces.emplace_back(begin, end);
        });
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "index " << i;
        std::sort(pieces.begin(), pieces.end());
        const int64_t g = std::max<int64_t>(grain, 1);
        ASSERT_EQ(static_cast<int64_t>(pieces.size()), (n + g - 1) / g);
        for (size_t p = 0; p < pieces.size(); ++p) {
          EXPECT_EQ(pieces[p].first, static_cast<int64_t>(p) * g);
          EXPECT_EQ(pieces[p].second, std::min(n, static_cast<int64_t>(p + 1) * g));
        }
      }
    }
  }
}

TEST(ThreadPoolTest, ZeroOrNegativeNCallsNothing) {
  ThreadPool pool(3);
  int calls = 0;
  pool.ParallelFor(0, 1, [&](int64_t, int64_t) { ++calls; });
  pool.ParallelFor(-5, 1, [&](int64_t, int64_t) { ++calls; });
  EXPECT_EQ(calls, 0);
}

TEST(ThreadPoolTest, NonPositiveThreadCountMeansHardwareConcurrency) {
  ThreadPool pool(0);
  EXPECT_GE(pool.num_threads(), 1);
  RunAndCheck(pool, 50, 1);
}

TEST(ThreadPoolTest, NestedCallsRunInlineWithoutDeadlock) {
  ThreadPool pool(3);
  std::vector<std::atomic<int>> hits(30 * 20);
  pool.ParallelFor(30, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      pool.ParallelFor(20, 1, [&](int64_t b, int64_t e) {
        for (int64_t j = b; j < e; ++j) hits[i * 20 + j].fetch_add(1);
      });
    }
  });
  for (auto& h : hits) EXPECT_EQ(h.load(), 1);
}

TEST(ThreadPoolTest, ManySmallSerialCalls) {
  ThreadPool pool(3);
  std::atomic<int64_t> total{0};
  for (int rep = 0; rep < 3000; ++rep) {
    pool.ParallelFor(6, 1, [&](int64_t begin, int64_t end) { total.fetch_add(end - begin); });
  }
  EXPECT_EQ(total.load(), 6 * 3000);
}

TEST(ThreadPoolTest, ConcurrentCallersFromTwoThreadsBothComplete) {
  ThreadPool pool(2);
  std::atomic<int64_t> total{0};
  const auto caller = [&] {
    for (int rep = 0; rep < 2000; ++rep) {
      pool.ParallelFor(10, 1, [&](int64_t begin, int64_t end) { total.fetch_add(end - begin); });
    }
  };
  std::thread a(caller);
  std::thread b(caller);
  a.join();
  b.join();
  EXPECT_EQ(total.load(), 2 * 2000 * 10);
}

}  // namespace
}  // namespace kvserve::cpu
