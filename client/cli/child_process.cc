#include "client/cli/child_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace kvserve::cli {

absl::StatusOr<ChildProcess> ChildProcess::Spawn(const std::vector<std::string>& argv) {
  if (argv.empty()) return absl::InvalidArgumentError("no command to start");
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("pipe: ", std::strerror(errno)));
  }
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    return absl::InternalError(absl::StrCat("fork: ", std::strerror(errno)));
  }
  if (pid == 0) {
    // Child: default signal mask (the parent may block signals it waits for), stdout into
    // the pipe.
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    // Killed with its parent: a parent that dies without stopping it (a test that aborts, `kvserve
    // up` killed) would otherwise leave it serving, and holding the stdout of whoever ran the
    // parent (ctest waited on such an orphaned worker until it was killed by hand). SIGKILL, as a
    // child the parent paused with SIGSTOP would never act on SIGTERM. If the parent is already
    // gone, the signal will not come: exit now.
    if (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || ::getppid() != parent) ::_exit(127);
    ::dup2(fds[1], STDOUT_FILENO);
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  ::close(fds[1]);
  return ChildProcess(pid, fds[0]);
}

ChildProcess::ChildProcess(ChildProcess&& other) noexcept
    : pid_(std::exchange(other.pid_, -1)),
      stdout_fd_(std::exchange(other.stdout_fd_, -1)),
      reaped_(other.reaped_),
      status_(other.status_),
      buffer_(std::move(other.buffer_)) {}

ChildProcess& ChildProcess::operator=(ChildProcess&& other) noexcept {
  if (this != &other) {
    if (pid_ > 0 && !reaped_) Stop(std::chrono::milliseconds(0));
    if (stdout_fd_ >= 0) ::close(stdout_fd_);
    pid_ = std::exchange(other.pid_, -1);
    stdout_fd_ = std::exchange(other.stdout_fd_, -1);
    reaped_ = other.reaped_;
    status_ = other.status_;
    buffer_ = std::move(other.buffer_);
  }
  return *this;
}

ChildProcess::~ChildProcess() {
  if (pid_ > 0 && !reaped_) Stop(std::chrono::milliseconds(0));
  if (stdout_fd_ >= 0) ::close(stdout_fd_);
}

absl::StatusOr<std::string> ChildProcess::WaitForLine(const std::string& prefix,
                                                      std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    for (size_t nl; (nl = buffer_.find('\n')) != std::string::npos;) {
      std::string line = buffer_.substr(0, nl);
      buffer_.erase(0, nl + 1);
      if (line.rfind(prefix, 0) == 0) return line.substr(prefix.size());
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      return absl::DeadlineExceededError(
          absl::StrCat("process ", pid_, " did not print \"", prefix, "\" in time"));
    }
    pollfd p{stdout_fd_, POLLIN, 0};
    const int r = ::poll(&p, 1, static_cast<int>(left.count()));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) continue;
    char buf[4096];
    const ssize_t n = ::read(stdout_fd_, buf, sizeof(buf));
    if (n <= 0) {
      return absl::UnavailableError(absl::StrCat("process ", pid_, " exited before printing \"",
                                                 prefix, "\""));
    }
    buffer_.append(buf, static_cast<size_t>(n));
  }
}

bool ChildProcess::Exited(int* status) {
  if (!reaped_) {
    const pid_t r = ::waitpid(pid_, &status_, WNOHANG);
    if (r == pid_) reaped_ = true;
  }
  if (reaped_ && status != nullptr) *status = status_;
  return reaped_;
}

int ChildProcess::Stop(std::chrono::milliseconds grace) {
  if (pid_ <= 0) return 0;
  if (Exited(nullptr)) return status_;
  ::kill(pid_, SIGTERM);
  const auto deadline = std::chrono::steady_clock::now() + grace;
  while (std::chrono::steady_clock::now() < deadline) {
    if (Exited(nullptr)) return status_;
    ::usleep(10000);
  }
  ::kill(pid_, SIGKILL);
  ::waitpid(pid_, &status_, 0);
  reaped_ = true;
  return status_;
}

}  // namespace kvserve::cli
