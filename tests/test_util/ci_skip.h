#ifndef KVSERVE_TESTS_TEST_UTIL_CI_SKIP_H_
#define KVSERVE_TESTS_TEST_UTIL_CI_SKIP_H_

// In CI, a skipped test is a failure unless it declares why it cannot run there.
//
// A skip hides whatever the test would have caught, so CI (the environment variable CI set to
// anything but "", "0" or "false": .ci/run exports CI=true, as GitHub Actions and GitLab CI do)
// lets a test skip only when the skip message carries a declaration made with DeclaredCiSkip:
//
//   GTEST_SKIP() << "no CUDA device: " << reason << testing_ci::DeclaredCiSkip("CI has no GPU");
//
// Every kvserve_test binary runs through tests/test_util/test_main.cc, whose listener fails the
// run (exit status 1, after naming each test) for a skip without one; outside CI nothing changes.
// So a missing tool or library that CI installs (scripts/install-deps.sh), or a backend that was
// built but does not load, is a plain GTEST_SKIP: a skip on a developer's machine, a failure in
// CI. tests/test_util/ci_skip.sh is the same rule for ctest scripts and scripts/.

#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

namespace kvserve::testing_ci {

/// What marks a skip message as declared for CI (followed by the reason and "]").
inline constexpr char kDeclaredMarker[] = " [skip declared for CI: ";

/// Whether this run is CI: CI is set to anything but "", "0" or "false".
inline bool InCi() {
  const char* ci = std::getenv("CI");
  return ci != nullptr && std::strcmp(ci, "") != 0 && std::strcmp(ci, "0") != 0 &&
         std::strcmp(ci, "false") != 0;
}

/// The suffix that declares a skip allowed in CI; `why` says why CI cannot run the test (e.g.
/// "CI machines have no GPU").
inline std::string DeclaredCiSkip(std::string_view why) {
  return std::string(kDeclaredMarker) + std::string(why) + "]";
}

/// Whether a skip message declares why the test cannot run in CI.
inline bool IsDeclaredCiSkip(std::string_view message) {
  return message.find(kDeclaredMarker) != std::string_view::npos;
}

}  // namespace kvserve::testing_ci

#endif  // KVSERVE_TESTS_TEST_UTIL_CI_SKIP_H_
