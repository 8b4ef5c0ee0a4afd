#ifndef KVSERVE_WORKER_ENGINE_ENGINE_H_
#define KVSERVE_WORKER_ENGINE_ENGINE_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/kv_dtype.h"
#include "worker/engine/device_sampler.h"
#include "worker/engine/request.h"
#include "worker/engine/scheduler.h"
#include "worker/engine/sequence.h"
#include "worker/kv/kv_cache.h"
#include "worker/kv/kv_manager.h"
#include "worker/kv/kv_offload.h"
#include "worker/kv/kv_transfer.h"
#include "worker/model/batch_builder.h"
#include "worker/model/llama_model.h"
#include "worker/model/loaded_model.h"
#include "worker/tp/pipeline_link.h"
#include "worker/tp/tp_model.h"

namespace kvserve {

/// How an engine sizes its KV pool and batches its work. Defaults suit the CPU backend.
struct EngineOptions {
  /// Tokens per KV block.
  int32_t block_size = 16;
  /// KV pool size in blocks (including the reserved null block). 0: derive from kv_cache_memory.
  int64_t num_kv_blocks = 0;
  /// Bytes of KV memory when num_kv_blocks is 0 (--kv-cache-memory).
  int64_t kv_cache_memory = 0;
  /// When num_kv_blocks and kv_cache_memory are 0 and this is > 0: the pool gets this fraction
  /// of the device's memory minus the weights and the activation peak, computed by the capacity
  /// planner (on the CPU the device is the machine's RAM). When all three are 0: room for
  /// max_num_seqs full-length sequences, capped at 4 GiB and, for a pool in host memory, at half
  /// of the memory the machine has available (DefaultKvBudget).
  double gpu_memory_utilization = 0.0;
  /// Device memory for gpu_memory_utilization; 0 reads it from the system.
  int64_t device_memory = 0;
  /// device_memory is what each tensor-parallel rank has to itself (one GPU per rank), so the
  /// planner shards the weights and KV over tensor_parallel_size devices. False: the ranks share
  /// it (CPU threads). Set by the engine for CUDA ranks.
  bool device_memory_per_rank = false;
  /// Element type of the cached K and V.
  KvCacheDType kv_cache_dtype = KvCacheDType::kF32;
  /// Tiers of the prefix cache below the device pool (host memory, disk); off by default.
  /// They need prefix caching.
  KvOffloadOptions kv_offload;
  SchedulerOptions scheduler;
  /// Most samples per request (n).
  int32_t max_n = 16;
  /// Compute threads; 0 uses every core.
  int32_t num_threads = 0;
  /// Tensor-parallel ranks (--tp): the model is split Megatron-style over this many rank
  /// threads (CPU: each with num_threads / tp kernel threads; CUDA: one GPU each).
  int32_t tensor_parallel_size = 1;
  /// Where the model runs (--device): kCpu, kCuda (fails when no usable GPU), or kAuto (CUDA
  /// when a usable GPU is present, else the CPU, saying why once on stderr). With CUDA and
  /// tensor_parallel_size N > 1, rank r runs on device r and the ranks all-reduce over NCCL.
  DeviceChoice device = DeviceChoice::kCpu;
  /// Pipeline parallelism (--pp > 1 on the leader): the group of stage processes
  /// (worker/pp/pipeline_group.h; must outlive the engine). The engine runs stage 0's layers
  /// (sharded over tensor_parallel_size ranks) and hands each step on through it; its KV pool
  /// sizes every stage's. Null: the whole model runs here.
  PipelineLink* pipeline = nullptr;
  /// A pipeline leader on CUDA devices: stages hand over device to device over NCCL
  /// (`--pp-hand-over device`, PipelineLink::EnableDeviceHandOver); false hands over through
  /// the leader's host memory over gRPC, as CPU stages always do (`host`).
  bool pipeline_device_hand_over = true;
  /// CUDA: replay decode steps of up to min(max_num_seqs, 512) sequences from CUDA graphs
  /// (LlamaModel::EnableDecodeGraphs); false (`--enforce-eager`) launches every op each step.
  bool cuda_graphs = true;
  /// CUDA: keep f32 weights in f32 (BackendOptions::keep_f32_weights) instead of bf16.
  bool keep_f32_weights = false;
  /// CUDA, sm_89+: FP8 E4M3 Matmul weights with row scales (BackendOptions::fp8_weights,
  /// `--quantization fp8`). Refused on the CPU.
  bool fp8_weights = false;
  /// CUDA (one GPU, no pipeline): a step whose every sampled sequence the device kernel serves
  /// exactly (DeviceSampler::RowParams, no constraint) is sampled where its logits are, and only
  /// the token ids come back to the host; the tokens are the host sampler's. False
  /// (`--host-sampling`) copies the logits and samples on the host always. The CPU backend
  /// samples on the host either way (its sampler is the faster there).
  bool device_sampling = true;
  /// Tests: after every step check the pool's invariants and that no live sequence holds more
  /// than block_size - 1 allocated-but-unused slots; violations are counted in EngineStats.
  bool check_invariants = false;
  /// Sample a step's sequences in parallel on num_threads threads once the step has at least
  /// this many logits (sequences x vocab); smaller steps sample on the loop thread.
  int64_t parallel_sampling_min_logits = int64_t{1} << 16;
  /// Run steps on an engine thread. When false nothing runs until the owner calls StepOnce():
  /// tests use this to observe the pool between steps.
  bool run_loop_thread = true;

