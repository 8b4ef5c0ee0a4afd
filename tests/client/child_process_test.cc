// ChildProcess: reading a child's lines, stopping it, and a child that never outlives its parent.

#include "client/cli/child_process.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "gtest/gtest.h"

namespace kvserve::cli {
namespace {

TEST(ChildProcessTest, ReadsLinesAndStops) {
  absl::StatusOr<ChildProcess> child =
      ChildProcess::Spawn({"/bin/sh", "-c", "echo hello world; exec sleep 600"});
  ASSERT_TRUE(child.ok()) << child.status();
  absl::StatusOr<std::string> rest = child->WaitForLine("hello ", std::chrono::seconds(30));
  ASSERT_TRUE(rest.ok()) << rest.status();
  EXPECT_EQ(*rest, "world");
  const int status = child->Stop(std::chrono::seconds(5));
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM) << status;
}

// A parent that dies without stopping its child (a test that aborts) must not leave the child
// running: it would keep serving, and hold the stdout of whoever started the parent open.
TEST(ChildProcessTest, ChildDiesWithItsParent) {
  // Orphans are re-parented to this process, so it can reap the grandchild and see how it ended.
  ASSERT_EQ(::prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const pid_t parent = ::fork();
  ASSERT_GE(parent, 0);
  if (parent == 0) {
    // The parent dies only once the child runs (it has printed its line): a parent that is gone
    // before the child starts makes the child exit by itself (status 127), not by the signal.
    absl::StatusOr<ChildProcess> child =
        ChildProcess::Spawn({"/bin/sh", "-c", "echo started; exec sleep 600"});
    const pid_t pid = child.ok() && child->WaitForLine("started", std::chrono::seconds(30)).ok()
                          ? child->pid()
                          : -1;
    if (::write(fds[1], &pid, sizeof(pid)) != sizeof(pid)) ::_exit(2);
    ::_exit(0);  // no destructors: the child is not stopped
  }
  ::close(fds[1]);
  pid_t grandchild = -1;
  ASSERT_EQ(::read(fds[0], &grandchild, sizeof(grandchild)),
            static_cast<ssize_t>(sizeof(grandchild)));
  ::close(fds[0]);
  ASSERT_GT(grandchild, 0);
  int parent_status = 0;
  ASSERT_EQ(::waitpid(parent, &parent_status, 0), parent);
  // The limit only bounds a child that never dies; SIGKILL arrives as the parent exits.
  int status = 0;
  pid_t reaped = 0;
  for (int i = 0; i < 300 && reaped == 0; ++i) {
    reaped = ::waitpid(grandchild, &status, WNOHANG);
    if (reaped == 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (reaped == 0) {
    ::kill(grandchild, SIGKILL);
    ::waitpid(grandchild, &status, 0);
    FAIL() << "the child outlived its parent by 30 s";
  }
  ASSERT_EQ(reaped, grandchild);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << status;
}

}  // namespace
}  // namespace kvserve::cli
