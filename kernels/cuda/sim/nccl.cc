// NCCL on the simulator, with the two kinds of communicator kvserve uses.
//
// ncclCommInitAll makes a clique whose ranks are threads of this process (one per device, as
// kvserve's tensor parallelism runs them); they run the collectives. A collective is posted when
// its stream reaches it (at once, or at graph replay) and, as on a GPU, the call returns at once:
// the rank's stream then waits for it (Pending, internal.h) before its next op and in
// cudaStreamSynchronize. The last rank to post does the whole operation, in rank order, so every
// rank gets bit-identical results. ncclCommAbort completes the posted round without data and frees
// the communicator (AddressSanitizer then catches any use after it).
//
// ncclGetUniqueId + ncclCommInitRank make ranks that may live in different processes of this
// machine (pipeline stages, one `kvserve worker` each); they do point-to-point (ncclSend/ncclRecv).
// Each rank listens on a Linux abstract-namespace Unix socket named from the id's random token and
// its rank (so nothing is left on disk), and one I/O thread per communicator moves the bytes with
// non-blocking sockets and poll(): it connects to a peer lazily, at the first send to it, retrying
// while the peer's socket does not exist yet; it reads every peer's messages as soon as they come,
// staging them until a recv takes them, so a send completes without waiting for the peer's recv
// and one thread may post a send and then a recv to the same peer (stream order would otherwise
// deadlock it); the messages of an ordered pair of ranks match in FIFO order. Ops are stream-
// ordered and asynchronous like the collectives. Unlike real NCCL, ncclCommInitRank does not wait
// for the other ranks, so one thread may init several ranks of one id without ncclGroupStart.
// ncclCommInitRankConfig with config->blocking = 0 is NCCL's non-blocking init: the same
// communicator, whose I/O thread connects to every peer at once (with the same retries, and the
// hello) instead of at the first send, and whose ncclCommGetAsyncError says ncclInProgress until
// every peer has joined: this rank's hello went out on its connection to the peer, and the peer's
// connection to this rank came in (every rank of a non-blocking init connects to all). Those are
// the connections later sends use, so the wire is the same as with lazy connects. A peer that
// never comes leaves the init in progress for ever (real NCCL leaves that timeout to the caller,
// who then calls ncclCommAbort); a peer that drops its end before it joined (it refused the
// hello, or it exited or aborted) fails it.
// A failure (a peer that closed its end or died, a recv whose size differs from the message, an op
// past the timeout) breaks the communicator: its posted ops complete without data, its
// connections close (so its peers fail too instead of waiting), ncclCommGetAsyncError reports the
// error, ncclGetLastError says which peer and why, and later sends and recvs return the error.
//
// A stream left waiting longer than KVSERVE_SIM_NCCL_TIMEOUT_S (default 120 s) fails instead of
// hanging.

#include "nccl.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <random>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "absl/strings/str_format.h"
#include "cuda_bf16.h"
#include "cuda_fp16.h"
#include "internal.h"

