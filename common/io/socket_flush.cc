#include "common/io/socket_flush.h"

#include <dirent.h>
#include <linux/sockios.h>
#include <netinet/in.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <chrono>
#include <cstdlib>
#include <thread>

#include "absl/time/clock.h"

namespace kvserve {
namespace {

// Unacknowledged output of `fd` when it is a TCP socket; 0 for anything else.
int64_t TcpOutputQueue(int fd) {
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) return 0;
  int value = 0;
  socklen_t len = sizeof(value);
  if (getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &value, &len) != 0) return 0;
  if (value != AF_INET && value != AF_INET6) return 0;
  len = sizeof(value);
  if (getsockopt(fd, SOL_SOCKET, SO_PROTOCOL, &value, &len) != 0 || value != IPPROTO_TCP) {
    return 0;
  }
  int queued = 0;
  if (ioctl(fd, SIOCOUTQ, &queued) != 0) return 0;  // e.g. a listening socket
  return queued;
}

}  // namespace

int64_t UnacknowledgedSocketBytes() {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return 0;
  const int own = dirfd(dir);
  int64_t total = 0;
  while (const dirent* entry = readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(entry->d_name, &end, 10);
    if (end == entry->d_name || *end != '\0' || fd == own) continue;
    total += TcpOutputQueue(static_cast<int>(fd));
  }
  closedir(dir);
  return total;
}

bool WaitForSocketsFlushed(absl::Time deadline) {
  int zero_reads = 0;
  while (true) {
    zero_reads = UnacknowledgedSocketBytes() == 0 ? zero_reads + 1 : 0;
    // Twice: a writer may hand its next chunk to the kernel just after the queue emptied.
    if (zero_reads >= 2) return true;
    if (absl::Now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

}  // namespace kvserve
