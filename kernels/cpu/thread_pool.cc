#include "kernels/cpu/thread_pool.h"

#include <algorithm>

namespace kvserve::cpu {
namespace {

// Spin iterations before a waiting worker sleeps (~50-150 us depending on the CPU's pause).
constexpr int kWorkerSpinIters = 4000;
// Spin iterations before the waiting caller starts yielding its time slice.
constexpr int kCallerSpinIters = 256;

// Set while this thread runs a chunk for some pool: nested ParallelFor calls then run inline.
thread_local bool t_inside_parallel_for = false;

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

inline int64_t ChunkBoundary(int64_t n, int chunk, int num_chunks) {
  // n * chunk / num_chunks without overflow for any realistic n (n < 2^56 with <= 128 chunks).
  return n / num_chunks * chunk + n % num_chunks * chunk / num_chunks;
}

}  // namespace

ThreadPool::ThreadPool(int num_threads) {
  if (num_threads <= 0) {
    num_threads = static_cast<int>(std::thread::hardware_concurrency());
  }
  num_threads_ = std::max(1, num_threads);
  slots_ = std::make_unique<Slot[]>(num_threads_);
  workers_.reserve(num_threads_ - 1);
  for (int i = 1; i < num_threads_; ++i) {
    workers_.emplace_back([this, i] { WorkerLoop(i); });
  }
}

ThreadPool::~ThreadPool() {
  stop_.store(true, std::memory_order_release);
  for (int i = 1; i < num_threads_; ++i) {
    slots_[i].seq.fetch_add(1, std::memory_order_release);
    slots_[i].seq.notify_one();
  }
  for (std::thread& t : workers_) t.join();
}

int ThreadPool::NumChunks(int64_t n, int64_t min_chunk) const {
  if (n <= 0) return 0;
  const int64_t by_size = n / std::max<int64_t>(min_chunk, 1);
  return static_cast<int>(std::clamp<int64_t>(by_size, 1, num_threads_));
}

void ThreadPool::ParallelFor(int64_t n, int64_t min_chunk,
                             const std::function<void(int64_t, int64_t)>& fn) {
  const int num_chunks = NumChunks(n, min_chunk);
  if (num_chunks == 0) return;
  bool expected = false;
  const bool inline_only =
      num_chunks == 1 || t_inside_parallel_for ||
      !busy_.compare_exchange_strong(expected, true, std::memory_order_acquire);
  if (inline_only) {
    for (int c = 0; c < num_chunks; ++c) {
      const int64_t b = ChunkBoundary(n, c, num_chunks);
      const int64_t e = ChunkBoundary(n, c + 1, num_chunks);
      fn(b, e);
    }
    return;
  }

  pending_.store(num_chunks - 1, std::memory_order_relaxed);
  for (int c = 1; c < num_chunks; ++c) {
    Slot& slot = slots_[c];
    slot.fn = &fn;
    slot.begin = ChunkBoundary(n, c, num_chunks);
    slot.end = ChunkBoundary(n, c + 1, num_chunks);
    slot.seq.fetch_add(1, std::memory_order_release);
    slot.seq.notify_one();
  }
  t_inside_parallel_for = true;
  fn(0, ChunkBoundary(n, 1, num_chunks));
  t_inside_parallel_for = false;
  for (int spins = 0; pending_.load(std::memory_order_acquire) != 0; ++spins) {
    if (spins < kCallerSpinIters) {
      CpuRelax();
    } else {
      std::this_thread::yield();
    }
  }
  busy_.store(false, std::memory_order_release);
}

void ThreadPool::ParallelForDynamic(int64_t n, int64_t grain,
                                    const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  const int64_t pieces = (n + grain - 1) / grain;
  const int participants = static_cast<int>(std::min<int64_t>(pieces, num_threads_));
  // Each participant claims the next unclaimed piece until none is left.
  alignas(64) std::atomic<int64_t> next{0};
  const std::function<void(int64_t, int64_t)> claim = [&](int64_t, int64_t) {
    for (int64_t begin = next.fetch_add(grain, std::memory_order_relaxed); begin < n;
         begin = next.fetch_add(grain, std::memory_order_relaxed)) {
      fn(begin, std::min(n, begin + grain));
    }
  };
  ParallelFor(participants, 1, claim);
}

void ThreadPool::WorkerLoop(int index) {
  Slot& slot = slots_[index];
  uint64_t seen = 0;
  t_inside_parallel_for = true;
  while (true) {
    uint64_t seq = slot.seq.load(std::memory_order_acquire);
    for (int spins = 0; seq == seen && spins < kWorkerSpinIters; ++spins) {
      CpuRelax();
      seq = slot.seq.load(std::memory_order_acquire);
    }
    if (seq == seen) {
      slot.seq.wait(seen, std::memory_order_acquire);
      seq = slot.seq.load(std::memory_order_acquire);
    }
    seen = seq;
    if (stop_.load(std::memory_order_acquire)) return;
    (*slot.fn)(slot.begin, slot.end);
    pending_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

}  // namespace kvserve::cpu