namespace kvsim {
namespace {

enum class Kind : uint8_t { kAllReduce, kAllGather };

struct Post {
  Kind kind;
  const void* send;
  void* recv;
  size_t count;
  ncclDataType_t type;
  ncclRedOp_t op;
  std::shared_ptr<Pending> done;  // finished when the round has run (or was aborted)
};

struct Clique {
  explicit Clique(int n) : size(n), posts(static_cast<size_t>(n)) {}
  const int size;
  std::mutex mu;
  uint64_t generation = 0;
  int arrived = 0;
  bool aborted = false;
  ncclResult_t round_result = ncclSuccess;
  std::vector<Post> posts;
};

size_t TypeBytes(ncclDataType_t t) {
  switch (t) {
    case ncclInt8:
    case ncclUint8:
      return 1;
    case ncclFloat16:
    case ncclBfloat16:
      return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
      return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64:
      return 8;
  }
  return 0;
}

double LoadAs(const void* p, ncclDataType_t t, size_t i) {
  switch (t) {
    case ncclInt8:
      return static_cast<const int8_t*>(p)[i];
    case ncclUint8:
      return static_cast<const uint8_t*>(p)[i];
    case ncclInt32:
      return static_cast<const int32_t*>(p)[i];
    case ncclUint32:
      return static_cast<const uint32_t*>(p)[i];
    case ncclInt64:
      return static_cast<double>(static_cast<const int64_t*>(p)[i]);
    case ncclUint64:
      return static_cast<double>(static_cast<const uint64_t*>(p)[i]);
    case ncclFloat16:
      return __half2float(static_cast<const __half*>(p)[i]);
    case ncclBfloat16:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    case ncclFloat32:
      return static_cast<const float*>(p)[i];
    case ncclFloat64:
      return static_cast<const double*>(p)[i];
  }
  return 0;
}

/// out = a (op) b in the element type's own arithmetic (f32 adds as f32, like NCCL's kernels).
void Combine(ncclDataType_t t, ncclRedOp_t op, const void* a, size_t i, void* out) {
  auto apply = [op](auto x, auto y) {
    switch (op) {
      case ncclSum:
        return static_cast<decltype(x)>(x + y);
      case ncclProd:
        return static_cast<decltype(x)>(x * y);
      case ncclMax:
        return x < y ? y : x;
      case ncclMin:
        return y < x ? y : x;
    }
    return x;
  };
  switch (t) {
    case ncclFloat32: {
      auto* o = static_cast<float*>(out);
      o[i] = apply(o[i], static_cast<const float*>(a)[i]);
      break;
    }
    case ncclFloat64: {
      auto* o = static_cast<double*>(out);
      o[i] = apply(o[i], static_cast<const double*>(a)[i]);
      break;
    }
    case ncclInt32: {
      auto* o = static_cast<int32_t*>(out);
      o[i] = apply(o[i], static_cast<const int32_t*>(a)[i]);
      break;
    }
    case ncclInt64: {
      auto* o = static_cast<int64_t*>(out);
      o[i] = apply(o[i], static_cast<const int64_t*>(a)[i]);
      break;
    }
    case ncclFloat16: {
      auto* o = static_cast<__half*>(out);
      o[i] = __float2half_rn(apply(__half2float(o[i]), static_cast<float>(LoadAs(a, t, i))));
      break;
    }
    case ncclBfloat16: {
      auto* o = static_cast<__nv_bfloat16*>(out);
      o[i] =
          __float2bfloat16_rn(apply(__bfloat162float(o[i]), static_cast<float>(LoadAs(a, t, i))));
      break;
    }
    default:  // not reducible: refused before a round starts
      break;
  }
}

bool Reducible(ncclDataType_t t) {
  return t == ncclFloat32 || t == ncclFloat64 || t == ncclInt32 || t == ncclInt64 ||
         t == ncclFloat16 || t == ncclBfloat16;
}

/// The last rank of a round does the whole collective.
ncclResult_t RunRound(Clique& c) {
  const Post& p0 = c.posts[0];
  for (const Post& p : c.posts) {
    if (p.kind != p0.kind || p.count != p0.count || p.type != p0.type ||
        (p.kind == Kind::kAllReduce && p.op != p0.op)) {
      std::fprintf(stderr, "kvsim: NCCL ranks called different collectives in one round\n");
      return ncclInvalidUsage;
    }
  }
  const size_t bytes = p0.count * TypeBytes(p0.type);
  if (p0.kind == Kind::kAllReduce) {
    std::vector<unsigned char> acc(bytes);
    if (bytes > 0) std::memcpy(acc.data(), c.posts[0].send, bytes);
    for (size_t r = 1; r < c.posts.size(); ++r) {
      for (size_t i = 0; i < p0.count; ++i) Combine(p0.type, p0.op, c.posts[r].send, i, acc.data());
    }
    for (const Post& p : c.posts) {
      if (bytes > 0) std::memcpy(p.recv, acc.data(), bytes);
    }
  } else {
    std::vector<unsigned char> all(bytes * c.posts.size());
    for (size_t r = 0; r < c.posts.size(); ++r) {
      if (bytes > 0) std::memcpy(all.data() + r * bytes, c.posts[r].send, bytes);
    }
    for (const Post& p : c.posts) {
      if (!all.empty()) std::memcpy(p.recv, all.data(), all.size());
    }
  }
  return ncclSuccess;
}

/// Rank `rank`'s part of one round: posts it; the last rank runs the round for all.
ncclResult_t Arrive(Clique& c, int rank, const Post& post) {
  std::lock_guard<std::mutex> lock(c.mu);
  if (c.aborted) {
    post.done->Finish();
    return ncclRemoteError;
  }
  c.posts[static_cast<size_t>(rank)] = post;
  if (++c.arrived < c.size) return ncclSuccess;
  c.round_result = RunRound(c);
  c.arrived = 0;
  ++c.generation;
  for (Post& p : c.posts) {
    p.done->Finish();
    p.done.reset();
  }
  return c.round_result;
}

/// Completes the posted part of the current round without data, for ever after.
void AbortClique(Clique& c) {
  std::lock_guard<std::mutex> lock(c.mu);
  c.aborted = true;
  for (Post& p : c.posts) {
    if (p.done != nullptr) p.done->Finish();
    p.done.reset();
  }
}

// ---- point-to-point (ncclCommInitRank communicators) --------------------------------------------

using Clock = std::chrono::steady_clock;

/// The first bytes of an ncclUniqueId from ncclGetUniqueId (its random token follows), and of
/// every connection's hello: a foreign id or connection is refused rather than misread.
constexpr char kIdMagic[8] = {'k', 'v', 's', 'i', 'm', 'n', 'c', 'l'};
constexpr size_t kTokenOffset = sizeof kIdMagic;

/// KVSERVE_SIM_NCCL_TIMEOUT_S, read per op as runtime.cc reads it for the stream's own wait.
int TimeoutSeconds() {
  const char* v = std::getenv("KVSERVE_SIM_NCCL_TIMEOUT_S");
  const int s = v != nullptr ? std::atoi(v) : 0;
  return s > 0 ? s : 120;
}

/// How much earlier than the timeout an op gives up. The stream's backstop (runtime.cc) fails a
/// stream that waited the whole timeout with cudaErrorLaunchFailure, and it starts counting when
/// the stream starts waiting, which is just after the op was posted: failing a little earlier
/// makes the op's own error (ncclSystemError, naming the peer) the one the caller sees.
constexpr auto kDeadlineMargin = std::chrono::milliseconds(250);

/// A larger byte count in a message header is a corrupt stream, not a message.
constexpr uint64_t kMaxMessageBytes = uint64_t{1} << 40;

/// What a connection starts with: which rank of which id connects.
struct Hello {
  char magic[sizeof kIdMagic];
  uint64_t token;
  int32_t rank;
  int32_t nranks;
};

/// A posted send or recv, from the stream reaching it until it completes or fails.
struct P2pOp {
  unsigned char* data = nullptr;  // the caller's device buffer (only read, for a send)
  size_t bytes = 0;
  uint64_t header = 0;  // a send's wire header: its byte count
  size_t moved = 0;     // a send's header and payload bytes written so far
  Clock::time_point deadline;
  std::shared_ptr<Pending> done;  // its stream waits for it
};

/// One peer, as this rank sees it. Each ordered pair of ranks has its own connection, made by
/// the sender, so the two directions never wait for each other.
struct Link {
  std::deque<P2pOp> sends;  // in posting order: the wire carries them in this order
  std::deque<P2pOp> recvs;
  // Ours to the peer's socket (we write): the hello, then each send's header and payload.
  int out_fd = -1;
  size_t hello_sent = 0;
  std::string out_closed;  // why the peer dropped it; "" while open or never opened
  Clock::time_point next_connect{};
  std::chrono::milliseconds backoff{1};
  // The peer's to ours (we read), read whenever bytes come.
  int in_fd = -1;
  bool in_seen = false;   // the peer has connected (in_fd may have closed since)
  std::string in_closed;  // why the peer's connection ended; "" while open or never opened
  uint64_t in_header = 0;
  size_t in_header_got = 0;
  std::vector<unsigned char> in_payload;
  size_t in_payload_got = 0;
  std::deque<std::vector<unsigned char>> arrived;  // whole messages no recv has taken yet
};

/// An accepted connection whose hello (so whose rank) is not whole yet.
struct Incoming {
  int fd = -1;
  Hello hello{};
  size_t got = 0;
};

struct SocketName {
  sockaddr_un addr{};
  socklen_t len = 0;
};

/// Rank `rank`'s socket: in the abstract namespace (a leading NUL), so the name lives exactly as
/// long as the listening descriptor, in no directory, and a crashed process leaves nothing behind.
SocketName NameOf(uint64_t token, int rank) {
  SocketName n;
  n.addr.sun_family = AF_UNIX;
  const int chars =
      std::snprintf(n.addr.sun_path + 1, sizeof n.addr.sun_path - 1, "kvsim-nccl-%016llx-%d",
                    static_cast<unsigned long long>(token), rank);
  n.len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + static_cast<size_t>(chars));
  return n;
}

void ShutAndClose(int* fd) {
  if (*fd < 0) return;
  // shutdown() first: the peer sees the end at once even if a descriptor leaked to a child.
  ::shutdown(*fd, SHUT_RDWR);
  ::close(*fd);
  *fd = -1;
}

enum class Io { kDone, kBlocked, kClosed, kFailed };

/// Moves bytes [*moved, len) of `p` to (`out`) or from a non-blocking socket, as far as it goes
/// without blocking. kClosed: the peer's end is gone (EOF, ECONNRESET, EPIPE); `*err` is the
/// errno of kClosed and kFailed (0 for EOF).
Io Transfer(int fd, bool out, unsigned char* p, size_t len, size_t* moved, int* err) {
  while (*moved < len) {
    const ssize_t n = out ? ::send(fd, p + *moved, len - *moved, MSG_NOSIGNAL | MSG_DONTWAIT)
                          : ::recv(fd, p + *moved, len - *moved, MSG_DONTWAIT);
    if (n > 0) {
      *moved += static_cast<size_t>(n);
      continue;
    }
    if (n == 0) {
      if (!out) {
        *err = 0;
        return Io::kClosed;
      }
      return Io::kBlocked;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return Io::kBlocked;
    *err = errno;
    return errno == ECONNRESET || errno == EPIPE ? Io::kClosed : Io::kFailed;
  }
  return Io::kDone;
}

/// One rank of an ncclCommInitRank communicator: its socket, its links and the I/O thread that
/// serves them. Shared by the ncclComm and by the stream ops it posted (which may outlive it in
/// a graph), so a late op finds it closed instead of freed.
class P2pComm {
 public:
  /// `eager`: a non-blocking init's communicator, which connects to every peer at once and is
  /// in progress until all have joined.
  P2pComm(uint64_t token, int nranks, int rank, bool eager)
      : token_(token),
        nranks_(nranks),
        rank_(rank),
        eager_(eager),
        joined_(!eager),
        links_(static_cast<size_t>(nranks)) {}
  ~P2pComm() {
    Close(/*drain=*/false);
    if (wake_fd_ >= 0) ::close(wake_fd_);
  }
  P2pComm(const P2pComm&) = delete;
  P2pComm& operator=(const P2pComm&) = delete;

  int nranks() const { return nranks_; }
  int rank() const { return rank_; }

  /// Binds and listens on this rank's socket and starts the I/O thread; waits for no peer.
  ncclResult_t Start() {
    listen_fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (listen_fd_ < 0) return SystemError("socket");
    const SocketName name = NameOf(token_, rank_);
    if (::bind(listen_fd_, reinterpret_cast<const sockaddr*>(&name.addr), name.len) != 0) {
      if (errno == EADDRINUSE) {
        std::fprintf(stderr,
                     "kvsim: ncclCommInitRank: rank %d of this id exists already (a communicator "
                     "of this or another process holds it)\n",
                     rank_);
        return ncclInvalidUsage;
      }
      return SystemError("bind");
    }
    if (::listen(listen_fd_, SOMAXCONN) != 0) return SystemError("listen");
    wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (wake_fd_ < 0) return SystemError("eventfd");
    try {
      thread_ = std::thread([this] { Run(); });
    } catch (const std::system_error& e) {
      std::fprintf(stderr, "kvsim: ncclCommInitRank (rank %d): no I/O thread: %s\n", rank_,
                   e.what());
      return ncclSystemError;
    }
    return ncclSuccess;
  }

  /// Hands a send (or recv) to the I/O thread; called when its stream reaches it. A broken or
  /// closed communicator completes it at once, without data, and says so.
  ncclResult_t Post(bool send, int peer, P2pOp op) {
    std::lock_guard<std::mutex> lock(mu_);
    if (closing_) {
      op.done->Finish();
      std::fprintf(stderr,
                   "kvsim: NCCL rank %d: a %s reached its stream after the communicator "
                   "was destroyed or aborted\n",
                   rank_, send ? "send" : "recv");
      return ncclInvalidUsage;
    }
    if (error_ != ncclSuccess) {
      op.done->Finish();
      return error_;
    }
    op.header = op.bytes;
    op.deadline = Clock::now() + std::chrono::seconds(TimeoutSeconds()) - kDeadlineMargin;
    Link& link = links_[static_cast<size_t>(peer)];
    (send ? link.sends : link.recvs).push_back(std::move(op));
    Wake();
    return ncclSuccess;
  }

  /// The error, else ncclInProgress while a non-blocking init waits for peers, else ncclSuccess.
  ncclResult_t AsyncError() {
    std::lock_guard<std::mutex> lock(mu_);
    if (error_ != ncclSuccess) return error_;
    return joined_ ? ncclSuccess : ncclInProgress;
  }

  /// What broke the communicator, or nullptr. Set once and never changed after, so the text
  /// stays valid for the communicator's life.
  const char* ErrorText() {
    std::lock_guard<std::mutex> lock(mu_);
    return error_ != ncclSuccess ? error_text_.c_str() : nullptr;
  }

  /// Stops the I/O thread and closes every socket; posted ops still unfinished complete without
  /// data. With `drain` (ncclCommDestroy), first waits for the posted ops to finish: each
  /// completes, fails, or reaches its deadline, so the wait is bounded by the timeout.
  void Close(bool drain) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (closing_) return;
      if (drain) idle_cv_.wait(lock, [this] { return NothingPosted(); });
      closing_ = true;
      Wake();
    }
    if (thread_.joinable()) thread_.join();
    std::lock_guard<std::mutex> lock(mu_);
    DropConnections();
    FinishAll();
    ShutAndClose(&listen_fd_);
  }

