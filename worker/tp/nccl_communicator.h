#ifndef KVSERVE_WORKER_TP_NCCL_COMMUNICATOR_H_
#define KVSERVE_WORKER_TP_NCCL_COMMUNICATOR_H_

// Compiled into libkvserve_cuda.so only (kernels/cuda/CMakeLists.txt); programs reach it through
// the C entry point kvserve_create_nccl_group (kernels/backend.h: CudaLibrarySymbol).

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/tp/communicator.h"

namespace kvserve {

/// NCCL flavour of Communicator: one rank per GPU of this process, one thread per rank (each
/// rank's calls come from its own thread, in lockstep). Buffers are device pointers on the
/// rank's GPU; every call is enqueued on the rank's stream and waited for before returning.
///
/// Semantics differ from the CPU group in one documented way: NCCL chooses the reduction order
/// (ring / tree), so AllReduceSum is identical on every rank but not necessarily summed in rank
/// order 0..size-1.
class NcclCommunicator final : public Communicator {
 public:
  /// One communicator per device 0..num_devices-1 (ncclCommInitAll). UNAVAILABLE when NCCL or
  /// the devices cannot be used.
  static absl::StatusOr<std::vector<std::unique_ptr<Communicator>>> CreateGroup(int num_devices);
  ~NcclCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  absl::Status AllReduceSum(float* data, int64_t n) override;
  absl::Status AllGather(const float* send, int64_t n, float* recv) override;
  absl::Status Barrier() override;
  bool enqueues_on_stream() const override { return true; }
  /// ncclAllReduce on `stream` (a stream of this rank's device), not waited for. Fails at once
  /// when the group was aborted or the communicator holds an asynchronous error from an earlier
  /// collective.
  absl::Status EnqueueAllReduceSum(float* data, int64_t n, void* stream) override;
  /// ncclCommAbort on every rank's communicator (once): ranks blocked in a collective return,
  /// and every later call is ABORTED.
  void Abort() override;

 private:
  struct Impl;
  struct Group;
  NcclCommunicator(int rank, int size, std::unique_ptr<Impl> impl);
  /// Runs `call` (an NCCL collective returning ncclResult_t) unless the group was aborted, and
  /// waits for it; see Group in the .cc for the locking.
  absl::Status Collective(const char* what, const std::function<int()>& call);

  int rank_;
  int size_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvserve

#endif  // KVSERVE_WORKER_TP_NCCL_COMMUNICATOR_H_
