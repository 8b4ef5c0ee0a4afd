#ifndef KVSERVE_COMMON_IO_SOCKET_FLUSH_H_
#define KVSERVE_COMMON_IO_SOCKET_FLUSH_H_

#include <cstdint>

#include "absl/time/time.h"

namespace kvserve {

/// Bytes this process has written to its connected TCP sockets that the peers' kernels have not
/// acknowledged yet (SIOCOUTQ summed over every TCP socket in /proc/self/fd).
int64_t UnacknowledgedSocketBytes();

/// Waits until every byte this process wrote to a TCP socket has been acknowledged by the peer's
/// kernel (UnacknowledgedSocketBytes() reads 0 twice, 5 ms apart), or until `deadline`. Returns
/// true when flushed.
///
/// Why a server needs it before it exits: closing a socket that still holds unread input (an
/// HTTP/2 WINDOW_UPDATE or PING the peer sent) makes the kernel send a reset and drop whatever
/// output it had not sent yet, so a client would lose the last frames of a call the server
/// finished. Once the peer's kernel holds every byte, a reset no longer loses data: the client
/// reads what was queued before it sees the reset.
bool WaitForSocketsFlushed(absl::Time deadline);

}  // namespace kvserve

#endif  // KVSERVE_COMMON_IO_SOCKET_FLUSH_H_