 private:
  ncclResult_t SystemError(const char* call) {
    std::fprintf(stderr, "kvsim: ncclCommInitRank (rank %d): %s: %s\n", rank_, call,
                 std::strerror(errno));
    return ncclSystemError;
  }

  void Wake() {
    const uint64_t one = 1;
    if (wake_fd_ >= 0) (void)!::write(wake_fd_, &one, sizeof one);
  }

  bool NothingPosted() const {
    for (const Link& l : links_) {
      if (!l.sends.empty() || !l.recvs.empty()) return false;
    }
    return true;
  }

  void Complete(std::deque<P2pOp>& queue) {
    queue.front().done->Finish();
    queue.pop_front();
    idle_cv_.notify_all();
  }

  void FinishAll() {
    for (Link& l : links_) {
      for (P2pOp& op : l.sends) op.done->Finish();
      for (P2pOp& op : l.recvs) op.done->Finish();
      l.sends.clear();
      l.recvs.clear();
    }
    idle_cv_.notify_all();
  }

  void DropConnections() {
    for (Link& l : links_) {
      ShutAndClose(&l.out_fd);
      ShutAndClose(&l.in_fd);
      l.arrived.clear();
      l.in_payload.clear();
    }
    for (Incoming& in : incoming_) ShutAndClose(&in.fd);
    incoming_.clear();
  }

