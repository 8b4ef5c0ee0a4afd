#ifndef KVSERVE_WORKER_TP_PIPELINE_LINK_H_
#define KVSERVE_WORKER_TP_PIPELINE_LINK_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "kernels/kv_dtype.h"
#include "worker/kv/kv_manager.h"
#include "worker/model/llama_model.h"
#include "worker/planner/pipeline_layout.h"
#include "worker/tp/stage_link.h"

namespace kvserve {

/// Counters of a pipeline group, for metrics and benchmarks.
struct PipelineGroupStats {
  int32_t stages = 0;          // P
  int32_t stages_ready = 0;    // stages 1..P-1 joined and ready, plus the leader
  int64_t in_flight = 0;       // steps in flight now
  int64_t max_in_flight = 0;   // most steps in flight at once (micro-batches)
  int64_t steps = 0;           // steps run over every remote stage
  int64_t joins = 0;           // stages admitted
  int64_t losses = 0;          // stages lost (closed, failed, timed out)
  int64_t block_copies = 0;    // copy-on-write block copies sent (each to every stage)
  int64_t bytes_sent = 0;      // hand-overs sent to stages
  int64_t bytes_received = 0;  // hand-overs and logits received
  double remote_seconds = 0;   // submission to logits, summed over steps
};

/// A step submitted to the remote stages of a pipeline group (PipelineLink::SubmitStages).
class PipelineFlight {
 public:
  virtual ~PipelineFlight() = default;
};

/// What the leader's engine sees of a pipeline-parallel group (worker/pp/pipeline_group.h):
/// stages 1..P-1 in other processes, each holding a slice of the layers and the KV of every
/// block for them. The engine runs stage 0 itself and hands each step on through this.
class PipelineLink {
 public:
  virtual ~PipelineLink() = default;

  /// Every stage's layers, stage 0 (the leader's) first.
  virtual const std::vector<StageLayers>& stages() const = 0;
  /// Called once by the engine when its KV pool is sized: every stage holds the same blocks.
  virtual void SetKvPool(int64_t num_blocks, int32_t block_size, KvCacheDType dtype) = 0;
  /// Called once by the engine, before SetKvPool, when its stage runs on devices that can hand
  /// over device to device (`links`: TensorParallelOptions::stage_links): every stage must then
  /// run `device` with `tp_size` ranks, and each formation of the group opens links between
  /// them. SubmitStages then takes no hand-over: the engine's stage sends its own through the
  /// leader's links (LeaderLinks), after submitting the step.
  virtual void EnableDeviceHandOver(int tp_size, std::string device, StageLinkFactory links) = 0;
  /// Whether EnableDeviceHandOver was called.
  virtual bool device_hand_over() const = 0;
  /// The leader's links of the current formation, rank 0's first (empty while the group is not
  /// formed), and the formation's number: when it changes, the engine's model takes the new
  /// links (TensorParallelModel::SetStageLinks). A lost stage aborts them.
  virtual uint64_t LeaderLinks(std::vector<std::shared_ptr<StageLink>>* links) const = 0;
  /// Whether every stage has joined and is ready.
  virtual bool formed() const = 0;
  /// Why the group is not formed ("waiting for stage 1 (layers 31..60)"); empty when formed.
  virtual std::string NotFormedReason() const = 0;
  /// How many times a stage was lost so far. When it changes, the K/V the lost stage held is
  /// gone: the engine fails its requests and forgets its prefix cache.
  virtual uint64_t losses() const = 0;
  virtual PipelineGroupStats stats() const = 0;
  /// Starts stages 1..P-1 on `batch` after the leader's own stage: they apply `copies`
  /// (copy-on-write block copies made since the last submitted step) first, the hand-over
  /// (stage 0's StageIo output) goes along, and the last stage's logits come back to
  /// AwaitStages. Steps run on every stage in the order they were submitted, and several may be
  /// in flight at once (micro-batches: while stage 1 computes one, the leader computes the next).
  /// The batch's arrays are copied: they may change once this returns. With a device hand-over
  /// `hand_over` is empty, and every stage gets the step at once.
  virtual std::shared_ptr<PipelineFlight> SubmitStages(const ForwardBatch& batch,
                                                       std::span<const BlockCopy> copies,
                                                       std::span<const float> hand_over) = 0;
  /// Waits for `flight` and writes its batch.logits_rows rows of vocab floats to `logits`.
  /// UNAVAILABLE when a stage is missing, lost or does not answer in time (the stage is then
  /// dropped from the group, and every step in flight fails with it).
  virtual absl::Status AwaitStages(PipelineFlight& flight, float* logits) = 0;
};

}  // namespace kvserve

#endif  // KVSERVE_WORKER_TP_PIPELINE_LINK_H_