  absl::Status Validate() const;
};

/// A consistent snapshot of the engine, taken at the end of a step.
struct EngineStats {
  int32_t num_running = 0;
  int32_t num_waiting = 0;
  int32_t total_blocks = 0;
  int32_t used_blocks = 0;
  int32_t cached_free_blocks = 0;
  int32_t free_blocks = 0;
  int64_t prefix_query_tokens = 0;
  int64_t prefix_hit_tokens = 0;
  /// Part of prefix_hit_tokens restored from the host or disk tier.
  int64_t prefix_restored_tokens = 0;
  /// The tiers below the device pool (all zero when they are off).
  KvOffloader::Stats kv_tiers;
  /// Blocks brought from or read out for other workers.
  KvTransferSource::Stats kv_transfer;
  /// Prompt tokens computed per second of forward pass, over the steps that computed at least
  /// four blocks of prompt tokens (0 before the first): what a worker weighs a KV transfer
  /// against.
  double prefill_tokens_per_second = 0.0;
  int64_t num_preemptions = 0;
  int64_t num_steps = 0;
  int64_t num_finished_requests = 0;
  int64_t invariant_violations = 0;
  /// Wall time of the engine loop's busy turns (scheduling, the forward pass, sampling,
  /// detokenization, bookkeeping), and the part of it spent in the model's forward pass:
  /// 1 - forward_seconds / step_seconds is the engine's overhead.
  double step_seconds = 0.0;
  double forward_seconds = 0.0;
  /// A pipeline leader: the part of forward_seconds its own stage computed (the rest waited
  /// for the other stages); its busy fraction over a run measures the pipeline's bubble.
  double local_stage_seconds = 0.0;
  /// Part of step_seconds spent on constrained decoding: token masks and parser advances,
  /// summed over the sequences (parallel sampling threads add up, so it can exceed the wall).
  double constraint_seconds = 0.0;
  /// Tokens sampled on the device (EngineOptions::device_sampling) rather than on the host.
  int64_t device_sampled_tokens = 0;
  std::string first_violation;
};

/// The default KV budget when no size is given: room for every sequence at full length
/// (`full_bytes`), at most 4 GiB, and for a pool in host memory at most half of
/// `available_bytes` (the machine's available memory; 0: unknown, no such cap).
int64_t DefaultKvBudget(int64_t full_bytes, int64_t available_bytes, bool host_pool);

/// The worker's engine: one loop thread owns the scheduler, the KV pool and the model, and runs
/// steps while there is work; any thread submits, reads its request's stream, and aborts.
class Engine {
 public:
  /// `model` must outlive the engine. Starts the loop thread.
  static absl::StatusOr<std::unique_ptr<Engine>> Create(const LoadedModel* model,
                                                        const EngineOptions& options);
  /// Stops the loop; unfinished requests end with CANCELLED.
  ~Engine();

