#include "kernels/cpu/activation.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cpu/thread_pool.h"
#include "tests/kernels/cpu/kernel_test_util.h"

namespace kvserve::cpu {
namespace {

using testing::RandomFloats;

TEST(SiluMulTest, MatchesDoubleReferenceAtOddShapes) {
  ThreadPool pool(2);
  std::mt19937 rng(4);
  for (int64_t rows : {1, 3, 17}) {
    for (int64_t dim : {1, 7, 1000, 5000}) {
      const int64_t gs = dim + 1, us = dim + 2, os = dim + 3;
      const std::vector<float> gate = RandomFloats(rows * gs, rng, -20.0f, 20.0f);
      const std::vector<float> up = RandomFloats(rows * us, rng, -2.0f, 2.0f);
      std::vector<float> out(rows * os, 0.0f);
      SiluMul(gate.data(), up.data(), out.data(), rows, dim, gs, us, os, &pool);
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t i = 0; i < dim; ++i) {
          const double g = gate[r * gs + i];
          const double ref = g / (1.0 + std::exp(-g)) * up[r * us + i];
          ASSERT_NEAR(out[r * os + i], ref, 1e-6 * (1.0 + std::fabs(ref)));
        }
      }
    }
  }
}

TEST(SiluMulTest, InPlaceOverGateAndThreadIndependent) {
  std::mt19937 rng(5);
  const int64_t rows = 3, dim = 4100;
  const std::vector<float> gate = RandomFloats(rows * dim, rng, -5.0f, 5.0f);
  const std::vector<float> up = RandomFloats(rows * dim, rng);
  std::vector<float> expected(rows * dim);
  SiluMul(gate.data(), up.data(), expected.data(), rows, dim, dim, dim, dim, nullptr);
  ThreadPool pool(3);
  std::vector<float> in_place = gate;
  SiluMul(in_place.data(), up.data(), in_place.data(), rows, dim, dim, dim, dim, &pool);
  EXPECT_EQ(0, std::memcmp(in_place.data(), expected.data(), expected.size() * sizeof(float)));
}

}  // namespace
}  // namespace kvserve::cpu
