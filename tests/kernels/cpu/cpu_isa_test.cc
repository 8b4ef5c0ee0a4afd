#include "kernels/cpu/cpu_isa.h"

#include <gtest/gtest.h>

#include <cstdlib>

#include "tests/test_util/ci_skip.h"

namespace kvserve::cpu {
namespace {

TEST(CpuIsaTest, NamesRoundTrip) {
  for (CpuIsa isa : {CpuIsa::kScalar, CpuIsa::kAvx2, CpuIsa::kAvx512}) {
    EXPECT_EQ(ParseCpuIsa(CpuIsaName(isa)), isa);
  }
  EXPECT_EQ(ParseCpuIsa("AVX2"), std::nullopt);
  EXPECT_EQ(ParseCpuIsa(""), std::nullopt);
  EXPECT_EQ(ParseCpuIsa("sse"), std::nullopt);
}

TEST(CpuIsaTest, OverrideIsClampedToWhatTheCpuSupports) {
  EXPECT_TRUE(CpuSupportsIsa(CpuIsa::kScalar));
  EXPECT_TRUE(CpuSupportsIsa(BestSupportedIsa()));
  SetCpuIsaOverride(CpuIsa::kScalar);
  EXPECT_EQ(ActiveCpuIsa(), CpuIsa::kScalar);
  SetCpuIsaOverride(CpuIsa::kAvx512);
  EXPECT_EQ(ActiveCpuIsa(), BestSupportedIsa());
  SetCpuIsaOverride(std::nullopt);
  EXPECT_TRUE(CpuSupportsIsa(ActiveCpuIsa()));
}

// ctest runs this binary a second time with KVSERVE_CPU_ISA=scalar (tests/kernels/cpu/CMakeLists).
TEST(CpuIsaTest, EnvironmentVariableSelectsPath) {
  const char* env = std::getenv("KVSERVE_CPU_ISA");
  if (env == nullptr) {
    GTEST_SKIP() << "KVSERVE_CPU_ISA is not set in this run"
                 << testing_ci::DeclaredCiSkip("runs as cpu_isa_test_env_scalar");
  }
  SetCpuIsaOverride(std::nullopt);
  const std::optional<CpuIsa> wanted = ParseCpuIsa(env);
  ASSERT_TRUE(wanted.has_value()) << env;
  EXPECT_EQ(ActiveCpuIsa(), CpuSupportsIsa(*wanted) ? *wanted : BestSupportedIsa());
}

}  // namespace
}  // namespace kvserve::cpu
