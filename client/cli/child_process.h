#ifndef KVSERVE_CLIENT_CLI_CHILD_PROCESS_H_
#define KVSERVE_CLIENT_CLI_CHILD_PROCESS_H_

#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace kvserve::cli {

/// A child process whose stdout is read line by line by its parent (stderr is inherited, so
/// its logs reach the terminal). Move-only; the destructor kills a still-running child, and the
/// child is killed (SIGKILL) when the thread that spawned it exits, so spawn from a thread that
/// outlives the child (the main thread).
class ChildProcess {
 public:
  /// Starts `argv[0]` with `argv`; argv[0] is a path.
  static absl::StatusOr<ChildProcess> Spawn(const std::vector<std::string>& argv);

  ChildProcess(ChildProcess&& other) noexcept;
  ChildProcess& operator=(ChildProcess&& other) noexcept;
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;
  ~ChildProcess();

  /// Reads stdout until a line starting with `prefix` arrives and returns the rest of it.
  /// DEADLINE_EXCEEDED after `timeout`; UNAVAILABLE if the child exits first.
  absl::StatusOr<std::string> WaitForLine(const std::string& prefix,
                                          std::chrono::milliseconds timeout);
  /// Non-blocking: true (and the exit status) once the child has exited.
  bool Exited(int* status);
  /// SIGTERM, then SIGKILL if it has not exited after `grace`; reaps it. Returns its status.
  int Stop(std::chrono::milliseconds grace);

  pid_t pid() const { return pid_; }

 private:
  ChildProcess(pid_t pid, int stdout_fd) : pid_(pid), stdout_fd_(stdout_fd) {}

  pid_t pid_ = -1;
  int stdout_fd_ = -1;
  bool reaped_ = false;
  int status_ = 0;
  std::string buffer_;
};

}  // namespace kvserve::cli

#endif  // KVSERVE_CLIENT_CLI_CHILD_PROCESS_H_
