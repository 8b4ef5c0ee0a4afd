#ifndef KVSERVE_WORKER_TP_TP_MODEL_H_
#define KVSERVE_WORKER_TP_TP_MODEL_H_

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/kv_dtype.h"
#include "worker/kv/kv_cache.h"
#include "worker/model/llama_model.h"
#include "worker/model/weights.h"
#include "worker/tp/communicator.h"
#include "worker/tp/cpu_communicator.h"
#include "worker/tp/shard.h"
#include "worker/tp/stage_link.h"

namespace kvserve {

/// How a TensorParallelModel splits its work.
struct TensorParallelOptions {
  /// Number of ranks (`--tp`). 1 runs the whole model on the calling thread, unsharded.
  int tp_size = 1;
  /// Compute threads over all ranks; each rank gets max(1, num_threads / tp_size) for its
  /// kernels (the rank's own thread included). 0 uses every core. CPU ranks only.
  int num_threads = 0;
  /// Device ranks: called once per rank r = 0..tp_size-1 on the creating thread, returns rank
  /// r's backend (e.g. CUDA device r). Null: CPU ranks, each on its own thread pool.
  std::function<absl::StatusOr<std::unique_ptr<Backend>>(int rank)> make_backend;
  /// Device ranks' collectives (tp_size > 1): returns tp_size communicators over the backends'
  /// memory, rank r's at index r (CreateNcclGroup). Null: the in-process CPU group, which only
  /// CPU ranks can use.
  std::function<absl::StatusOr<std::vector<std::unique_ptr<Communicator>>>(int tp_size)>
      make_communicators;
  /// Device ranks of a pipeline stage: how this process opens its device-to-device hand-over
  /// links (NcclStageLinks). Empty: hand-overs go through the host.
  StageLinkFactory stage_links;
};

/// Device ranks for `options`: rank r on CUDA device r with a backend made from `base`
/// (device_index = r; `first`, when given, is rank 0's, already opened), NCCL between them
/// (base.simulator: the simulator's), and NCCL hand-over links for a pipeline stage's ranks
/// (options->tp_size must be set first). A missing device is FAILED_PRECONDITION when the model
/// is created.
void UseDeviceRanks(TensorParallelOptions* options, const BackendOptions& base,
                    std::unique_ptr<Backend> first = nullptr);

/// The KV memory of every rank: rank r's cache holds rank r's kv heads of every block. All
/// ranks use the same block ids and block tables, so one scheduler and one block pool drive
/// them all; operations on blocks (CopyBlock) apply to every rank.
class ShardedKvCache {
 public:
  /// Number of ranks.
  int tp_size() const { return static_cast<int>(ranks_.size()); }
  /// Rank r's cache.
  KvCache& rank(int r) { return *ranks_[r]; }
  /// Rank r's cache, read-only.
  const KvCache& rank(int r) const { return *ranks_[r]; }
  /// Blocks per rank (the same on every rank).
  int64_t num_blocks() const { return ranks_[0]->num_blocks(); }
  /// Token slots per block.
  int64_t block_size() const { return ranks_[0]->block_size(); }
  /// Element type of the cached K and V.
  KvCacheDType dtype() const { return ranks_[0]->dtype(); }
  /// Copies block `src` to block `dst` on every rank (copy-on-write of a shared block).
  void CopyBlock(int64_t src, int64_t dst);
  /// Bytes of one block on all ranks together: the ranks' KvCache::BlockBytes in rank order.
  int64_t BlockBytes() const;
  /// Copies block `block` of every rank, rank 0 first, into `dst` (BlockBytes() bytes).
  absl::Status ReadBlock(int64_t block, uint8_t* dst) const;
  /// The inverse of ReadBlock.
  absl::Status WriteBlock(int64_t block, const uint8_t* src);
  /// Waits for every rank's queued ReadBlock / WriteBlock copies.
  absl::Status FinishCopies() const;

 private:
  friend class TensorParallelModel;
  ShardedKvCache() = default;

  std::vector<std::unique_ptr<KvCache>> ranks_;
};

/// A Llama model split Megatron-style over `tp_size` ranks (worker/tp/shard.h has the split):
/// CPU ranks talking through an in-process CpuCommGroup, or device ranks (one GPU each, from
/// TensorParallelOptions::make_backend) talking through NCCL. Rank 0 runs on the caller's
/// thread, ranks 1..tp-1 on threads owned by the model. Forward() runs every rank on the same batch: each
/// computes its heads' attention and its MLP rows, the ranks all-reduce (sum in rank order, so
/// results are reproducible) after the attention output projection and after the MLP down
/// projection, and rank 0 alone computes the logits (the output layer is replicated).
///
/// A drop-in for LlamaModel in the engine: the same Forward signature with a ShardedKvCache
/// (from CreateKvCache) in place of a KvCache, and config() is the whole model's. Not
/// thread-safe: one engine loop drives it.
class TensorParallelModel {
 public:
  /// Shards `weights` for options.tp_size ranks and starts the rank threads. `weights` must
  /// outlive the model. INVALID_ARGUMENT when the model cannot be split tp_size ways.
  static absl::StatusOr<std::unique_ptr<TensorParallelModel>> Create(
      const ModelWeights* weights, const TensorParallelOptions& options);
  /// Stops and joins the rank threads.
  ~TensorParallelModel();
  TensorParallelModel(const TensorParallelModel&) = delete;
  TensorParallelModel& operator=(const TensorParallelModel&) = delete;

