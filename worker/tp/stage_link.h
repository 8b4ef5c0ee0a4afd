#ifndef KVSERVE_WORKER_TP_STAGE_LINK_H_
#define KVSERVE_WORKER_TP_STAGE_LINK_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/cord.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace kvserve {

/// One tensor-parallel rank's device path between adjacent stages of a pipeline group: rank t of
/// stage k receives its hand-over from rank t of stage k - 1 and sends its own to rank t of
/// stage k + 1, device memory to device memory (NCCL send/recv), without touching the host.
/// Buffers are in the memory of the rank's backend (host memory for a CPU backend).
/// Messages between two ranks are matched in the order they were posted. Each call returns once
/// its transfer is done. Not thread-safe except Abort.
class StageLink {
 public:
  virtual ~StageLink() = default;

  /// The next `n` floats from the previous stage into `data` (this rank's device memory).
  virtual absl::Status Recv(float* data, int64_t n) = 0;
  /// `n` floats of `data` (this rank's device memory) to the next stage.
  virtual absl::Status Send(const float* data, int64_t n) = 0;
  /// From any thread: a transfer in progress on any link of this process's formation ends, and
  /// every later call fails with UNAVAILABLE. Used when a stage is lost, so no rank waits for a
  /// peer that will never answer.
  virtual void Abort() = 0;
};

/// A StageLink's failure: UNAVAILABLE, marked so that a model can tell it from its own failures
/// (a first stage whose send failed has finished every collective, so its tensor-parallel group
/// is still sound).
inline absl::Status StageLinkError(absl::string_view message) {
  absl::Status s = absl::UnavailableError(message);
  s.SetPayload("kvserve.stage_link", absl::Cord("1"));
  return s;
}
inline bool IsStageLinkError(const absl::Status& s) {
  return s.GetPayload("kvserve.stage_link").has_value();
}

/// How a process opens its links for a formation of its pipeline group.
struct StageLinkFactory {
  /// A new formation's id (the leader makes it and hands it to every stage): ncclGetUniqueId.
  std::function<absl::StatusOr<std::string>()> new_id;
  /// This process's links of formation `id`: stage `stage` of `pp_size`, one link per
  /// tensor-parallel rank (rank t on device t), rank 0's first. Aborting one aborts them all.
  /// Waits until every rank of every stage has opened its links, at most `timeout` (then
  /// UNAVAILABLE: a stage did not come), so a stage that died while the group formed cannot
  /// hold the others.
  std::function<absl::StatusOr<std::vector<std::shared_ptr<StageLink>>>(
      const std::string& id, int pp_size, int stage, absl::Duration timeout)>
      open;

  explicit operator bool() const { return new_id && open; }
};

/// NCCL links over CUDA devices 0..tp_size-1 of this process, through libkvserve_cuda.so (with
/// `simulator`, libkvserve_cuda_sim.so and the simulator's NCCL, whose ranks may be in different
/// processes of one machine). A communicator of pp_size * tp_size ranks per formation, rank
/// stage * tp_size + t on device t. UNAVAILABLE naming the reason when the library or NCCL is
/// missing.
StageLinkFactory NcclStageLinks(int tp_size, bool simulator);

}  // namespace kvserve

#endif  // KVSERVE_WORKER_TP_STAGE_LINK_H_
