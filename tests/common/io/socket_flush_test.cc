#include "common/io/socket_flush.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace kvserve {
namespace {

// A connected loopback TCP pair whose reader takes nothing until asked to.
struct TcpPair {
  int writer = -1;
  int reader = -1;
  ~TcpPair() {
    if (writer >= 0) close(writer);
    if (reader >= 0) close(reader);
  }
};

void Connect(TcpPair* pair) {
  const int listener = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(listener, 0);
  // Small buffers on both sides, so a few hundred KiB cannot all be in flight.
  const int small = 16 << 10;
  ASSERT_EQ(setsockopt(listener, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small)), 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  ASSERT_EQ(listen(listener, 1), 0);
  socklen_t len = sizeof(address);
  ASSERT_EQ(getsockname(listener, reinterpret_cast<sockaddr*>(&address), &len), 0);
  pair->writer = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(pair->writer, 0);
  ASSERT_EQ(setsockopt(pair->writer, SOL_SOCKET, SO_SNDBUF, &small, sizeof(small)), 0);
  ASSERT_EQ(connect(pair->writer, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  pair->reader = accept(listener, nullptr, nullptr);
  close(listener);
  ASSERT_GE(pair->reader, 0);
}

// Writes without blocking until the kernel takes no more; returns the bytes written.
size_t FillUntilFull(int fd) {
  EXPECT_EQ(fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK), 0);
  const std::vector<char> chunk(4096, 'x');
  size_t total = 0;
  while (true) {
    const ssize_t n = write(fd, chunk.data(), chunk.size());
    if (n > 0) {
      total += static_cast<size_t>(n);
      continue;
    }
    EXPECT_TRUE(n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) << errno;
    return total;
  }
}

TEST(SocketFlushTest, IdleProcessIsFlushed) {
  EXPECT_EQ(UnacknowledgedSocketBytes(), 0);
  EXPECT_TRUE(WaitForSocketsFlushed(absl::Now() + absl::Seconds(30)));
}

TEST(SocketFlushTest, UnreadPeerHoldsTheFlushUntilItReads) {
  TcpPair pair;
  ASSERT_NO_FATAL_FAILURE(Connect(&pair));
  const size_t written = FillUntilFull(pair.writer);
  ASSERT_GT(written, 0u);
  // The peer reads nothing, so its window is shut and the writer's queue cannot drain.
  EXPECT_GT(UnacknowledgedSocketBytes(), 0);
  EXPECT_FALSE(WaitForSocketsFlushed(absl::Now() + absl::Milliseconds(20)));

  std::thread drain([&] {
    std::vector<char> buffer(1 << 16);
    size_t got = 0;
    while (got < written) {
      const ssize_t n = read(pair.reader, buffer.data(), buffer.size());
      if (n <= 0) break;
      got += static_cast<size_t>(n);
    }
    EXPECT_EQ(got, written);
  });
  EXPECT_TRUE(WaitForSocketsFlushed(absl::Now() + absl::Seconds(60)));
  EXPECT_EQ(UnacknowledgedSocketBytes(), 0);
  drain.join();
}

TEST(SocketFlushTest, OnlyTcpSocketsCount) {
  int fds[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
  ASSERT_GT(FillUntilFull(fds[0]), 0u);
  EXPECT_EQ(UnacknowledgedSocketBytes(), 0);
  close(fds[0]);
  close(fds[1]);
}

}  // namespace
}  // namespace kvserve