  /// Breaks the communicator (the first failure wins): every posted op completes without data,
  /// and the connections close, so the peers' ops fail at once instead of at their timeout.
  void Fail(ncclResult_t code, std::string text) {
    if (error_ != ncclSuccess) return;
    error_ = code;
    error_text_ = std::move(text);
    std::fprintf(stderr, "kvsim: NCCL %s\n", error_text_.c_str());
    DropConnections();
    FinishAll();
  }

  void Run() {
    std::vector<pollfd> fds;
    std::unique_lock<std::mutex> lock(mu_);
    while (!closing_) {
      Progress();
      fds.clear();
      const int timeout_ms = PollSet(&fds);
      lock.unlock();
      ::poll(fds.data(), fds.size(), timeout_ms);
      uint64_t wakes = 0;
      (void)!::read(wake_fd_, &wakes, sizeof wakes);
      lock.lock();
    }
  }

  /// Everything the sockets allow now, without blocking.
  void Progress() {
    Accept();
    ReadHellos();
    for (int p = 0; p < nranks_ && error_ == ncclSuccess; ++p) {
      if (p == rank_) continue;
      ReadFrom(p);
      if (error_ == ncclSuccess) WatchOut(p);
      if (error_ == ncclSuccess) Deliver(p);
      if (error_ == ncclSuccess) WriteTo(p);
    }
    if (error_ == ncclSuccess && !joined_) CheckJoined();
    if (error_ == ncclSuccess) CheckDeadlines();
  }

  /// Whether this rank must (still) connect to `p` and say hello without a send: a non-blocking
  /// init does so for every peer, until the peer drops the connection (never reconnecting, as a
  /// lazy connect would not: that peer is gone).
  bool Greeting(int p) const {
    const Link& l = links_[static_cast<size_t>(p)];
    return eager_ && p != rank_ && l.out_closed.empty() && l.hello_sent < sizeof(Hello);
  }

  /// A non-blocking init is done once every peer has joined: this rank's hello is out on its
  /// connection to the peer (the peer's socket exists), and the peer's connection has come in
  /// with a hello this rank accepted (the peer's communicator exists and agrees on the id and
  /// nranks). A peer that drops its end before it joined fails the init instead: it refused this
  /// rank's hello, or its process exited or its communicator was aborted. A peer that never comes
  /// leaves the init in progress: the caller decides how long to wait.
  void CheckJoined() {
    bool all = true;
    for (int p = 0; p < nranks_; ++p) {
      if (p == rank_) continue;
      const Link& l = links_[static_cast<size_t>(p)];
      if (l.hello_sent == sizeof(Hello) && l.in_seen) continue;
      all = false;
      if (!l.out_closed.empty() || !l.in_closed.empty()) {
        Fail(
            ncclRemoteError,
            absl::StrFormat("rank %d: the non-blocking init failed: rank %d %s before it joined "
                            "(it refused this rank's hello, as when the ranks disagree on "
                            "nranks, or its process exited or its communicator was aborted)",
                            rank_, p, (l.out_closed.empty() ? l.in_closed : l.out_closed).c_str()));
        return;
      }
    }
    joined_ = all;
  }

