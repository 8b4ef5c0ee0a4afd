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

}  // namespace
}  // namespace kvserve::cpu
