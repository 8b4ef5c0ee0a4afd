#include "kernels/cpu/activation.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <iterator>
#include <random>
#include <vector>

#include "kernels/cpu/thread_pool.h"
#include "tests/kernels/cpu/kernel_test_util.h"

namespace kvserve::cpu {
namespace {

using testing::RandomFloats;
using testing::ScopedIsa;
using testing::SupportedIsas;

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

// The exps are ExpShifted's, which every ISA path computes with the same float operations: so
// is silu, whatever the path (a seeded request samples the same tokens on every machine).
// Gates cover both signs, zeros, values where exp(-|g|) underflows, and +-inf (silu(+inf) = +inf;
// -inf and NaN give NaN, as g / (1 + exp(-g)) does).
TEST(SiluMulTest, EveryIsaPathGivesTheSameBits) {
  std::mt19937 rng(6);
  const int64_t rows = 2, dim = 1037;
  std::vector<float> gate = RandomFloats(rows * dim, rng, -30.0f, 30.0f);
  const float specials[] = {0.0f, -0.0f, 90.0f, -90.0f, 1e-30f, -1e-30f, INFINITY, -INFINITY, NAN};
  for (size_t i = 0; i < std::size(specials); ++i) gate[i * 97] = specials[i];
  const std::vector<float> up = RandomFloats(rows * dim, rng, -2.0f, 2.0f);
  std::vector<float> base(rows * dim);
  {
    const ScopedIsa scalar(CpuIsa::kScalar);
    SiluMul(gate.data(), up.data(), base.data(), rows, dim, dim, dim, dim, nullptr);
  }
  for (size_t i = 0; i < std::size(specials); ++i) {
    const float g = specials[i], u = up[i * 97], y = base[i * 97];
    if (std::isnan(g) || g == -INFINITY) {
      EXPECT_TRUE(std::isnan(y)) << g;
    } else if (g == INFINITY) {
      EXPECT_EQ(y, u > 0 ? INFINITY : -INFINITY);
    } else {
      const double want = g / (1.0 + std::exp(-static_cast<double>(g))) * u;
      EXPECT_NEAR(y, want, 1e-6 * (1.0 + std::fabs(want))) << g;
    }
  }
  for (CpuIsa isa : SupportedIsas()) {
    const ScopedIsa scoped(isa);
    std::vector<float> out(rows * dim);
    SiluMul(gate.data(), up.data(), out.data(), rows, dim, dim, dim, dim, nullptr);
    EXPECT_EQ(0, std::memcmp(out.data(), base.data(), out.size() * sizeof(float)))
        << CpuIsaName(isa);
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