  /// Validates and queues a request. INVALID_ARGUMENT names the bad field; RESOURCE_EXHAUSTED
  /// when the prompt cannot fit in the KV pool even alone; ALREADY_EXISTS for a live id.
  absl::StatusOr<std::shared_ptr<RequestStream>> Submit(EngineRequest request);
  /// Ends a request at once, freeing its blocks; its stream gets a CANCELLED final message.
  /// Unknown or finished ids are ignored.
  void Abort(const std::string& request_id);

  /// Stops admitting requests (Submit answers UNAVAILABLE); queued and running ones finish.
  void Drain();
  bool draining() const;
  /// True when no request is queued or running.
  bool idle() const;

  /// Reads the cached K/V of the blocks with chain hashes `keys` (a prompt's full blocks from
  /// index `first_block` on, HashFullBlocks) for another worker, on the loop thread between two
  /// steps, stopping at the first block held in no tier and after `max_bytes`. `done` gets the
  /// blocks on the loop thread (an empty list when the engine stops first); it must not block.
  void ExportKvBlocks(std::vector<BlockKey> keys, int32_t first_block, int64_t max_bytes,
                      std::function<void(std::vector<KvBlockPayload>)> done);
  /// What this engine's KV blocks depend on: the model's fingerprint and the layout, with the
  /// compute path appended (blocks move only between engines with equal identities). The
  /// fingerprint reads every tensor's ends, so it is computed on the first call, not at start-up.
  /// Thread-safe.
  const KvTierIdentity& kv_identity() const;
  /// Bytes of one KV block (every layer and rank).
  int64_t kv_block_bytes() const { return block_access_.block_bytes; }

  /// Subscribes to prefix-cache changes: the first batch is a snapshot of every cached block
  /// (reset), then one batch per step that stored or evicted blocks. With KV tiers the events
  /// also say which blocks the host and disk tiers hold (KvEvent::tier).
  std::shared_ptr<KvEventStream> SubscribeKvEvents();

  /// Manual mode (run_loop_thread == false): takes queued submissions and aborts and runs one
  /// step. Returns false when there was nothing to do.
  bool StepOnce();

  /// Reports step and request metrics to `observer` from the loop's next iteration on
  /// (nullptr stops reporting). The engine holds a reference while it reports.
  void SetObserver(std::shared_ptr<EngineObserver> observer);

  EngineStats stats() const;
  const EngineOptions& options() const { return options_; }
  int64_t num_kv_blocks() const { return num_kv_blocks_; }
  /// "cpu" or "cuda": the backend the model runs on.
  std::string_view device_name() const { return device_name_; }

