#ifndef KVSERVE_ROUTER_HTTP_ADMISSION_QUEUE_H_
#define KVSERVE_ROUTER_HTTP_ADMISSION_QUEUE_H_

#include <httplib.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace kvserve::http {

/// Limits of the HTTP front's connection admission (see AdmissionQueue).
struct AdmissionOptions {
  /// Threads serving connections; each holds its connection for the whole
  /// exchange (a streaming response holds it until the last event).
  int threads = 64;
  /// Accepted connections that may wait for a serving thread; one more is
  /// refused (503).
  int max_queued = 1024;
  /// Threads that answer refused connections: each reads the request, then
  /// writes the 503.
  int shed_threads = 2;
};

/// Counts kept by the queue, read by the server (and tests) while it runs.
struct AdmissionCounters {
  /// Connections given to a serving thread (at once or after waiting).
  std::atomic<uint64_t> admitted{0};
  /// Connections refused for overload (answered by a shedding thread).
  std::atomic<uint64_t> shed{0};
  /// Connections waiting for a serving thread now.
  std::atomic<int> queued{0};
};

/// The task queue of cpp-httplib's server (Server::new_task_queue): each task
/// serves one accepted connection. httplib's own ThreadPool queues without
/// bound, so under overload connections wait for as long as it takes; this
/// queue bounds the wait instead.
///
/// Algorithm: a connection is admitted while the connections waiting are fewer
/// than the idle serving threads plus `max_queued`; it then waits (FIFO) for a
/// serving thread. Otherwise it is handed to a shedding thread, which runs the
/// same httplib task with Shedding() true: the request is read in full (so the
/// socket is never closed with unread bytes, which would make the kernel answer
/// with a reset) and the handler answers 503 with Retry-After.
///
/// shutdown() (called by httplib when its accept loop ends) runs every task
/// already queued and joins the threads, as httplib's ThreadPool does.
class AdmissionQueue final : public httplib::TaskQueue {
 public:
  /// `counters` must outlive the queue.
  AdmissionQueue(const AdmissionOptions& options, AdmissionCounters* counters);
  ~AdmissionQueue() override;
  AdmissionQueue(const AdmissionQueue&) = delete;
  AdmissionQueue& operator=(const AdmissionQueue&) = delete;

  void enqueue(std::function<void()> fn) override;
  void shutdown() override;

  /// True on a shedding thread: the request being handled was refused for
  /// overload.
  static bool Shedding();

 private:
  /// One set of threads taking tasks from one FIFO.
  struct Lane {
    std::deque<std::function<void()>> tasks;
    std::condition_variable ready;
    std::vector<std::thread> threads;
    /// Threads not running a task (waiting for one, or about to).
    int idle = 0;
  };

  void Run(Lane* lane, bool shedding);

  const AdmissionOptions options_;
  AdmissionCounters* const counters_;
  std::mutex mu_;
  bool shutting_down_ = false;
  Lane serve_;
  Lane shed_;
};

}  // namespace kvserve::http

#endif  // KVSERVE_ROUTER_HTTP_ADMISSION_QUEUE_H_
