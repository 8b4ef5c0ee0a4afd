#ifndef KVSERVE_WORKER_PP_PIPELINE_GROUP_H_
#define KVSERVE_WORKER_PP_PIPELINE_GROUP_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
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

/// The leader's side of a pipeline-parallel group: the kvserve.v1.Pipeline service stages join
/// through (register service() on the leader's gRPC server), and the PipelineLink the leader's
/// engine drives.
///
/// Host hand-over (CPU stages): stages hand over through the leader: the engine sends a step to
/// stage 1, and the thread that reads stage r's answer passes it on to stage r + 1 at once; the
/// last stage answers with the logits. Each stage's stream has one writer (the engine for stage
/// 1, stage r - 1's reader after that), so steps reach every stage in submission order.
///
/// Device hand-over (EnableDeviceHandOver: CUDA stages, NCCL send/recv between them): once every
/// stage is ready the group forms: the leader makes a formation id, sends it to every stage
/// (`connect`), and opens its own links; the group is formed when every stage has answered
/// `connected`. The engine writes each step to every stage at once (it is then every stream's
/// only writer), and each stage answers when its part is done, the last with the logits. A
/// lost stage aborts the formation's links (so no device waits for it) and drops every other
/// stage too, since their links died with it: they all join again and form anew.
///
/// Thread-safe.
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
  /// Called (outside the group's lock, one call at a time) whenever formed() changes; the state
  /// when it is set counts as heard.
  void SetFormedCallback(std::function<void(bool formed)> callback);
  /// Ends every stage's call and refuses new ones (before the server shuts down).
  void Shutdown();
  PipelineGroupStats stats() const override;

  // PipelineLink.
  const std::vector<StageLayers>& stages() const override { return options_.stages; }
  void SetKvPool(int64_t num_blocks, int32_t block_size, KvCacheDType dtype) override;
  void EnableDeviceHandOver(int tp_size, std::string device, StageLinkFactory links) override;
  bool device_hand_over() const override;
  uint64_t LeaderLinks(std::vector<std::shared_ptr<StageLink>>* links) const override;
  bool formed() const override;
  std::string NotFormedReason() const override;
  uint64_t losses() const override;
  std::shared_ptr<PipelineFlight> SubmitStages(const ForwardBatch& batch,
                                               std::span<const BlockCopy> copies,
                                               std::span<const float> hand_over) override;
  absl::Status AwaitStages(PipelineFlight& flight, float* logits) override;

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
    uint64_t connected = 0;  // the formation whose links it opened (device hand-over)
    bool lost = false;
    int writers = 0;  // threads inside stream->Write
    std::string lost_reason;
  };
  /// A submitted step; guarded by mu_ except `msg`, which only the thread sending it to its
  /// next stage touches.
  struct Flight final : PipelineFlight {
    uint64_t id = 0;
    int stage = 1;             // host hand-over: the stage computing it now
    std::vector<int> pending;  // stages yet to answer, in rank order
    int64_t logits_floats = 0;
    absl::Time start;
    absl::Time deadline;  // for the next answer
    v1::LeaderMessage msg;
    bool done = false;
    absl::Status status;
    std::string logits;  // the last stage's output
  };

  explicit PipelineGroup(PipelineGroupOptions options);
  /// Join's handshake: checks the stage and gives it a rank (or the reason it cannot have one).
  absl::StatusOr<v1::StageAssignment> Admit(const std::shared_ptr<Connection>& conn,
                                            const v1::StageJoin& join);
  void MarkReady(const std::shared_ptr<Connection>& conn);
  /// Device hand-over: forms the group once every stage is ready (see the class comment).
  void Connect();
  void MarkConnected(const std::shared_ptr<Connection>& conn, uint64_t formation);
  void Deliver(const std::shared_ptr<Connection>& conn, v1::StepResult result);
  /// Drops `conn` from the group (once) with `reason`; cancels its call. With a device
  /// hand-over, also aborts the formation and drops the other stages (`regroup`: this drop is
  /// one of those, not counted as a loss).
  void Drop(const std::shared_ptr<Connection>& conn, const std::string& reason,
            bool regroup = false);
  /// Writes `msg` to `conn`'s stream (dropping the stage when the write fails); false when
  /// `conn` is gone.
  bool Write(const std::shared_ptr<Connection>& conn, const v1::LeaderMessage& msg);
  bool AllReadyLocked() const;
  /// Waits until no thread writes to `conn`'s stream (before its handler returns).
  void AwaitNoWriter(const Connection& conn);
  /// Sends `flight` to stage flight->stage (dropping the stage when the write fails).
  void Send(const std::shared_ptr<Flight>& flight);
  /// Cancels calls whose stage is past its deadline.
  void Watchdog();
  bool FormedLocked() const;
  /// Calls the formed callback when formed() changed since it last did.
  void NotifyFormed();

  const PipelineGroupOptions options_;
  std::unique_ptr<Service> service_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::shared_ptr<Connection>> members_;  // by rank; [0] unused (the leader)
  bool pool_set_ = false;
  int64_t num_blocks_ = 0;
  int32_t block_size_ = 0;
  KvCacheDType kv_dtype_ = KvCacheDType::kF32;
  // Device hand-over (EnableDeviceHandOver).
  bool device_ = false;
  int tp_size_ = 1;
  std::string device_name_;
  StageLinkFactory link_factory_;
  uint64_t formation_ = 0;   // the newest formation started; bumped by a loss to void it
  bool connecting_ = false;  // Connect() is running
  std::vector<std::shared_ptr<StageLink>> links_;  // the leader's, of formation_ once open
  bool shut_down_ = false;
  uint64_t next_step_ = 0;
  /// Steps in flight, by id.
  std::map<uint64_t, std::shared_ptr<Flight>> flights_;
  std::atomic<uint64_t> losses_{0};
  PipelineGroupStats stats_;
  std::function<void(bool)> formed_callback_;
  /// Serializes NotifyFormed; notified_formed_ is what the callback last heard.
  std::mutex notify_mu_;
  bool notified_formed_ = false;
  std::thread watchdog_;
};

}  // namespace kvserve

#endif  // KVSERVE_WORKER_PP_PIPELINE_GROUP_H_