  /// What poll() waits for, and how long (ms; -1: until something happens).
  int PollSet(std::vector<pollfd>* fds) const {
    fds->push_back(pollfd{wake_fd_, POLLIN, 0});
    if (listen_fd_ >= 0) fds->push_back(pollfd{listen_fd_, POLLIN, 0});
    for (const Incoming& in : incoming_) fds->push_back(pollfd{in.fd, POLLIN, 0});
    std::optional<Clock::time_point> wake_at;
    auto sooner = [&wake_at](Clock::time_point t) {
      if (!wake_at.has_value() || t < *wake_at) wake_at = t;
    };
    for (int p = 0; p < nranks_; ++p) {
      const Link& l = links_[static_cast<size_t>(p)];
      if (l.in_fd >= 0) fds->push_back(pollfd{l.in_fd, POLLIN, 0});
      // POLLIN on the connection we send on: only its end is ever readable (WatchOut).
      if (l.out_fd >= 0) {
        const bool writing = !l.sends.empty() || l.hello_sent < sizeof(Hello);
        fds->push_back(
            pollfd{l.out_fd, static_cast<short>(writing ? POLLIN | POLLOUT : POLLIN), 0});
      }
      if (l.out_fd < 0 && (!l.sends.empty() || Greeting(p))) sooner(l.next_connect);
      if (!l.sends.empty()) sooner(l.sends.front().deadline);
      if (!l.recvs.empty()) sooner(l.recvs.front().deadline);
    }
    if (!wake_at.has_value()) return -1;
    const int64_t ms =
        std::chrono::ceil<std::chrono::milliseconds>(*wake_at - Clock::now()).count();
    return static_cast<int>(std::clamp<int64_t>(ms, 0, 60'000));
  }

  void Accept() {
    while (listen_fd_ >= 0) {
      int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        return;  // EAGAIN (or EMFILE: the connection waits in the backlog until a later pass)
      }
      if (error_ != ncclSuccess) {
        ShutAndClose(&fd);  // broken: the peer's send fails at once rather than at its timeout
        continue;
      }
      incoming_.push_back(Incoming{fd});
    }
  }

  void ReadHellos() {
    for (size_t i = 0; i < incoming_.size();) {
      Incoming& in = incoming_[i];
      int err = 0;
      const Io r = Transfer(in.fd, /*out=*/false, reinterpret_cast<unsigned char*>(&in.hello),
                            sizeof in.hello, &in.got, &err);
      if (r == Io::kBlocked) {
        ++i;
        continue;
      }
      if (r == Io::kDone) {
        const Hello& h = in.hello;
        const int p = h.rank;
        if (std::memcmp(h.magic, kIdMagic, sizeof kIdMagic) == 0 && h.token == token_ &&
            h.nranks == nranks_ && p >= 0 && p < nranks_ && p != rank_ &&
            !links_[static_cast<size_t>(p)].in_seen) {
          Link& l = links_[static_cast<size_t>(p)];
          l.in_fd = in.fd;
          l.in_seen = true;
          incoming_.erase(incoming_.begin() + static_cast<std::ptrdiff_t>(i));
          continue;
        }
        std::fprintf(stderr,
                     "kvsim: NCCL rank %d: refused a connection that claims to be rank %d of %d "
                     "(another id, a rank out of range, or one connected already)\n",
                     rank_, p, h.nranks);
      }
      ShutAndClose(&in.fd);
      incoming_.erase(incoming_.begin() + static_cast<std::ptrdiff_t>(i));
    }
  }

  /// Reads peer `p`'s messages as far as they have come, staging the whole ones.
  void ReadFrom(int p) {
    Link& l = links_[static_cast<size_t>(p)];
    while (l.in_fd >= 0) {
      int err = 0;
      Io r;
      if (l.in_header_got < sizeof l.in_header) {
        r = Transfer(l.in_fd, /*out=*/false, reinterpret_cast<unsigned char*>(&l.in_header),
                     sizeof l.in_header, &l.in_header_got, &err);
        if (r == Io::kDone) {
          if (l.in_header > kMaxMessageBytes) {
            Fail(ncclSystemError,
                 absl::StrFormat("rank %d: rank %d sent a message header of %llu bytes: "
                                 "the connection is corrupt",
                                 rank_, p, static_cast<unsigned long long>(l.in_header)));
            return;
          }
          try {
            l.in_payload.resize(static_cast<size_t>(l.in_header));
          } catch (const std::bad_alloc&) {
            Fail(ncclSystemError,
                 absl::StrFormat("rank %d: no memory to stage a message of %llu bytes from rank %d",
                                 rank_, static_cast<unsigned long long>(l.in_header), p));
            return;
          }
          l.in_payload_got = 0;
        }
      } else {
        r = Transfer(l.in_fd, /*out=*/false, l.in_payload.data(), l.in_payload.size(),
                     &l.in_payload_got, &err);
      }
      if (r == Io::kDone) {
        if (l.in_header_got == sizeof l.in_header && l.in_payload_got == l.in_payload.size()) {
          l.arrived.push_back(std::move(l.in_payload));
          l.in_payload = {};
          l.in_header_got = 0;
        }
        continue;
      }
      if (r == Io::kBlocked) return;
      // The peer's end is gone. Not an error yet: a peer that destroyed its communicator after
      // its last send is fine; a recv that waits for more fails (Deliver).
      l.in_closed = r == Io::kClosed && err == 0
                        ? "closed its connection"
                        : absl::StrFormat("broke its connection (%s)", std::strerror(err));
      if (l.in_header_got > 0) l.in_closed += " in the middle of a message";
      ShutAndClose(&l.in_fd);
      return;
    }
  }

  /// Notices when peer `p` drops the connection this rank sends on. The peer never writes on it,
  /// so a read finds nothing while the peer lives, and the end (EOF, ECONNRESET) once its process
  /// exits or its communicator closes: a rank that has sent to `p` but never heard from it learns
  /// this way that a recv from `p` cannot complete.
  void WatchOut(int p) {
    Link& l = links_[static_cast<size_t>(p)];
    if (l.out_fd < 0) return;
    unsigned char byte = 0;
    const ssize_t n = ::recv(l.out_fd, &byte, 1, MSG_DONTWAIT | MSG_PEEK);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
    if (n > 0) {
      Fail(
          ncclSystemError,
          absl::StrFormat("rank %d: rank %d wrote on the connection this rank sends on", rank_, p));
      return;
    }
    l.out_closed = n == 0 ? "closed its connection"
                          : absl::StrFormat("broke its connection (%s)", std::strerror(errno));
    ShutAndClose(&l.out_fd);
    // Whatever the peer sent before it went is in this rank's socket now (its connect and its
    // writes came before its close): take it before Deliver decides that nothing more can come.
    Accept();
    ReadHellos();
    ReadFrom(p);
  }

  /// Gives staged messages from `p` to its posted recvs, in order.
  void Deliver(int p) {
    Link& l = links_[static_cast<size_t>(p)];
    while (!l.recvs.empty() && !l.arrived.empty()) {
      P2pOp& op = l.recvs.front();
      const std::vector<unsigned char>& message = l.arrived.front();
      if (message.size() != op.bytes) {
        Fail(ncclInvalidUsage,
             absl::StrFormat("rank %d: a recv from rank %d was posted for %zu bytes, but "
                             "the message rank %d sent has %zu bytes",
                             rank_, p, op.bytes, p, message.size()));
        return;
      }
      if (!message.empty()) std::memcpy(op.data, message.data(), message.size());
      l.arrived.pop_front();
      Complete(l.recvs);
    }
    // Nothing more can come once the peer's connection has ended, or (when it never sent) once
    // it dropped ours: a message it sent before is read before the end of its connection is.
    if (!l.recvs.empty() && l.in_fd < 0 && (!l.in_closed.empty() || !l.out_closed.empty())) {
      Fail(ncclRemoteError,
           absl::StrFormat("rank %d: a recv of %zu bytes from rank %d failed: rank %d %s (its "
                           "process exited, or its communicator was destroyed or aborted)",
                           rank_, l.recvs.front().bytes, p, p,
                           (l.in_closed.empty() ? l.out_closed : l.in_closed).c_str()));
    }
  }

  /// Connects to `p` if need be, then writes the posted sends as far as the socket takes them.
  /// A non-blocking init connects and says hello before any send: the same connection and hello
  /// a first send would make, so the sends that follow on it read the same on the wire.
  void WriteTo(int p) {
    Link& l = links_[static_cast<size_t>(p)];
    if (l.sends.empty() && !Greeting(p)) return;
    if (!l.out_closed.empty()) {  // gone: connecting again would only wait for the timeout
      Fail(ncclRemoteError,
           absl::StrFormat("rank %d: a send of %zu bytes to rank %d failed: rank %d %s (its "
                           "process exited, or its communicator was destroyed or aborted)",
                           rank_, l.sends.front().bytes, p, p, l.out_closed.c_str()));
      return;
    }
    if (l.out_fd < 0 && !Connect(p)) return;
    int err = 0;
    Io r = Io::kDone;
    if (l.hello_sent < sizeof(Hello)) {
      Hello hello{};
      std::memcpy(hello.magic, kIdMagic, sizeof kIdMagic);
      hello.token = token_;
      hello.rank = rank_;
      hello.nranks = nranks_;
      r = Transfer(l.out_fd, /*out=*/true, reinterpret_cast<unsigned char*>(&hello), sizeof hello,
                   &l.hello_sent, &err);
    }
    while (r == Io::kDone && !l.sends.empty()) {
      P2pOp& op = l.sends.front();
      if (op.moved < sizeof op.header) {
        r = Transfer(l.out_fd, /*out=*/true, reinterpret_cast<unsigned char*>(&op.header),
                     sizeof op.header, &op.moved, &err);
        if (r != Io::kDone) break;
      }
      size_t payload = op.moved - sizeof op.header;
      r = Transfer(l.out_fd, /*out=*/true, op.data, op.bytes, &payload, &err);
      op.moved = sizeof op.header + payload;
      if (r == Io::kDone) Complete(l.sends);
    }
    if (r == Io::kDone || r == Io::kBlocked) return;
    const std::string what = l.sends.empty()
                                 ? std::string("the hello (non-blocking init)")
                                 : absl::StrFormat("a send of %zu bytes", l.sends.front().bytes);
    if (r == Io::kClosed) {
      Fail(ncclRemoteError,
           absl::StrFormat("rank %d: %s to rank %d failed: rank %d closed its connection "
                           "(%s: its process exited, or its communicator was destroyed or aborted)",
                           rank_, what, p, p, std::strerror(err)));
    } else {
      Fail(ncclSystemError, absl::StrFormat("rank %d: %s to rank %d failed: %s", rank_, what, p,
                                            std::strerror(err)));
    }
  }

  /// One connection attempt to `p`'s socket when its time has come; false while not connected.
  bool Connect(int p) {
    Link& l = links_[static_cast<size_t>(p)];
    const Clock::time_point now = Clock::now();
    if (now < l.next_connect) return false;
    int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      Fail(ncclSystemError,
           absl::StrFormat("rank %d: socket for rank %d: %s", rank_, p, std::strerror(errno)));
      return false;
    }
    const SocketName name = NameOf(token_, p);
    if (::connect(fd, reinterpret_cast<const sockaddr*>(&name.addr), name.len) == 0) {
      l.out_fd = fd;
      l.hello_sent = 0;
      return true;
    }
    const int err = errno;
    ::close(fd);
    if (err == ECONNREFUSED || err == ENOENT || err == EAGAIN || err == EINTR) {
      // The peer has not called ncclCommInitRank yet (or its backlog is full): try again soon,
      // backing off to 20 ms, until the send's deadline (a non-blocking init's greeting tries
      // until the caller aborts: 50 connects a second cost nothing).
      l.next_connect = now + l.backoff;
      l.backoff = std::min(l.backoff * 2, std::chrono::milliseconds(20));
      return false;
    }
    Fail(ncclSystemError,
         absl::StrFormat("rank %d: cannot connect to rank %d: %s", rank_, p, std::strerror(err)));
    return false;
  }