 private:
  Engine(const LoadedModel* model, const EngineOptions& options);
  /// Picks the device and creates the model and its KV pool (sized by PoolBlocks).
  absl::Status CreateModel();
  /// Decode-graph shapes for `weights`: batches up to max_num_seqs (at most 512), the model's
  /// whole context.
  DecodeGraphOptions DecodeGraphOptionsFor(const ModelWeights& weights) const;
  /// Sets block_access_ and kv_layout_ for the model's KV pool.
  void DescribeKvPool();
  /// Creates the host / disk tiers of options_.kv_offload over the model's KV pool, and the
  /// block source the prefix lookup restores from.
  absl::Status CreateOffloader();
  /// Runs the tasks queued by ExportKvBlocks.
  void RunTasks();
  /// KV pool size in blocks for these options (see EngineOptions), via the capacity planner.
  /// `host_pool`: the pool lives in host memory (the CPU path), so the default is also capped
  /// by the memory available. `activation_bytes`: 2 where the backend keeps activations in bf16.
  static absl::StatusOr<int64_t> PoolBlocks(const ModelWeights& weights,
                                            const EngineOptions& options, bool host_pool,
                                            int activation_bytes);
  void Loop();
  /// Moves submitted and aborted requests from the inbox into the scheduler.
  void DrainInbox();
  void Step();
  /// A step on its way: launched (stage 0 computed, the rest submitted to the pipeline's
  /// stages, or the whole forward pass done in one process) and not yet sampled.
  struct Flight {
    SchedulerOutput out;
    std::vector<Sequence*> sampled;  // sequences whose logits rows the step yields, in order
    /// [sampled, vocab] on the host; with device_sampling only the host_rows, in their order.
    std::vector<float> logits;
    /// The logits stayed on the device (device_model_->device_logits()) to be sampled there,
    /// except the rows of sequences the device sampler cannot serve (host_rows, indices into
    /// `sampled`): only those are copied to the host and sampled there.
    bool device_sampling = false;
    std::vector<int64_t> host_rows;
    StepMetrics metrics;
    int64_t prompt_tokens = 0;
    double forward_seconds = 0.0;  // this process's forward pass plus the wait for the stages
    absl::Status status;           // of the forward pass here
    std::shared_ptr<PipelineFlight> remote;  // pipeline: the stages' part
  };
  /// Builds the step's batch and runs its forward pass (a pipeline leader: its stage, then
  /// submits the rest), marking its sequences in flight; queues it in in_flight_.
  void Launch(SchedulerOutput out);
  /// Waits for the oldest step in flight, then samples and emits its tokens (or fails its
  /// requests) as one engine step.
  void CompleteOldest();
  void CompleteAll();
  /// CompleteOldest's work after the wait.
  void FinishStep(Flight& f, const absl::Status& status);
  /// A pipeline leader's most sequences for the next micro-batch: what can run now, split over
  /// the free micro-batch slots (one per stage).
  int32_t MicroBatchLimit() const;
  /// A pipeline leader after a stage was lost: fails every request (UNAVAILABLE) and forgets
  /// the prefix cache, whose K/V the lost stage held in part.
  void HandlePipelineLoss();
  /// One sequence's sampling in a step: its logits row and, after SampleAll, its draw.
  struct PendingSample {
    Sequence* seq = nullptr;
    std::span<const float> logits;
    int64_t row = 0;  // the logits row (its index in Flight::sampled)
    absl::StatusOr<SampleResult> result = absl::UnknownError("not sampled");
    /// Time spent on this sequence's token mask.
    double constraint_seconds = 0.0;
  };
  /// Creates a sequence's sampler, stop checker and detokenizer (aborting its request if the
  /// parameters are refused).
  void InitSampling(Sequence* seq);
  /// Draws the next token of every pending sequence, in parallel over the vocabulary-sized work.
  void SampleAll(std::span<PendingSample* const> pending);
  /// Whether `seq`'s next token can be sampled on the device (EngineOptions::device_sampling).
  bool DeviceSampleable(const Sequence* seq) const;
  /// SampleAll for a step whose logits stayed on the device: one kernel launch for every
  /// pending sequence, each drawing its uniform from its own sampler's RNG.
  void SampleOnDevice(std::span<PendingSample* const> pending);
  /// Appends the drawn token, streams its text and finishes the sequence if it stops; in order.
  void Emit(PendingSample& p);
  /// Forks the remaining samples of a request off its first sequence after prefill.
  void ForkSamples(Sequence* parent);
  void FinishSequence(Sequence* seq, RequestOutput final_output);
  void AbortRequest(RequestState* request, absl::Status status);
  /// Drops a request that has no unfinished sample left.
  void ForgetRequest(RequestState* request);
  void CheckInvariants();
  /// Sends new subscribers their snapshot and everyone the step's events.
  void PublishKvEvents();
  void PublishStats();
  /// Metrics bookkeeping for a sampled token of `seq` (at step_time_).
  void RecordToken(Sequence* seq);
  /// Reports a request that ended to the observer.
  void ReportFinished(RequestState* state, FinishReason reason, absl::StatusCode code);

