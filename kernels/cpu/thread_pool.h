#ifndef KVSERVE_KERNELS_CPU_THREAD_POOL_H_
#define KVSERVE_KERNELS_CPU_THREAD_POOL_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

namespace kvserve::cpu {

/// A fixed set of persistent worker threads for data-parallel loops.
///
/// Built for many small calls (decode of a tiny model calls ParallelFor ~50 times per token):
/// each worker has its own job slot on its own cache line, spins briefly for the next job and
/// only then sleeps on a futex (std::atomic::wait). The calling thread runs the first chunk.
///
/// Determinism: the split of [0, n) into chunks depends only on (n, min_chunk, num_threads).
/// Re-entrancy: a ParallelFor issued from inside a running ParallelFor (or while another thread
/// is using the pool) runs its chunks inline, in order, on the calling thread — same split, no
/// deadlock.
class ThreadPool {
 public:
  /// `num_threads` counts the caller too; <= 0 means std::thread::hardware_concurrency().
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  /// Total threads that take part in a ParallelFor, including the caller.
  int num_threads() const { return num_threads_; }

  /// Calls fn(begin, end) over [0, n) split into contiguous chunks of at least `min_chunk`
  /// (at most num_threads chunks); blocks until all are done. n <= 0 calls nothing.
  void ParallelFor(int64_t n, int64_t min_chunk, const std::function<void(int64_t, int64_t)>& fn);

  /// The number of chunks ParallelFor(n, min_chunk, ...) uses (exposed for tests/planning).
  int NumChunks(int64_t n, int64_t min_chunk) const;

  /// Calls fn(begin, end) once for each piece [i * grain, min((i + 1) * grain, n)) of [0, n),
  /// handing pieces to threads as they become free (load balancing: a thread slowed by other
  /// work on the machine takes fewer pieces, and nobody idles while work is left). The pieces
  /// are fixed by (n, grain); which thread runs a piece is not, so use this only where a piece's
  /// result does not depend on the thread that computes it. Blocks until all are done; nested
  /// or concurrent calls run the pieces inline, in order.
  void ParallelForDynamic(int64_t n, int64_t grain,
                          const std::function<void(int64_t, int64_t)>& fn);

 private:
  struct alignas(64) Slot {
    std::atomic<uint64_t> seq{0};  // bumped (release) after the job fields below are written
    const std::function<void(int64_t, int64_t)>* fn = nullptr;
    int64_t begin = 0;
    int64_t end = 0;
  };

  void WorkerLoop(int index);

  int num_threads_;
  std::unique_ptr<Slot[]> slots_;  // slots_[i] belongs to worker i (1..num_threads_-1)
  std::vector<std::thread> workers_;
  std::atomic<bool> busy_{false};  // a ParallelFor is dispatching to the workers
  std::atomic<bool> stop_{false};
  alignas(64) std::atomic<int64_t> pending_{0};  // worker chunks of the current job not yet done
};

}  // namespace kvserve::cpu

#endif  // KVSERVE_KERNELS_CPU_THREAD_POOL_H_
