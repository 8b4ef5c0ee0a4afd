#ifndef KVSERVE_WORKER_TP_CPU_COMMUNICATOR_H_
#define KVSERVE_WORKER_TP_CPU_COMMUNICATOR_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/tp/communicator.h"

namespace kvserve {

class CpuCommunicator;

/// The shared state of an in-process tensor-parallel group: N ranks are N threads of one
/// process, each calling collectives on its own communicator(rank).
///
/// Algorithm of AllReduceSum (two barriers, no locks):
///   1. every rank publishes its buffer pointer and n, then waits at the barrier;
///   2. rank r sums chunk r of the index range ([r*n/N, (r+1)*n/N)) over the ranks' buffers in
///      rank order 0..N-1 into its own scratch, then waits at the barrier;
///   3. every rank copies all N chunks from the scratches into its buffer.
/// Each element is added up exactly once, in a fixed order, so every rank gets the same bits,
/// whatever the thread timing. Scratches alternate between two sets from one call to the next:
/// a rank that is already writing the scratch of call k+1 cannot overwrite what a slower rank
/// is still copying out of call k (the barrier of step 1 separates them).
///
/// Barrier: a counter and a generation number; the last arrival bumps the generation, the
/// others wait on it (std::atomic::wait: a short spin, then a futex).
///
/// Abort() unblocks every waiting rank with ABORTED (used when one rank fails and will not
/// reach the next collective); Reset() re-arms the group once no rank is inside a call.
class CpuCommGroup {
 public:
  /// A group of `size` >= 1 ranks.
  static absl::StatusOr<std::unique_ptr<CpuCommGroup>> Create(int size);
  ~CpuCommGroup();
  CpuCommGroup(const CpuCommGroup&) = delete;
  CpuCommGroup& operator=(const CpuCommGroup&) = delete;

  /// Number of ranks.
  int size() const { return size_; }
  /// Rank `rank`'s communicator, owned by the group. Only that rank's thread may use it.
  Communicator* communicator(int rank);

  /// Makes every pending and later collective call return ABORTED until Reset().
  void Abort();
  /// True after Abort() and before Reset().
  bool aborted() const { return aborted_.load(std::memory_order_acquire); }
  /// Clears an abort and re-synchronises the ranks. Call only while no rank is inside a
  /// collective call (e.g. after joining every rank's step).
  void Reset();

 private:
  friend class CpuCommunicator;

  // What a rank publishes for one collective call; one cache line per rank.
  struct alignas(64) Slot {
    const float* src = nullptr;  // the rank's input buffer
    int64_t n = 0;
    std::vector<float> scratch[2];  // the chunk this rank reduced, by call parity
  };

  explicit CpuCommGroup(int size);
  // Waits until all ranks arrive; ABORTED when the group is (or gets) aborted.
  absl::Status Arrive();

  const int size_;
  std::unique_ptr<Slot[]> slots_;
  std::vector<std::unique_ptr<CpuCommunicator>> comms_;
  alignas(64) std::atomic<int> arrived_{0};
  alignas(64) std::atomic<uint64_t> generation_{0};
  std::atomic<bool> aborted_{false};
};

}  // namespace kvserve

#endif  // KVSERVE_WORKER_TP_CPU_COMMUNICATOR_H_
