#include "kernels/cpu/rms_norm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/thread_pool.h"
#include "tests/kernels/cpu/kernel_test_util.h"

namespace kvserve::cpu {
namespace {

using testing::RandomFloats;
using testing::ScopedIsa;
using testing::SupportedIsas;

TEST(RmsNormTest, MatchesDoubleReferenceWithAndWithoutResidual) {
  ThreadPool pool(2);
  std::mt19937 rng(1);
  for (int64_t rows : {1, 3, 17}) {
    for (int64_t dim : {1, 8, 33, 4096}) {
      for (bool with_residual : {false, true}) {
        const int64_t x_stride = dim + 2, y_stride = dim + 1, r_stride = dim + 3;
        std::vector<float> x = RandomFloats(rows * x_stride, rng, -3.0f, 3.0f);
        const std::vector<float> x_in = x;
        const std::vector<float> residual = RandomFloats(rows * r_stride, rng);
        const std::vector<float> weight = RandomFloats(dim, rng, 0.5f, 1.5f);
        std::vector<float> y(rows * y_stride, 0.0f);
        RmsNormArgs args{x.data(),      with_residual ? residual.data() : nullptr,
                         weight.data(), y.data(),
                         rows,          dim,
                         1e-5f,         x_stride,
                         y_stride,      r_stride};
        RmsNorm(args, rows > 1 ? &pool : nullptr);
        for (int64_t r = 0; r < rows; ++r) {
          std::vector<double> h(dim);
          double ss = 0;
          for (int64_t i = 0; i < dim; ++i) {
            h[i] = double{x_in[r * x_stride + i]};
            if (with_residual) h[i] = static_cast<float>(h[i] + residual[r * r_stride + i]);
            ss += h[i] * h[i];
            ASSERT_EQ(x[r * x_stride + i], static_cast<float>(h[i]));  // new residual stream
          }
          const double inv = 1.0 / std::sqrt(ss / dim + 1e-5);
          for (int64_t i = 0; i < dim; ++i) {
            const double ref = h[i] * inv * weight[i];
            ASSERT_NEAR(y[r * y_stride + i], ref, 1e-5 * (1.0 + std::fabs(ref)))
                << "rows " << rows << " dim " << dim << " r " << r << " i " << i;
          }
        }
      }
    }
  }
}

TEST(RmsNormTest, RowResultIndependentOfBatchAndThreads) {
  std::mt19937 rng(2);
  const int64_t rows = 17, dim = 4096;
  const std::vector<float> x0 = RandomFloats(rows * dim, rng);
  const std::vector<float> weight = RandomFloats(dim, rng);
  const auto run = [&](int64_t first_row, int64_t n, ThreadPool* pool) {
    std::vector<float> x(x0.begin() + first_row * dim, x0.begin() + (first_row + n) * dim);
    std::vector<float> y(n * dim);
    RmsNorm(RmsNormArgs{x.data(), nullptr, weight.data(), y.data(), n, dim, 1e-6f, dim, dim}, pool);
    return y;
  };
  ThreadPool pool2(2), pool3(3);
  const std::vector<float> base = run(0, rows, nullptr);
  for (ThreadPool* pool : {&pool2, &pool3}) {
    const std::vector<float> y = run(0, rows, pool);
    ASSERT_EQ(0, std::memcmp(y.data(), base.data(), y.size() * sizeof(float)));
  }
  for (int64_t r = 0; r < rows; ++r) {
    const std::vector<float> y = run(r, 1, nullptr);
    ASSERT_EQ(0, std::memcmp(y.data(), &base[r * dim], dim * sizeof(float))) << "row " << r;
  }
}

// Every ISA path gives the portable loop's bits: the same residual add, the same eight-lane sum of
// squares and the same scaling, for rows of every length around the SIMD widths, with and without
// a residual (which also comes back in x), and in place.
TEST(RmsNormTest, EveryIsaPathGivesTheSameBits) {
  std::mt19937 rng(3);
  for (int64_t dim : {1, 5, 8, 15, 16, 17, 31, 100, 1037}) {
    const int64_t rows = 3;
    const std::vector<float> x0 = RandomFloats(rows * dim, rng, -4.0f, 4.0f);
    const std::vector<float> residual = RandomFloats(rows * dim, rng);
    const std::vector<float> weight = RandomFloats(dim, rng);
    const auto run = [&](bool with_residual, bool in_place) {
      std::vector<float> x = x0;
      std::vector<float> y(x.size(), -9.0f);
      float* out = in_place ? x.data() : y.data();
      RmsNorm(RmsNormArgs{x.data(), with_residual ? residual.data() : nullptr, weight.data(), out,
                          rows, dim, 1e-5f, dim, dim},
              nullptr);
      x.insert(x.end(), y.begin(), y.end());
      return x;
    };
    for (int variant = 0; variant < 3; ++variant) {
      const bool with_residual = variant == 1, in_place = variant == 2;
      std::vector<float> base;
      {
        const ScopedIsa scalar(CpuIsa::kScalar);
        base = run(with_residual, in_place);
      }
      for (CpuIsa isa : SupportedIsas()) {
        const ScopedIsa scoped(isa);
        const std::vector<float> got = run(with_residual, in_place);
        ASSERT_EQ(0, std::memcmp(got.data(), base.data(), got.size() * sizeof(float)))
            << CpuIsaName(isa) << " dim " << dim << " variant " << variant;
      }
    }
  }
}

}  // namespace
}  // namespace kvserve::cpu
