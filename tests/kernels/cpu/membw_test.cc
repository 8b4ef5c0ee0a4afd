#include "kernels/cpu/membw.h"

#include <gtest/gtest.h>

#include <cmath>

#include "kernels/cpu/thread_pool.h"

namespace kvserve::cpu {
namespace {

TEST(MembwTest, ReturnsPositiveFiniteBandwidth) {
  ThreadPool pool(2);
  for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
    const double bw = MeasureTriadBandwidth(p, size_t{1} << 20, 2);
    EXPECT_TRUE(std::isfinite(bw));
    EXPECT_GT(bw, 1e6);  // more than 1 MB/s on anything that runs this
  }
  EXPECT_GT(MeasureTriadBandwidth(nullptr, 0, 0), 0.0);  // degenerate sizes still measure
}

TEST(MembwTest, ReadBandwidthIsPositiveAndFinite) {
  ThreadPool pool(2);
  for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
    const double bw = MeasureReadBandwidth(p, size_t{1} << 20, 2);
    EXPECT_TRUE(std::isfinite(bw));
    EXPECT_GT(bw, 1e6);
  }
  EXPECT_GT(MeasureReadBandwidth(nullptr, 0, 0), 0.0);
  // An odd size: the last elements of each range take the scalar tail.
  EXPECT_GT(MeasureReadBandwidth(&pool, 8 * 1031 + 5, 1), 0.0);
}

}  // namespace
}  // namespace kvserve::cpu
