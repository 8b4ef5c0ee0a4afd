// main() of every kvserve_test binary: GoogleTest's, plus the CI rule of ci_skip.h (a skip
// without a declared reason fails the run in CI).

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/test_util/ci_skip.h"

namespace kvserve::testing_ci {
namespace {

/// Collects the tests that skipped without declaring why they cannot run in CI.
class UndeclaredSkips : public ::testing::EmptyTestEventListener {
 public:
  explicit UndeclaredSkips(std::vector<std::string>* out) : out_(out) {}

  void OnTestEnd(const ::testing::TestInfo& info) override {
    const ::testing::TestResult& result = *info.result();
    if (!result.Skipped()) return;
    std::string message;
    for (int i = 0; i < result.total_part_count(); ++i) {
      const ::testing::TestPartResult& part = result.GetTestPartResult(i);
      if (!part.skipped()) continue;
      if (IsDeclaredCiSkip(part.message())) return;
      message = part.message();
    }
    out_->push_back(std::string(info.test_suite_name()) + "." + info.name() + ": " + message);
  }

 private:
  std::vector<std::string>* out_;
};

}  // namespace
}  // namespace kvserve::testing_ci

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  const bool ci = kvserve::testing_ci::InCi();
  std::vector<std::string> undeclared;
  if (ci) {
    ::testing::UnitTest::GetInstance()->listeners().Append(
        new kvserve::testing_ci::UndeclaredSkips(&undeclared));
  }
  const int status = RUN_ALL_TESTS();
  for (const std::string& s : undeclared) {
    std::fprintf(stderr, "[  CI FAIL ] skipped in CI without a declared reason: %s\n", s.c_str());
  }
  if (!undeclared.empty()) {
    std::fprintf(stderr,
                 "CI (CI=%s): %zu test(s) skipped without declaring why they cannot run in CI "
                 "(tests/test_util/ci_skip.h)\n",
                 std::getenv("CI"), undeclared.size());
    return 1;
  }
  return status;
}
