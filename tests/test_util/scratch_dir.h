#ifndef KVSERVE_TESTS_TEST_UTIL_SCRATCH_DIR_H_
#define KVSERVE_TESTS_TEST_UTIL_SCRATCH_DIR_H_

#include <stdlib.h>

#include <filesystem>
#include <string>
#include <system_error>

#include "gtest/gtest.h"

namespace kvserve::test_util {
namespace internal {

/// Removes the running test's scratch directory when the test ends. gtest owns it once appended.
class ScratchDirRemover : public ::testing::EmptyTestEventListener {
 public:
  void OnTestEnd(const ::testing::TestInfo& /*info*/) override {
    if (dir_.empty()) return;
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
    dir_.clear();
  }

  std::string dir_;  // the current test's directory; empty until the test asks for it
};

}  // namespace internal

/// The running test's own empty scratch directory, made on first use by mkdtemp under
/// ::testing::TempDir() and removed with its contents when the test ends. Its name holds the
/// suite and test names plus a random suffix, so two processes running the same test at once
/// (two build trees, `ctest -j`) never share a file, and a test never sees a file that an
/// earlier test or an earlier run left behind. Every call within one test returns the same path.
inline std::string TestScratchDir() {
  static internal::ScratchDirRemover* const remover = [] {
    auto* r = new internal::ScratchDirRemover;
    ::testing::UnitTest::GetInstance()->listeners().Append(r);
    return r;
  }();
  if (remover->dir_.empty()) {
    const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string name = info == nullptr ? std::string("no_test")
                                       : std::string(info->test_suite_name()) + "." + info->name();
    for (char& c : name) {
      if (c == '/') c = '_';  // parameterised tests: "Prefix/Suite.Test/0"
    }
    std::string tmpl = ::testing::TempDir() + "/kvserve-" + name + "-XXXXXX";
    if (mkdtemp(tmpl.data()) == nullptr) {
      ADD_FAILURE() << "mkdtemp(" << tmpl << ") failed";
      return ::testing::TempDir();
    }
    remover->dir_ = tmpl;
  }
  return remover->dir_;
}

/// `name` inside TestScratchDir().
inline std::string ScratchPath(const std::string& name) { return TestScratchDir() + "/" + name; }

}  // namespace kvserve::test_util

#endif  // KVSERVE_TESTS_TEST_UTIL_SCRATCH_DIR_H_
