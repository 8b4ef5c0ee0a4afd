#ifndef KVSERVE_WORKER_PP_STAGE_RUNNER_H_
#define KVSERVE_WORKER_PP_STAGE_RUNNER_H_

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "worker/model/weights.h"
#include "worker/tp/tp_model.h"

namespace kvserve {

/// How a non-leader stage process joins its group.
struct PipelineStageOptions {
  /// HOST:PORT of the leader's gRPC server (--pp-leader).
  std::string leader;
  /// The group's stage count (--pp) and the rank wanted (--pp-rank; -1: any free one).
  int pp_size = 2;
  int requested_rank = -1;
  /// Ranks inside the stage (--tp, --threads); device ranks' stage_links carry a device
  /// hand-over when the leader's group uses one.
  TensorParallelOptions tensor_parallel;
  /// The ranks' device as the leader checks it: "cpu", "cuda" or "cuda-sim".
  std::string device = "cpu";
  /// Name the leader logs for this stage (default: the host name).
  std::string name;
  /// Channel credentials (TLS when the leader serves TLS); null: insecure.
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  /// Wait between attempts to reach the leader.
  absl::Duration retry_interval = absl::Seconds(1);
};

/// Counters of a stage process.
struct PipelineStageStats {
  int64_t joins = 0;  // assignments received
  int64_t steps = 0;  // steps answered
  double busy_seconds = 0;  // computing steps (block copies and the forward pass)
};

/// A pipeline stage other than the leader: dials the leader, joins, builds its layers (sharded
/// over its tensor-parallel ranks) and KV pool as assigned, opens its device links when the
/// group hands over device to device, then answers steps until the call ends, and joins again
/// (with a fresh pool: the leader forgets what the old one held). The call's messages are read
/// on a thread of their own, so that a call that ends aborts the links a forward pass may be
/// waiting in. Run()
/// returns on Stop(), or with the leader's reason when it refuses this stage for good
/// (INVALID_ARGUMENT, FAILED_PRECONDITION: wrong model or --pp).
class PipelineStageRunner {
 public:
  /// `weights` (the whole model, usually mapped) must outlive the runner.
  PipelineStageRunner(const ModelWeights* weights, PipelineStageOptions options);
  ~PipelineStageRunner();
  PipelineStageRunner(const PipelineStageRunner&) = delete;
  PipelineStageRunner& operator=(const PipelineStageRunner&) = delete;

  absl::Status Run();
  /// Ends Run() from any thread.
  void Stop();
  /// Called with true once a join is ready, with false when the call ends.
  void SetReadyCallback(std::function<void(bool ready)> callback) {
    ready_callback_ = std::move(callback);
  }
  /// The rank of the current (or last) assignment; -1 before the first.
  int rank() const { return rank_.load(); }
  PipelineStageStats stats() const;

 private:
  /// One call: join, build, serve steps. OK when the call ended after the stage was ready.
  absl::Status Session(grpc::ClientContext* context);

  const ModelWeights* weights_;
  const PipelineStageOptions options_;
  std::function<void(bool)> ready_callback_;
  std::atomic<int> rank_{-1};
  mutable std::mutex mu_;
  bool stopped_ = false;
  grpc::ClientContext* context_ = nullptr;  // the call in progress
  PipelineStageStats stats_;
};

}  // namespace kvserve

#endif  // KVSERVE_WORKER_PP_STAGE_RUNNER_H_
