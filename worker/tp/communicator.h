#ifndef KVSERVE_WORKER_TP_COMMUNICATOR_H_
#define KVSERVE_WORKER_TP_COMMUNICATOR_H_

#include <cstdint>

#include "absl/status/status.h"

namespace kvserve {

/// One rank's handle on a group of `size()` tensor-parallel ranks that run the same program in
/// lockstep. Every rank must make the same sequence of collective calls with the same sizes;
/// a call returns once every rank has made it (or the group was aborted).
///
/// Two implementations: an in-process CPU group (worker/tp/cpu_communicator.h: the ranks are
/// threads of one process) and NCCL (worker/tp/nccl_communicator.h: one thread per GPU). Both
/// leave bit-identical AllReduceSum results on every rank; the CPU group also sums in rank
/// order 0, 1, ..., size-1, so a CPU tensor-parallel run is reproducible (NCCL picks its own
/// order).
///
/// Errors: INVALID_ARGUMENT when ranks disagree on a call's size (every rank gets it), ABORTED
/// when another rank gave up (its own error is the one to report).
class Communicator {
 public:
  virtual ~Communicator() = default;

  /// This rank's index in [0, size()).
  virtual int rank() const = 0;
  /// Number of ranks in the group.
  virtual int size() const = 0;

  /// data[i] = sum over ranks r = 0..size-1, in that order, of rank r's data[i], on every rank.
  /// `data` holds n floats on every rank (n may be 0).
  virtual absl::Status AllReduceSum(float* data, int64_t n) = 0;

  /// recv[r * n + i] = rank r's send[i], on every rank. `send` holds n floats, `recv`
  /// size() * n; they must not overlap.
  virtual absl::Status AllGather(const float* send, int64_t n, float* recv) = 0;

  /// Returns once every rank has called Barrier().
  virtual absl::Status Barrier() = 0;

  /// Whether EnqueueAllReduceSum works: the group's collectives can run on the caller's device
  /// stream (NCCL), not only on the host (the CPU group).
  virtual bool enqueues_on_stream() const { return false; }

  /// AllReduceSum enqueued on `stream` (the rank's cudaStream_t, e.g. Backend::native_stream)
  /// without waiting: the sum is there for whatever the stream runs next, so a device step needs
  /// no host synchronisation between layers and a CUDA graph can capture the collective. Errors
  /// of the collective itself show when the stream is next synchronised (or as this call's error
  /// for a later collective). UNIMPLEMENTED where enqueues_on_stream() is false.
  virtual absl::Status EnqueueAllReduceSum(float* /*data*/, int64_t /*n*/, void* /*stream*/) {
    return absl::UnimplementedError("this communicator has no device streams");
  }

  /// Gives up on the group, from any thread: every rank's pending and later calls return
  /// ABORTED (or the transport's error). Used when one rank failed and will not reach the next
  /// collective, so the others do not wait forever. The CPU group can be re-armed afterwards
  /// (CpuCommGroup::Reset); an aborted NCCL group is gone for good.
  virtual void Abort() = 0;
};

}  // namespace kvserve

#endif  // KVSERVE_WORKER_TP_COMMUNICATOR_H_
