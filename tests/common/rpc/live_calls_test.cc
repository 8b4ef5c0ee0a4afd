#include "common/rpc/live_calls.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

namespace kvserve {
namespace {

TEST(LiveCallsTest, CountsTokensUntilDestroyedOrMovedFrom) {
  LiveCalls calls;
  EXPECT_EQ(calls.live(), 0);
  {
    LiveCalls::Token a = calls.Track();
    LiveCalls::Token b = calls.Track();
    EXPECT_EQ(calls.live(), 2);
    LiveCalls::Token c = std::move(a);  // a counts nothing now
    EXPECT_EQ(calls.live(), 2);
    b = std::move(c);  // b's own count ends; it takes over c's
    EXPECT_EQ(calls.live(), 1);
    LiveCalls::Token none;
    b = std::move(none);
    EXPECT_EQ(calls.live(), 0);
  }
  EXPECT_EQ(calls.live(), 0);
  calls.WaitForNone();  // returns at once
}

// WaitForNone returns only after every token, each held by another thread for a while, is
// destroyed. The counter may then go at once, while those threads still return from their tokens'
// destructors (the shared state keeps the mutex alive; ASan checks).
TEST(LiveCallsTest, WaitForNoneWaitsForTokensOnOtherThreads) {
  auto calls = std::make_unique<LiveCalls>();
  constexpr int kThreads = 8;
  std::atomic<int> released{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([token = calls->Track(), &released, i]() mutable {
      std::this_thread::sleep_for(std::chrono::milliseconds(10 * (i + 1)));
      released.fetch_add(1);
      LiveCalls::Token gone = std::move(token);  // destroyed here, after the count above
    });
  }
  calls->WaitForNone();
  EXPECT_EQ(released.load(), kThreads);
  EXPECT_EQ(calls->live(), 0);
  calls.reset();  // the threads may still be returning from their tokens' destructors
  for (std::thread& t : threads) t.join();
}

TEST(LiveCallsTest, DestroyingTheCounterWaitsForItsTokens) {
  std::atomic<bool> token_gone{false};
  std::thread holder;
  {
    LiveCalls calls;
    holder = std::thread([token = calls.Track(), &token_gone]() mutable {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      token_gone.store(true);
      LiveCalls::Token gone = std::move(token);
    });
  }  // ~LiveCalls waits here
  EXPECT_TRUE(token_gone.load());
  holder.join();
}

}  // namespace
}  // namespace kvserve
