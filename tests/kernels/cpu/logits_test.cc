// The sampler's logits kernels (kernels/cpu/logits.h) on every ISA path this machine has:
// ArgMaxChecked against a plain loop (ties, lanes, tails, -inf, NaN and +inf anywhere), and
// ExpShifted against libm's exp, exactly 0 where exp leaves the normal floats, and bit-identical
// between the paths (a seeded request must sample the same tokens on every machine).

#include "kernels/cpu/logits.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_isa.h"

namespace kvserve::cpu {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

std::vector<CpuIsa> Paths() {
  std::vector<CpuIsa> paths = {CpuIsa::kScalar};
  if (CpuSupportsIsa(CpuIsa::kAvx2)) paths.push_back(CpuIsa::kAvx2);
  if (CpuSupportsIsa(CpuIsa::kAvx512)) paths.push_back(CpuIsa::kAvx512);
  return paths;
}

class LogitsTest : public ::testing::TestWithParam<CpuIsa> {
 protected:
  void SetUp() override { SetCpuIsaOverride(GetParam()); }
  void TearDown() override { SetCpuIsaOverride(std::nullopt); }
};

int64_t ReferenceArgMax(const std::vector<float>& x) {
  int64_t best = 0;
  for (size_t i = 1; i < x.size(); ++i) {
    if (x[i] > x[static_cast<size_t>(best)]) best = static_cast<int64_t>(i);
  }
  return best;
}

TEST_P(LogitsTest, ArgMaxIsTheFirstMaximumForEverySizeAndPosition) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> dist(-8.0f, 8.0f);
  for (int64_t n : {1, 2, 15, 16, 17, 31, 33, 100, 1000, 50257}) {
    for (int trial = 0; trial < 12; ++trial) {
      std::vector<float> x(static_cast<size_t>(n));
      for (float& v : x) v = dist(rng);
      const int64_t at = static_cast<int64_t>(rng() % n);
      x[at] = 9.0f;
      if (trial % 3 == 0) x[(at + 1 + rng() % n) % n] = 9.0f;  // a tie, before or after
      if (trial % 4 == 0) x[rng() % n] = -kInf;                // a masked token
      const ArgMaxResult r = ArgMaxChecked(x.data(), n);
      EXPECT_EQ(r.bad, -1);
      EXPECT_EQ(r.index, ReferenceArgMax(x)) << "n " << n << ", trial " << trial;
    }
  }
  const std::vector<float> masked(40, -kInf);
  EXPECT_EQ(ArgMaxChecked(masked.data(), 40).index, 0);
  EXPECT_EQ(ArgMaxChecked(masked.data(), 40).bad, -1);
}

TEST_P(LogitsTest, ArgMaxNamesTheFirstNanOrPlusInf) {
  for (int64_t n : {1, 7, 16, 45, 50257}) {
    for (int64_t at : {int64_t{0}, n / 2, n - 1}) {
      for (float bad : {std::nanf(""), kInf}) {
        std::vector<float> x(static_cast<size_t>(n), 0.5f);
        x[static_cast<size_t>(at)] = bad;
        if (at + 3 < n) x[static_cast<size_t>(at + 3)] = std::nanf("");  // a later one
        EXPECT_EQ(ArgMaxChecked(x.data(), n).bad, at) << "n " << n << ", bad " << bad;
      }
    }
  }
}

