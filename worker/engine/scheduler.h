#ifndef KVSERVE_WORKER_ENGINE_SCHEDULER_H_
#define KVSERVE_WORKER_ENGINE_SCHEDULER_H_

#include <climits>
#include <cstdint>
#include <deque>
#include <vector>

#include "absl/status/status.h"
#include "worker/engine/sequence.h"
#include "worker/kv/kv_manager.h"

namespace kvserve {

/// Limits of one engine step.
struct SchedulerOptions {
  /// Most sequences running at once.
  int32_t max_num_seqs = 256;
  /// Token budget of one step: decode tokens plus prefill (chunk) tokens.
  int32_t max_num_batched_tokens = 2048;
  /// Split prompts longer than the remaining budget across steps; when off, a prompt is only
  /// admitted when all of it fits in one step.
  bool enable_chunked_prefill = true;
  /// Reuse cached blocks of identical prefixes.
  bool enable_prefix_caching = true;

  absl::Status Validate() const;
};

/// One sequence's share of a step: tokens [seq->num_computed, seq->num_computed + num_tokens).
struct ScheduledSequence {
  Sequence* seq = nullptr;
  int32_t num_tokens = 0;
  /// The step computes the sequence's last pending token, so its logits are sampled.
  bool wants_logits = false;
};

struct SchedulerOutput {
  std::vector<ScheduledSequence> scheduled;
  /// Sequences pushed back to the waiting queue this step (their blocks are freed).
  std::vector<Sequence*> preempted;
  int32_t num_batched_tokens = 0;
};

/// Continuous (iteration-level) batching with a token budget and chunked prefill, in the style
/// of vLLM v1: there are no separate prefill and decode phases, each step hands every sequence
/// the number of tokens it should compute next.
///
/// Each step first serves running sequences in admission order (decodes take 1 token, unfinished
/// prefills the next chunk), growing their block tables. When the pool runs dry the newest
/// running sequence is preempted (recompute: its blocks are freed and it waits at the front of
/// the queue with its generated tokens kept). Then, if nothing was preempted, waiting sequences
/// are admitted first-come-first-served while budget, sequence slots and blocks last; each
/// starts on the longest cached prefix of its tokens.
///
/// The scheduler owns no sequence; the engine does, and tells it when one leaves (Remove).
class Scheduler {
 public:
  Scheduler(const SchedulerOptions& options, KvManager* kv);

  /// Queues a new sequence at the back of the waiting queue.
  void AddWaiting(Sequence* seq);
  /// Adds a sequence that already holds blocks (a fork of a running one) to the running set.
  void AddRunning(Sequence* seq);
  /// Takes a sequence out of the scheduler (finished or aborted) and frees its blocks.
  void Remove(Sequence* seq);

  /// Plans the next step and reserves the KV slots it writes, for at most `max_seqs` sequences
  /// (pipeline micro-batches). Sequences in flight (Sequence::in_flight) are neither scheduled
  /// nor preempted; when only they could make room, the step stops where the pool runs dry.
  SchedulerOutput Schedule(int32_t max_seqs = INT32_MAX);
  /// Running sequences not in flight.
  int32_t num_schedulable() const;
  /// Records that the scheduled tokens were computed: advances num_computed, registers newly
  /// full blocks in the prefix cache and drops blocks a sliding window no longer needs.
  void OnStepDone(const SchedulerOutput& output);

  int32_t num_waiting() const { return static_cast<int32_t>(waiting_.size()); }
  int32_t num_running() const { return static_cast<int32_t>(running_.size()); }
  int64_t num_preemptions() const { return num_preemptions_; }
  const std::vector<Sequence*>& running() const { return running_; }
  /// The next sequence to admit, or null.
  Sequence* front_waiting() const { return waiting_.empty() ? nullptr : waiting_.front(); }

 private:
  /// Preempts the newest running sequence not in flight at index `first` or later (those before
  /// it are already in this step); returns it, or null when there is none.
  Sequence* PreemptNewest(size_t first);
  /// Admits waiting sequences into the remaining budget, up to `max_seqs` scheduled.
  void AdmitWaiting(SchedulerOutput& out, int32_t& budget, int32_t max_seqs);

  SchedulerOptions options_;
  KvManager* kv_;
  std::deque<Sequence*> waiting_;
  /// In admission order; the back is the newest.
  std::vector<Sequence*> running_;
  int64_t num_preemptions_ = 0;
};

}  // namespace kvserve

#endif  // KVSERVE_WORKER_ENGINE_SCHEDULER_H_