  /// Fails the communicator when the oldest op of a queue has waited past its deadline (the
  /// later ones were posted later, so their deadlines are later).
  void CheckDeadlines() {
    const Clock::time_point now = Clock::now();
    for (int p = 0; p < nranks_; ++p) {
      const Link& l = links_[static_cast<size_t>(p)];
      if (!l.sends.empty() && now >= l.sends.front().deadline) {
        Fail(ncclSystemError,
             absl::StrFormat("rank %d: a send of %zu bytes to rank %d timed out after %d s "
                             "(KVSERVE_SIM_NCCL_TIMEOUT_S): %s",
                             rank_, l.sends.front().bytes, p, TimeoutSeconds(),
                             l.out_fd < 0
                                 ? "its socket never came up (no ncclCommInitRank of that rank)"
                                 : "it did not read the bytes"));
        return;
      }
      if (!l.recvs.empty() && now >= l.recvs.front().deadline) {
        Fail(ncclSystemError,
             absl::StrFormat("rank %d: a recv of %zu bytes from rank %d timed out after %d s "
                             "(KVSERVE_SIM_NCCL_TIMEOUT_S): %s",
                             rank_, l.recvs.front().bytes, p, TimeoutSeconds(),
                             l.in_seen ? "it sent no message for it" : "it never connected"));
        return;
      }
    }
  }

  const uint64_t token_;
  const int nranks_;
  const int rank_;
  const bool eager_;  // non-blocking init: connects to every peer at once
  int wake_fd_ = -1;  // eventfd: a posted op or a close wakes the I/O thread's poll()
  std::thread thread_;

  std::mutex mu_;  // guards what follows; the I/O thread holds it except in poll()
  std::condition_variable idle_cv_;  // an op finished: ncclCommDestroy may be waiting for all
  bool closing_ = false;
  ncclResult_t error_ = ncclSuccess;
  std::string error_text_;
  bool joined_;  // every peer has joined (always, without a non-blocking init)
  int listen_fd_ = -1;
  std::vector<Link> links_;  // by peer rank (this rank's own stays unused)
  std::vector<Incoming> incoming_;
};

}  // namespace
}  // namespace kvsim

struct ncclComm {
  std::shared_ptr<kvsim::Clique> clique;  // ncclCommInitAll's: collectives
  std::shared_ptr<kvsim::P2pComm> p2p;    // ncclCommInitRank's: point-to-point
  int rank = 0;
  int device = 0;
  ncclResult_t async_error = ncclSuccess;  // clique only: p2p keeps its own
  std::string last_error;
};