TEST_P(LogitsTest, ExpMatchesLibmAndZeroesTheUnderflow) {
  std::vector<float> x;
  for (float v = 0.0f; v > -100.0f; v -= 0.00731f) x.push_back(v);
  for (float v : {-0.0f, -1e-30f, -1e-7f, -0.34657359f, -0.34657360f, -87.3f, -87.34f, -88.0f,
                  -1e30f, -kInf}) {
    x.push_back(v);
  }
  x.push_back(-3.0f);  // an odd count: the tails too
  std::vector<float> y(x.size());
  ExpShifted(x.data(), static_cast<int64_t>(x.size()), 0.0f, 1.0f, y.data());
  for (size_t i = 0; i < x.size(); ++i) {
    if (x[i] < -87.33654f) {
      EXPECT_EQ(y[i], 0.0f) << "exp(" << x[i] << ")";
      continue;
    }
    const double want = std::exp(static_cast<double>(x[i]));
    EXPECT_LE(std::fabs(y[i] - want), 2.5e-7 * want) << "exp(" << x[i] << ") = " << y[i];
  }
  // Shift and scale: exp((x - 3) * 2), in place.
  std::vector<float> z = {3.0f, 2.5f, 1.0f, -kInf, 2.0f};
  ExpShifted(z.data(), 5, 3.0f, 2.0f, z.data());
  const double want[] = {1.0, std::exp(-1.0), std::exp(-4.0), 0.0, std::exp(-2.0)};
  for (int i = 0; i < 5; ++i) EXPECT_NEAR(z[i], want[i], 2.5e-7 * want[i] + 1e-30) << i;
}

INSTANTIATE_TEST_SUITE_P(Paths, LogitsTest, ::testing::ValuesIn(Paths()),
                         [](const auto& info) { return std::string(CpuIsaName(info.param)); });

TEST_P(LogitsTest, BlockSumsAreTheTreeSumsOfTheExps) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> dist(-30.0f, 0.0f);
  for (int64_t n : {1, 5, 16, 17, 31, 32, 1000, 50257}) {
    std::vector<float> x(static_cast<size_t>(n));
    for (float& v : x) v = dist(rng);
    x[0] = -kInf;
    std::vector<float> e(x.size());
    ExpShifted(x.data(), n, -1.5f, 0.8f, e.data());
    std::vector<float> sums(static_cast<size_t>((n + 15) / 16), -1.0f);
    ExpBlockSums(x.data(), n, -1.5f, 0.8f, sums.data());
    for (size_t b = 0; b < sums.size(); ++b) {
      float block[16] = {};
      for (size_t j = 0; j < 16 && b * 16 + j < x.size(); ++j) block[j] = e[b * 16 + j];
      // Bit for bit the documented order, not just close.
      EXPECT_EQ(sums[b], BuildExpBlockTree(block).sum()) << "n " << n << ", block " << b;
      double plain = 0;
      for (float v : block) plain += v;
      EXPECT_NEAR(sums[b], plain, 1e-6 * plain + 1e-30);
    }
  }
}

TEST(LogitsPathsTest, ExpIsBitIdenticalOnEveryPath) {
  std::mt19937 rng(9);
  std::uniform_real_distribution<float> dist(-95.0f, 0.0f);
  std::vector<float> x(50257);
  for (float& v : x) v = dist(rng);
  x[5] = -kInf;
  std::vector<float> base(x.size());
  SetCpuIsaOverride(CpuIsa::kScalar);
  ExpShifted(x.data(), static_cast<int64_t>(x.size()), -0.25f, 1.3f, base.data());
  for (CpuIsa isa : Paths()) {
    SetCpuIsaOverride(isa);
    std::vector<float> got(x.size());
    ExpShifted(x.data(), static_cast<int64_t>(x.size()), -0.25f, 1.3f, got.data());
    EXPECT_EQ(0, std::memcmp(base.data(), got.data(), base.size() * sizeof(float)))
        << CpuIsaName(isa);
    std::vector<float> base_sums(x.size() / 16 + 1), sums(x.size() / 16 + 1);
    SetCpuIsaOverride(CpuIsa::kScalar);
    ExpBlockSums(x.data(), static_cast<int64_t>(x.size()), -0.25f, 1.3f, base_sums.data());
    SetCpuIsaOverride(isa);
    ExpBlockSums(x.data(), static_cast<int64_t>(x.size()), -0.25f, 1.3f, sums.data());
    EXPECT_EQ(0, std::memcmp(base_sums.data(), sums.data(), sums.size() * sizeof(float)))
        << CpuIsaName(isa);
  }
  SetCpuIsaOverride(std::nullopt);
}

}  // namespace
}  // namespace kvserve::cpu
