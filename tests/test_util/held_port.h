#ifndef KVSERVE_TESTS_TEST_UTIL_HELD_PORT_H_
#define KVSERVE_TESTS_TEST_UTIL_HELD_PORT_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

#include "gtest/gtest.h"

namespace kvserve::test_util {

/// How a HeldPort lets others bind its port.
enum class PortSharing {
  kExclusive,  // nobody else can bind it while held
  kReusePort,  // sockets that set SO_REUSEPORT (gRPC servers do, by default) can bind it too
};

/// A TCP port on 127.0.0.1 chosen by the kernel and held for the object's lifetime: a socket is
/// bound to it but never listens, so a connection to it is refused (ECONNREFUSED) instead of
/// reaching whoever took a port that a test closed and meant to reuse. With kReusePort a server
/// that the test starts later (or restarts) can bind the same port while no other test can take
/// it in between, because a plain bind() of a held port fails.
class HeldPort {
 public:
  explicit HeldPort(PortSharing sharing = PortSharing::kExclusive) {
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd_ < 0) {
      ADD_FAILURE() << "socket() failed";
      return;
    }
    if (sharing == PortSharing::kReusePort) {
      const int one = 1;
      if (setsockopt(fd_, SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one)) != 0) {
        ADD_FAILURE() << "setsockopt(SO_REUSEPORT) failed";
      }
    }
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = 0;
    socklen_t len = sizeof(addr);
    if (bind(fd_, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0 ||
        getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      ADD_FAILURE() << "bind/getsockname on 127.0.0.1:0 failed";
      return;
    }
    port_ = ntohs(addr.sin_port);
  }
  ~HeldPort() {
    if (fd_ >= 0) close(fd_);
  }
  HeldPort(const HeldPort&) = delete;
  HeldPort& operator=(const HeldPort&) = delete;

  /// The held port number (0 if binding failed, which has already failed the test).
  int port() const { return port_; }
  /// "127.0.0.1:<port>".
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }

 private:
  int fd_ = -1;
  int port_ = 0;
};

}  // namespace kvserve::test_util

#endif  // KVSERVE_TESTS_TEST_UTIL_HELD_PORT_H_