namespace {

ncclResult_t Submit(ncclComm_t comm, cudaStream_t stream, const kvsim::Post& post) {
  if (comm == nullptr) return ncclInvalidArgument;
  if (comm->clique == nullptr) {
    std::fprintf(stderr,
                 "kvsim: NCCL rank %d: the simulator runs collectives only on ncclCommInitAll "
                 "communicators; ncclCommInitRank ones do point-to-point\n",
                 comm->rank);
    return ncclInvalidUsage;
  }
  const size_t bytes = post.count * kvsim::TypeBytes(post.type);
  const size_t recv_bytes = post.kind == kvsim::Kind::kAllGather
                                ? bytes * static_cast<size_t>(comm->clique->size)
                                : bytes;
  if (bytes > 0 &&
      (!kvsim::IsDeviceRange(post.send, bytes) || !kvsim::IsDeviceRange(post.recv, recv_bytes))) {
    comm->last_error = "buffer outside device memory";
    std::fprintf(stderr, "kvsim: NCCL rank %d: a buffer of %zu bytes is not device memory\n",
                 comm->rank, bytes);
    return ncclInvalidArgument;
  }
  if (kvsim::StreamDevice(stream) != comm->device) {
    std::fprintf(stderr, "kvsim: NCCL rank %d (device %d) called on a stream of device %d\n",
                 comm->rank, comm->device, kvsim::StreamDevice(stream));
    return ncclInvalidUsage;
  }
  auto clique = comm->clique;
  const int rank = comm->rank;
  auto result = std::make_shared<ncclResult_t>(ncclSuccess);
  const cudaError_t e = kvsim::Enqueue(stream, [clique, rank, post, result] {
    kvsim::Post posted = post;
    posted.done = std::make_shared<kvsim::Pending>();
    kvsim::AddPending(kvsim::ExecutingStream(), posted.done);
    *result = kvsim::Arrive(*clique, rank, posted);
  });
  if (e != cudaSuccess) return ncclUnhandledCudaError;
  if (*result != ncclSuccess) comm->async_error = *result;
  return *result;
}

/// ncclSend (`send`) or ncclRecv: checks the call, then posts the op when the stream reaches it.
ncclResult_t SubmitP2p(bool send, void* buf, size_t count, ncclDataType_t type, int peer,
                       ncclComm_t comm, cudaStream_t stream) {
  const char* what = send ? "ncclSend" : "ncclRecv";
  if (comm == nullptr) return ncclInvalidArgument;
  if (comm->p2p == nullptr) {
    std::fprintf(stderr,
                 "kvsim: %s: the simulator runs point-to-point only on ncclCommInitRank "
                 "communicators; ncclCommInitAll ones do collectives\n",
                 what);
    return ncclInvalidUsage;
  }
  std::shared_ptr<kvsim::P2pComm> p2p = comm->p2p;
  // A broken communicator fails every later call at once, as NCCL's do. So does one whose
  // non-blocking init is not done: real NCCL requires ncclSuccess from ncclCommGetAsyncError
  // first (it says ncclInvalidArgument; ncclInvalidUsage names the mistake better).
  const ncclResult_t state = p2p->AsyncError();
  if (state == ncclInProgress) {
    comm->last_error = absl::StrFormat("%s before the non-blocking init completed", what);
    std::fprintf(stderr,
                 "kvsim: NCCL rank %d: %s before the communicator's non-blocking init completed "
                 "(poll ncclCommGetAsyncError until it is not ncclInProgress)\n",
                 comm->rank, what);
    return ncclInvalidUsage;
  }
  if (state != ncclSuccess) return state;
  const size_t type_bytes = kvsim::TypeBytes(type);
  if (type_bytes == 0) return ncclInvalidArgument;
  if (peer < 0 || peer >= p2p->nranks() || peer == comm->rank) {
    comm->last_error = absl::StrFormat("%s: peer %d of %d ranks", what, peer, p2p->nranks());
    std::fprintf(stderr, "kvsim: NCCL rank %d: %s %s peer %d: not another rank of the %d\n",
                 comm->rank, what, send ? "to" : "from", peer, p2p->nranks());
    return ncclInvalidArgument;
  }
  const size_t bytes = count * type_bytes;
  if (bytes > 0 && !kvsim::IsDeviceRange(buf, bytes)) {
    comm->last_error = "buffer outside device memory";
    std::fprintf(stderr, "kvsim: NCCL rank %d: %s: the buffer of %zu bytes is not device memory\n",
                 comm->rank, what, bytes);
    return ncclInvalidArgument;
  }
  if (kvsim::StreamDevice(stream) != comm->device) {
    std::fprintf(stderr, "kvsim: NCCL rank %d (device %d): %s on a stream of device %d\n",
                 comm->rank, comm->device, what, kvsim::StreamDevice(stream));
    return ncclInvalidUsage;
  }
  kvsim::P2pOp op;
  op.data = static_cast<unsigned char*>(buf);
  op.bytes = bytes;
  auto result = std::make_shared<ncclResult_t>(ncclSuccess);
  const cudaError_t e = kvsim::Enqueue(stream, [p2p, send, peer, op, result] {
    kvsim::P2pOp posted = op;
    posted.done = std::make_shared<kvsim::Pending>();
    kvsim::AddPending(kvsim::ExecutingStream(), posted.done);
    *result = p2p->Post(send, peer, std::move(posted));
  });
  if (e != cudaSuccess) return ncclUnhandledCudaError;
  return *result;
}

/// ncclCommInitRank, or with `blocking` false ncclCommInitRankConfig's non-blocking init, which
/// returns ncclInProgress once the communicator exists (the I/O thread then connects).
ncclResult_t InitRank(const char* api, ncclComm_t* comm, int nranks, const ncclUniqueId& commId,
                      int rank, bool blocking) {
  if (comm == nullptr) return ncclInvalidArgument;
  if (nranks < 1 || rank < 0 || rank >= nranks) {
    std::fprintf(stderr, "kvsim: %s: rank %d of %d ranks\n", api, rank, nranks);
    return ncclInvalidArgument;
  }
  if (std::memcmp(commId.internal, kvsim::kIdMagic, sizeof kvsim::kIdMagic) != 0) {
    std::fprintf(stderr, "kvsim: %s: the id does not come from ncclGetUniqueId\n", api);
    return ncclInvalidArgument;
  }
  if (kvsim::DeviceCount() == 0) return ncclUnhandledCudaError;
  uint64_t token = 0;
  std::memcpy(&token, commId.internal + kvsim::kTokenOffset, sizeof token);
  auto p2p = std::make_shared<kvsim::P2pComm>(token, nranks, rank, /*eager=*/!blocking);
  if (const ncclResult_t r = p2p->Start(); r != ncclSuccess) return r;
  auto* c = new ncclComm();
  c->p2p = std::move(p2p);
  c->rank = rank;
  c->device = kvsim::CurrentDevice();  // as NCCL: the calling thread's device (cudaSetDevice)
  *comm = c;
  return blocking ? ncclSuccess : ncclInProgress;
}

/// NCCL_CONFIG_INITIALIZER's magic: a config not made from it is refused, as NCCL refuses it.
constexpr unsigned int kConfigMagic = 0xcafebeef;

}  // namespace

