#ifndef KVSERVE_COMMON_RPC_LIVE_CALLS_H_
#define KVSERVE_COMMON_RPC_LIVE_CALLS_H_

#include <cstdint>
#include <memory>
#include <utility>

#include "absl/synchronization/mutex.h"

namespace kvserve {

/// Counts the client reactors of gRPC callback calls until they are destroyed, so that whoever
/// owns their channels can wait for them before letting the channels go.
///
/// Why: a grpc::ClientContext holds a reference to its grpc::Channel, and a reactor that deletes
/// itself from OnDone does so on one of gRPC's callback threads. Where gRPC's poller does not run
/// in the background (Debian's gRPC 1.51 here), every channel and server that uses the callback
/// API holds a reference to one process-wide completion queue polled by "nexting" threads; when a
/// nexting thread drops the last of those references, gRPC shuts that queue down from the thread
/// itself, fails to join it, frees the queue and then polls it again. Observed as a double free
/// in grpc_cq_internal_unref: the router's upstream reactor outlived the router that had owned
/// its worker's channel (docs/reliability.md, "Channels outlived by their calls").
///
/// Use: each reactor holds a Token as its first member (members are destroyed in reverse order,
/// so the token goes after the ClientContext); the channels' owner calls WaitForNone() before it
/// releases them. The count lives in shared state, so a token may still be unlocking it when
/// WaitForNone() returns and its LiveCalls is destroyed.
class LiveCalls {
 public:
  class Token {
   public:
    Token() = default;  // counts nothing
    Token(Token&& other) noexcept = default;
    Token& operator=(Token&& other) noexcept;
    Token(const Token&) = delete;
    Token& operator=(const Token&) = delete;
    ~Token();

   private:
    friend class LiveCalls;
    struct State;
    explicit Token(std::shared_ptr<State> state) : state_(std::move(state)) {}
    void Release();
    std::shared_ptr<State> state_;
  };

  LiveCalls();
  LiveCalls(const LiveCalls&) = delete;
  LiveCalls& operator=(const LiveCalls&) = delete;
  /// Waits for every token (see WaitForNone).
  ~LiveCalls();

  /// Counts one more call until the token is destroyed.
  Token Track();
  /// Blocks until no token of this counter is alive.
  void WaitForNone();
  /// Tokens alive now.
  int64_t live() const;

 private:
  std::shared_ptr<Token::State> state_;
};

}  // namespace kvserve

#endif  // KVSERVE_COMMON_RPC_LIVE_CALLS_H_