  const LoadedModel* model_;
  EngineOptions options_;
  // CPU: the (tensor-parallel) model and its per-rank caches. CUDA: one LlamaModel and KvCache
  // on backend_ (declared first: destroyed last).
  std::unique_ptr<Backend> backend_;
  std::string device_name_ = "cpu";
  /// A pipeline leader's own layers (views of the model's weights).
  std::unique_ptr<ModelWeights> stage_weights_;
  std::unique_ptr<TensorParallelModel> llama_;  // owns the ranks' thread pools
  uint64_t links_formation_ = 0;                // the pipeline formation whose links llama_ holds
  std::unique_ptr<ShardedKvCache> cache_;
  std::unique_ptr<LlamaModel> device_model_;
  std::unique_ptr<KvCache> device_cache_;
  bool graph_failure_logged_ = false;
  int64_t num_kv_blocks_ = 0;
  std::unique_ptr<KvManager> kv_;
  /// Host / disk tiers (null when off).
  std::unique_ptr<KvOffloader> offloader_;
  /// Blocks pulled from other workers, then offloader_: what kv_ restores from.
  std::unique_ptr<KvTransferSource> transfer_;
  KvBlockAccess block_access_;
  /// KvTierIdentity::layout of the pool (without the compute path), and the identity that
  /// kv_identity() builds once.
  std::string kv_layout_;
  mutable std::once_flag kv_identity_once_;
  mutable KvTierIdentity kv_identity_;
  // Prompt tokens computed and the forward time of the steps that computed them.
  int64_t prefill_tokens_ = 0;
  double prefill_seconds_ = 0.0;
  int64_t next_request_serial_ = 1;
  std::unique_ptr<Scheduler> scheduler_;
  std::vector<TokenId> stop_token_ids_;
  /// Constrained decoding: compiled constraints shared between requests, and the vocabulary as
  /// a byte trie (built by the first constrained request).
  constraint::ConstraintCompiler constraint_compiler_;
  std::once_flag token_trie_once_;
  std::shared_ptr<const constraint::TokenTrie> token_trie_;

  /// Samples a step's sequences in parallel; null with one thread.
  std::unique_ptr<cpu::ThreadPool> sampling_pool_;
  /// Samples device_model_'s logits where they are; null when the engine samples on the host.
  std::unique_ptr<DeviceSampler> device_sampler_;
  int64_t device_sampled_tokens_ = 0;  // EngineStats::device_sampled_tokens

  // Loop-thread state.
  absl::flat_hash_map<std::string, std::unique_ptr<RequestState>> requests_;
  SeqId next_seq_id_ = 1;
  BatchBuilder builder_;
  // Pipeline leader: stage 0's hand-over, the block copies the stages have not applied yet, and
  // the stage losses already dealt with.
  std::vector<float> hand_over_;
  std::deque<Flight> in_flight_;
  std::vector<BlockCopy> pipeline_copies_;
  uint64_t pipeline_losses_seen_ = 0;
  int64_t num_steps_ = 0;
  int64_t num_finished_ = 0;
  int64_t invariant_violations_ = 0;
  std::string first_violation_;
  // Metrics: the observer in use, the current step's figures and its token time.
  std::shared_ptr<EngineObserver> observer_;
  StepMetrics step_metrics_;
  double step_seconds_ = 0.0;     // EngineStats::step_seconds
  double forward_seconds_ = 0.0;  // EngineStats::forward_seconds
  double local_stage_seconds_ = 0.0;  // EngineStats::local_stage_seconds
  double constraint_seconds_ = 0.0;  // EngineStats::constraint_seconds
  // Inside Step(): final outputs of sequences finished by this step, pushed once its metrics
  // are out (see Step()).
  bool in_step_ = false;
  std::vector<std::pair<std::shared_ptr<RequestStream>, RequestOutput>> finished_outputs_;
  std::chrono::steady_clock::time_point step_time_{};

  // Shared with submitting threads.
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::unique_ptr<RequestState>> inbox_;
  std::vector<std::string> aborts_;
  std::vector<std::function<void()>> tasks_;
  absl::flat_hash_map<std::string, bool> live_ids_;
  bool stop_ = false;
  bool draining_ = false;
  std::vector<std::shared_ptr<KvEventStream>> new_subscribers_;
  std::shared_ptr<EngineObserver> shared_observer_;
  // Loop-thread side of the subscriptions.
  std::vector<std::shared_ptr<KvEventStream>> subscribers_;
  EngineStats stats_;

  std::thread thread_;
};

}  // namespace kvserve

#endif  // KVSERVE_WORKER_ENGINE_ENGINE_H_