extern "C" {

ncclResult_t ncclCommInitAll(ncclComm_t* comms, int ndev, const int* devlist) {
  if (comms == nullptr || ndev < 1) return ncclInvalidArgument;
  if (ndev > kvsim::DeviceCount()) return ncclUnhandledCudaError;
  auto clique = std::make_shared<kvsim::Clique>(ndev);
  for (int i = 0; i < ndev; ++i) {
    const int device = devlist != nullptr ? devlist[i] : i;
    if (device < 0 || device >= kvsim::DeviceCount()) {
      for (int j = 0; j < i; ++j) delete comms[j];
      return ncclInvalidArgument;
    }
    comms[i] = new ncclComm();
    comms[i]->clique = clique;
    comms[i]->rank = i;
    comms[i]->device = device;
  }
  return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId) {
  if (uniqueId == nullptr) return ncclInvalidArgument;
  uint64_t token = 0;
  try {
    std::random_device random;
    token = (uint64_t{random()} << 32) ^ uint64_t { random() };
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kvsim: ncclGetUniqueId: no random source: %s\n", e.what());
    return ncclSystemError;
  }
  std::memset(uniqueId, 0, sizeof *uniqueId);
  std::memcpy(uniqueId->internal, kvsim::kIdMagic, sizeof kvsim::kIdMagic);
  std::memcpy(uniqueId->internal + kvsim::kTokenOffset, &token, sizeof token);
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank) {
  return InitRank("ncclCommInitRank", comm, nranks, commId, rank, /*blocking=*/true);
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank,
                                    ncclConfig_t* config) {
  const char* api = "ncclCommInitRankConfig";
  bool blocking = true;
  if (config != nullptr) {
    // As NCCL: an uninitialized config or a blocking value other than 0, 1 or undefined is a
    // caller's bug that must not pass for one mode or the other.
    if (config->magic != kConfigMagic ||
        config->size < offsetof(ncclConfig_t, blocking) + sizeof config->blocking) {
      std::fprintf(stderr,
                   "kvsim: %s: the config was not initialized with NCCL_CONFIG_INITIALIZER\n", api);
      return ncclInvalidArgument;
    }
    if (config->blocking != NCCL_CONFIG_UNDEF_INT && config->blocking != 0 &&
        config->blocking != 1) {
      std::fprintf(stderr, "kvsim: %s: config blocking = %d (0, 1 or NCCL_CONFIG_UNDEF_INT)\n", api,
                   config->blocking);
      return ncclInvalidArgument;
    }
    blocking = config->blocking != 0;
  }
  return InitRank(api, comm, nranks, commId, rank, blocking);
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (comm == nullptr) return ncclInvalidArgument;
  // Point-to-point: the posted ops finish first (each completes, fails, or times out).
  if (comm->p2p != nullptr) comm->p2p->Close(/*drain=*/true);
  delete comm;
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (comm == nullptr) return ncclInvalidArgument;
  if (comm->p2p != nullptr) {
    comm->p2p->Close(/*drain=*/false);
  } else {
    kvsim::AbortClique(*comm->clique);
  }
  delete comm;
  return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  if (comm == nullptr || asyncError == nullptr) return ncclInvalidArgument;
  *asyncError = comm->p2p != nullptr ? comm->p2p->AsyncError() : comm->async_error;
  return ncclSuccess;
}

ncclResult_t ncclCommCount(ncclComm_t comm, int* count) {
  if (comm == nullptr || count == nullptr) return ncclInvalidArgument;
  *count = comm->p2p != nullptr ? comm->p2p->nranks() : comm->clique->size;
  return ncclSuccess;
}

ncclResult_t ncclCommUserRank(ncclComm_t comm, int* rank) {
  if (comm == nullptr || rank == nullptr) return ncclInvalidArgument;
  *rank = comm->rank;
  return ncclSuccess;
}

const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess:
      return "no error";
    case ncclUnhandledCudaError:
      return "unhandled cuda error";
    case ncclSystemError:
      return "unhandled system error (a peer did not arrive)";
    case ncclInternalError:
      return "internal error";
    case ncclInvalidArgument:
      return "invalid argument";
    case ncclInvalidUsage:
      return "invalid usage";
    case ncclRemoteError:
      return "remote process exited or there was a network error (communicator aborted)";
    case ncclInProgress:
      return "NCCL operation in progress";
  }
  return "unknown result code";
}

const char* ncclGetLastError(ncclComm_t comm) {
  if (comm == nullptr) return "";
  if (comm->p2p != nullptr) {
    if (const char* text = comm->p2p->ErrorText(); text != nullptr) return text;
  }
  return comm->last_error.c_str();
}

ncclResult_t ncclGroupStart(void) { return ncclSuccess; }
ncclResult_t ncclGroupEnd(void) { return ncclSuccess; }

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream) {
  if (!kvsim::Reducible(datatype)) return ncclInvalidArgument;
  return Submit(comm, stream,
                kvsim::Post{kvsim::Kind::kAllReduce, sendbuff, recvbuff, count, datatype, op});
}

ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  if (kvsim::TypeBytes(datatype) == 0) return ncclInvalidArgument;
  return Submit(
      comm, stream,
      kvsim::Post{kvsim::Kind::kAllGather, sendbuff, recvbuff, sendcount, datatype, ncclSum});
}

ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  // Only read: the I/O thread writes it out.
  return SubmitP2p(/*send=*/true, const_cast<void*>(sendbuff), count, datatype, peer, comm, stream);
}

ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  return SubmitP2p(/*send=*/false, recvbuff, count, datatype, peer, comm, stream);
}

}  // extern "C"
