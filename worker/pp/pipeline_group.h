#ifndef KVSERVE_WORKER_PP_PIPELINE_GROUP_H_
#define KVSERVE_WORKER_PP_PIPELINE_GROUP_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/block_hash/block_hash.h"
#include "kvserve/v1/pipeline.grpc.pb.h"
#include "worker/tp/pipeline_link.h"

namespace kvserve {

/// How the leader runs its group.
struct PipelineGroupOptions {
  /// Every stage's layers (SplitLayers), the leader's first; at least 2 stages.
  std::vector<StageLayers> stages;
  /// ModelWeightsFingerprint of the leader's model: a stage must present the same.
  BlockKey model_fingerprint;
  /// The model's hidden size and vocabulary (hand-over and logits sizes).
  int64_t hidden_size = 0;
  int64_t vocab_size = 0;
  /// A stage that has not answered a step this long after it was sent is dropped
  /// (--pp-step-timeout).
  absl::Duration step_timeout = absl::Seconds(60);
};

/// Counters of a group, for metrics and benchmarks.
struct PipelineGroupStats {
  int64_t steps = 0;           // steps run over every remote stage
  int64_t joins = 0;           // stages admitted
  int64_t losses = 0;          // stages lost (closed, failed, timed out)
  int64_t block_copies = 0;    // copy-on-write block copies sent (each to every stage)
  int64_t bytes_sent = 0;      // hand-overs sent to stages
  int64_t bytes_received = 0;  // hand-overs and logits received
  double remote_seconds = 0;   // time spent waiting on remote stages
};

/// The leader's side of a pipeline-parallel group: the kvserve.v1.Pipeline service stages join
/// through (register service() on the leader's gRPC server), and the PipelineLink the leader's
/// engine drives. Stages hand over in a star: the leader sends each step to stage 1, passes its
/// answer to stage 2, and so on; the last stage answers with the logits. Thread-safe.
class PipelineGroup final : public PipelineLink {
 public:
  /// INVALID_ARGUMENT for fewer than 2 stages or a non-positive size or timeout.
  static absl::StatusOr<std::unique_ptr<PipelineGroup>> Create(PipelineGroupOptions options);
  /// Shutdown().
  ~PipelineGroup() override;
  PipelineGroup(const PipelineGroup&) = delete;
  PipelineGroup& operator=(const PipelineGroup&) = delete;

  /// The service to register on the leader's server (owned by the group).
  grpc::Service* service();
  /// Called (outside the group's lock) whenever formed() changes.
  void SetFormedCallback(std::function<void(bool formed)> callback);
  /// Ends every stage's call and refuses new ones (before the server shuts down).
  void Shutdown();
  PipelineGroupStats stats() const;

  // PipelineLink.
  const std::vector<StageLayers>& stages() const override { return options_.stages; }
  void SetKvPool(int64_t num_blocks, int32_t block_size, KvCacheDType dtype) override;
  bool formed() const override;
  std::string NotFormedReason() const override;
  uint64_t losses() const override;
  absl::Status RunStages(const ForwardBatch& batch, std::span<const BlockCopy> copies,
                         std::vector<float>* hand_over, float* logits) override;

 private:
  class Service;
  /// One stage's call.
  struct Connection {
    grpc::ServerContext* context = nullptr;
    grpc::ServerReaderWriter<v1::LeaderMessage, v1::StageMessage>* stream = nullptr;
    int rank = -1;
    std::string name;
    // Guarded by the group's mu_.
    bool ready = false;
    bool lost = false;
    bool writing = false;  // Exchange is inside stream->Write
    std::string lost_reason;
    uint64_t awaited_step = 0;  // the step whose result RunStages waits for (0: none)
    absl::Time deadline = absl::InfiniteFuture();
    bool has_result = false;
    v1::StepResult result;
  };

  explicit PipelineGroup(PipelineGroupOptions options);
  /// Join's handshake: checks the stage and gives it a rank (or the reason it cannot have one).
  absl::StatusOr<v1::StageAssignment> Admit(const std::shared_ptr<Connection>& conn,
                                            const v1::StageJoin& join);
  void MarkReady(const std::shared_ptr<Connection>& conn);
  void Deliver(const std::shared_ptr<Connection>& conn, v1::StepResult result);
  /// Drops `conn` from the group (once) with `reason`; cancels its call.
  void Drop(const std::shared_ptr<Connection>& conn, const std::string& reason);
  /// Waits until no Exchange writes to `conn`'s stream (before its handler returns).
  void AwaitNoWriter(const Connection& conn);
  /// Sends `msg` to stage `rank` and waits for its result.
  absl::StatusOr<v1::StepResult> Exchange(int rank, const v1::LeaderMessage& msg, uint64_t step);
  /// Cancels calls whose stage is past its deadline.
  void Watchdog();
  bool FormedLocked() const;
  void NotifyFormed(bool was_formed);

  const PipelineGroupOptions options_;
  std::unique_ptr<Service> service_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::shared_ptr<Connection>> members_;  // by rank; [0] unused (the leader)
  bool pool_set_ = false;
  int64_t num_blocks_ = 0;
  int32_t block_size_ = 0;
  KvCacheDType kv_dtype_ = KvCacheDType::kF32;
  bool shut_down_ = false;
  uint64_t next_step_ = 0;
  std::atomic<uint64_t> losses_{0};
  PipelineGroupStats stats_;
  std::function<void(bool)> formed_callback_;
  std::thread watchdog_;
};

}  // namespace kvserve

#endif  // KVSERVE_WORKER_PP_PIPELINE_GROUP_H_