  /// The whole (unsharded) model's config.
  const ModelConfig& config() const { return weights_->config; }
  /// Number of ranks.
  int tp_size() const { return static_cast<int>(ranks_.size()); }
  /// Rank r's config: its head counts and intermediate size.
  const ModelConfig& rank_config(int r) const { return ranks_[r]->weights->config; }
  /// What rank r holds.
  const ShardPlan& plan(int r) const { return ranks_[r]->plan; }

  /// Per-rank KV caches of `num_blocks` blocks each, ready for Forward.
  absl::StatusOr<std::unique_ptr<ShardedKvCache>> CreateKvCache(
      int64_t num_blocks, int64_t block_size, KvCacheDType dtype = KvCacheDType::kF32) const;
  /// KV bytes of one token over all ranks together (replicated kv heads counted per copy).
  int64_t KvBytesPerToken(KvCacheDType dtype) const;

  /// Runs the batch on every rank, writing each rank's K/V into its cache and
  /// `batch.logits_rows.size()` rows of vocab_size logits into `logits` (rank 0's). Errors are
  /// those of LlamaModel::Forward (the failing rank's, not the others' ABORTED). A CPU group is
  /// re-armed after a failed step; a device group (NCCL) is not, so every later step fails
  /// with FAILED_PRECONDITION naming the first error. A pipeline stage's model (weights from
  /// StageWeights) takes and gives its hand-over through `io` (LlamaModel::Forward): every rank
  /// reads io.input, rank 0 writes io.output.
  absl::Status Forward(const ForwardBatch& batch, ShardedKvCache& cache, float* logits,
                       const StageIo& io = {});

  /// From now on, a pipeline stage's hand-overs go device to device through `links` (rank r's
  /// at index r; StageLinkFactory::open), and Forward's io.input / io.output are unused. A
  /// failed link fails the step with its UNAVAILABLE; on the first stage (which only sends,
  /// after its last collective) the tensor-parallel group stays usable, so the next formation's
  /// links can be set. Empty: back to host hand-overs. Not while Forward runs.
  absl::Status SetStageLinks(std::vector<std::shared_ptr<StageLink>> links);

  /// Decode graphs on every rank (LlamaModel::EnableDecodeGraphs): device ranks whose NCCL
  /// all-reduce runs on their own stream capture their layers' collectives too; rank 0's graph
  /// also holds the logits. All or none: a rank that refuses switches the others off.
  absl::Status EnableDecodeGraphs(const DecodeGraphOptions& options);
  /// Back to eager decode steps on every rank.
  void DisableDecodeGraphs();
  /// Whether every rank replays decode graphs.
  bool decode_graphs_enabled() const;
  /// Rank r's capture and replay counts.
  DecodeGraphStats decode_graph_stats(int r) const;
  /// Why some rank switched its graphs off after a failed capture ("rank R: ..."), or empty.
  std::string decode_graph_error() const;

 private:
  struct Rank {
    ShardPlan plan;
    std::unique_ptr<ModelWeights> shard;  // null for tp 1 (the whole model is used)
    const ModelWeights* weights = nullptr;
    std::unique_ptr<cpu::ThreadPool> pool;  // CPU ranks
    std::unique_ptr<Backend> backend;       // device ranks
    Communicator* comm = nullptr;           // tp > 1
    std::shared_ptr<StageLink> link;        // device hand-over (SetStageLinks)
    std::unique_ptr<LlamaModel> model;
    absl::Status status;  // the last Forward's result on this rank
    std::thread thread;   // ranks >= 1
  };

  explicit TensorParallelModel(const ModelWeights* weights) : weights_(weights) {}
  /// Rank r's thread: runs each posted step.
  void RankLoop(int r);
  /// Runs rank r's part of the current step; on failure aborts the group so no rank waits.
  void RunRank(int r, float* logits, float* stage_output);
  /// Whether `status` is a first stage's failed hand-over send: every rank has passed its last
  /// collective by then, so the group need not be aborted.
  bool SendFailedAfterCollectives(const absl::Status& status) const;

  const ModelWeights* weights_;
  std::unique_ptr<CpuCommGroup> group_;  // CPU ranks, tp > 1
  std::vector<std::unique_ptr<Communicator>> device_comms_;  // device ranks, tp > 1
  absl::Status broken_;  // a device group's first failure (it cannot be re-armed)
  std::vector<std::unique_ptr<Rank>> ranks_;

  // The step being run, posted by Forward to the rank threads.
  std::mutex mu_;
  std::condition_variable start_cv_;
  std::condition_variable done_cv_;
  uint64_t step_ = 0;
  int pending_ = 0;
  bool stop_ = false;
  const ForwardBatch* batch_ = nullptr;
  ShardedKvCache* cache_ = nullptr;
  StageIo io_;
};

}  // namespace kvserve

#endif  // KVSERVE_WORKER_TP_TP_MODEL_H_
