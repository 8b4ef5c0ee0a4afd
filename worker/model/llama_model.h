#ifndef KVSERVE_WORKER_MODEL_LLAMA_MODEL_H_
#define KVSERVE_WORKER_MODEL_LLAMA_MODEL_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/token.h"
#include "kernels/backend.h"
#include "kernels/cpu/thread_pool.h"
#include "worker/kv/kv_cache.h"
#include "worker/model/weights.h"
#include "worker/tp/stage_link.h"

namespace kvserve {

/// One forward step over a batch of sequences. The new tokens of all sequences are laid out
/// sequence after sequence; sequence s owns token rows [q_start[s], q_start[s] + q_len[s]) and,
/// counting those rows, has context_len[s] tokens in the cache after this step. Decode steps
/// have q_len = 1, prefill q_len = the prompt (or a chunk of it).
struct ForwardBatch {
  std::span<const TokenId> tokens;
  /// Absolute position of each new token (its index in its sequence).
  std::span<const int32_t> positions;
  /// Cache slot (block * block_size + offset) each new token's K/V is written to.
  std::span<const int64_t> slot_mapping;
  std::span<const int32_t> q_start;
  std::span<const int32_t> q_len;
  std::span<const int32_t> context_len;
  /// block_tables[s * block_table_stride + i]: physical block of sequence s's i-th block.
  const int32_t* block_tables = nullptr;
  int64_t block_table_stride = 0;
  /// Token rows whose logits are wanted (usually the last row of each sequence), in output order.
  std::span<const int32_t> logits_rows;
};

/// A pipeline stage's hand-over (worker/pp): the residual stream after the stage's last layer
/// and that layer's MLP output not yet added to it, as [2, tokens, hidden] f32 host memory (the
/// stream's rows, then the pending rows). Handing both over keeps every addition where a
/// whole model does it, so a split model computes the same bits.
struct StageIo {
  /// Every stage but the first: the previous stage's hand-over, read instead of embedding.
  const float* input = nullptr;
  /// Every stage but the last: receives this stage's hand-over (null: not wanted, e.g. a
  /// tensor-parallel rank other than 0).
  float* output = nullptr;
  /// Device hand-over instead (worker/tp/stage_link.h): the input arrives from the previous
  /// stage's device and the output goes to the next stage's, without the host; `input` and
  /// `output` are then unused.
  StageLink* link = nullptr;
};

/// Floats of a hand-over of `tokens` rows of a model `hidden` wide.
inline int64_t StageIoFloats(int64_t tokens, int64_t hidden) { return 2 * tokens * hidden; }

/// Decode steps replayed from graphs (LlamaModel::EnableDecodeGraphs).
struct DecodeGraphOptions {
  /// Largest decode batch replayed from a graph (the scheduler's max_num_seqs); larger ones run
  /// eagerly. Graphs are captured for the sizes DecodeGraphBatchSizes(max_batch).
  int32_t max_batch = 256;
  /// Longest context a replay serves (usually max_position_embeddings): attention is planned
  /// for it, since the plan is fixed at capture.
  int64_t max_context_len = 0;
  /// Block-table entries per sequence in the captured layout (ceil(max_context_len /
  /// block_size)).
  int64_t block_table_stride = 0;
};

/// Counters of the decode-graph path.
struct DecodeGraphStats {
  int64_t captures = 0;       // graphs captured (first use of a size, or again after invalidation)
  int64_t replays = 0;        // decode steps run by replaying a graph
  int64_t eager_decodes = 0;  // decode steps that could not use a graph (too large, too long)
};

/// The padded batch sizes decode graphs are captured for: 1, 2, 4, then multiples of 8, up to
/// and including max_batch (vLLM's choice: few graphs, at most 7 padded rows).
std::vector<int32_t> DecodeGraphBatchSizes(int32_t max_batch);

/// Sums `n` floats at `data` in place across the tensor-parallel ranks (Communicator::
/// AllReduceSum); every rank must call it at the same points with the same n.
using AllReduceFn = std::function<absl::Status(float* data, int64_t n)>;

/// A Llama-family decoder (Llama 2/3, Mistral, Qwen2, Qwen3, TinyLlama, SmolLM) running every op
/// through a Backend (kernels/backend.h): by default the CPU backend, whose kernels read weights
/// in their stored dtype and fan out over the thread pool; or a CUDA backend, whose weights are
/// prepared (uploaded, converted) once at Create and whose activations, workspace and KV cache
/// live in device memory. Activations between ops are in the backend's activation_dtype (f32 on
/// the CPU, bf16 on CUDA); the residual stream, the o / down projections added into it, router
/// logits and logits are f32 everywhere. Not thread-safe: one engine loop drives it.
///
/// Tensor parallelism: given the weights of one rank's shard (worker/tp/shard.h: its config has
/// the rank's head counts and MLP rows) and an `all_reduce` hook, the model computes that rank's
/// partial attention-output and MLP-down projections and sums each across ranks before adding it
/// to the residual stream, so every rank carries the full hidden state.
class LlamaModel {
 public:
  /// `weights` and `pool` must outlive the model. `all_reduce` is empty for a whole model (it
  /// gets device pointers on a device backend). `backend` (must outlive the model) runs the ops;
  /// null means a CPU backend over `pool`, owned by the model. With `all_reduce_enqueues`, the
  /// hook only enqueues the sum on the backend's stream (Communicator::EnqueueAllReduceSum): the
  /// model then does not synchronise before it, a step synchronises once at its end, and decode
  /// graphs can capture the collectives.
  static absl::StatusOr<std::unique_ptr<LlamaModel>> Create(const ModelWeights* weights,
                                                            cpu::ThreadPool* pool,
                                                            AllReduceFn all_reduce = nullptr,
                                                            Backend* backend = nullptr,
                                                            bool all_reduce_enqueues = false);
  ~LlamaModel();
  LlamaModel(const LlamaModel&) = delete;
  LlamaModel& operator=(const LlamaModel&) = delete;

  /// Runs the batch, writing its K/V into `cache` (made with this model's backend) and
  /// `batch.logits_rows.size()` rows of vocab_size logits into the host buffer `logits`. A null
  /// `logits` skips the final norm and vocabulary projection (tensor-parallel ranks other
  /// than 0). The batch's arrays are host memory; a device backend copies them over.
  ///
  /// Pipeline stages (weights from StageWeights): a stage after the first reads io.input instead
  /// of embedding the tokens; a stage before the last computes no logits (`logits` must be null)
  /// and writes its hand-over to io.output.
  absl::Status Forward(const ForwardBatch& batch, KvCache& cache, float* logits,
                       const StageIo& io = {});

  /// Forward whose logits stay on the device: the `batch.logits_rows.size()` rows land in
  /// device_logits() instead of being copied to the host, for sampling there
  /// (worker/engine/device_sampler.h), and stay valid until the next forward pass. Device
  /// backends only (FAILED_PRECONDITION on one whose memory is host memory).
  absl::Status ForwardKeepingLogits(const ForwardBatch& batch, KvCache& cache);
  /// The [logits rows, vocab_size] logits of the last ForwardKeepingLogits, in device memory.
  const float* device_logits() const { return device_logits_.as<float>(); }

  /// The backend the ops run on.
  Backend& backend() { return *backend_; }

  /// From now on, decode-only steps (every sequence adds one token and wants its logits) of at
  /// most options.max_batch sequences are padded to the next DecodeGraphBatchSizes size and
  /// replayed from a graph captured on first use: one launch instead of a few hundred. Padding
  /// rows write their K/V to slot 0 of the null block 0, which block tables never reference for
  /// real tokens. A graph is captured again when a buffer it points into moved (the activation
  /// workspace grew for a larger prefill, the backend's scratch grew) or for another KV cache.
  /// FAILED_PRECONDITION when the backend cannot capture graphs or the model is a
  /// tensor-parallel rank whose all-reduce synchronizes on the host (CPU groups; NCCL ranks
  /// enqueue it, see Create) or a pipeline stage. A tensor-parallel rank without logits
  /// (ranks > 0) captures its layers alone. The step that captures a graph has run eagerly just
  /// before and is not replayed as well, so every rank runs each collective exactly once.
  absl::Status EnableDecodeGraphs(const DecodeGraphOptions& options);
  /// Back to eager decode steps; the captured graphs are released.
  void DisableDecodeGraphs();
  /// Whether decode graphs are on (EnableDecodeGraphs succeeded and no capture failed since).
  bool decode_graphs_enabled() const { return graphs_enabled_; }
  /// Why decode graphs were switched off after a failed capture (empty otherwise); the failed
  /// step and every later one run eagerly.
  const std::string& decode_graph_error() const { return graph_error_; }
  const DecodeGraphStats& decode_graph_stats() const { return graph_stats_; }

  const ModelConfig& config() const { return weights_->config; }
  /// RoPE inverse frequencies per rotated pair, with the model's scaling applied.
  const std::vector<float>& inv_freq() const { return inv_freq_; }

 private:
  /// One layer's weights as the backend uses them.
  struct Expert {
    PreparedMatrix w_gate, w_up, w_down;
  };
  struct Layer {
    PreparedVector attn_norm, ffn_norm, bq, bk, bv, bo, q_norm, k_norm;
    PreparedMatrix wq, wk, wv, wo, w_gate, w_up, w_down;
    // Device backends: q/k/v stacked into one matrix (and their biases into one vector) and
    // gate/up into another, so each is one GEMM; the separate matrices are then left empty.
    // Not for MLA or qk-norm (Qwen3) attention, nor for experts.
    PreparedMatrix w_qkv, w_gate_up;
    PreparedVector b_qkv;
    bool moe = false;             // a mixture-of-experts MLP (else dense)
    PreparedMatrix router;        // mixture of experts only
    std::vector<Expert> experts;  // mixture of experts only
    Expert shared;                // DeepSeek shared experts (rows 0 when absent)
    const float* router_bias = nullptr;  // host [num_experts], DeepSeek-V3 only
    // Multi-head latent attention only.
    PreparedVector q_a_norm, kv_a_norm;
    PreparedMatrix wq_a, wq_b, wkv_a;
    /// Per head: [kv_lora_rank + rope, nope + rope], W_UK^T beside an identity for the rope
    /// part, so one matmul turns the head's q (nope | rope) into its absorbed query
    /// (W_UK^T q_nope | q_rope) (MlaAttention).
    std::vector<PreparedMatrix> w_q_absorb;
    /// Per head: [v_head_dim, kv_lora_rank], W_UV (rows of kv_b_proj).
    std::vector<PreparedMatrix> w_uv;
  };
  /// One token's choice of one expert (mixture of experts).
  struct Route {
    int32_t token;
    float weight;
  };
  /// The batch's arrays where the backend reads them (the host spans themselves on the CPU).
  struct StagedBatch {
    const int32_t* tokens;
    const int32_t* positions;
    const int64_t* slot_mapping;
    const int32_t* q_start;
    const int32_t* q_len;
    const int32_t* context_len;
    const int32_t* block_tables;
    const int32_t* logits_rows;
  };

  /// Everything the queued ops of one step read: the staged arrays and the shape.
  struct Step {
    StagedBatch staged;
    AttentionPlan plan;
    int64_t tokens = 0;
    int64_t seqs = 0;
    int64_t table_stride = 0;
    int64_t logits_rows = 0;
  };
  /// A captured decode graph for one padded batch size, and what it was captured against.
  struct DecodeGraph {
    int handle = -1;
    uint64_t backend_epoch = 0;
    uint64_t buffers_epoch = 0;
    const KvCache* cache = nullptr;
  };

  LlamaModel(const ModelWeights* weights, cpu::ThreadPool* pool, AllReduceFn all_reduce);
  absl::Status PrepareWeights();
  absl::Status CheckBatch(const ForwardBatch& batch, const KvCache& cache) const;
  absl::Status EnsureWorkspace(int64_t num_tokens);
  absl::StatusOr<StagedBatch> Stage(const ForwardBatch& batch);
  /// The staged arrays at `offsets` (Stage's order) inside the device buffer at `base`.
  static StagedBatch StagedAt(const uint8_t* base, const int64_t* offsets);
  AttentionPlan Plan(int64_t seqs, int64_t max_q_len, int64_t max_context_len,
                     const KvCache& cache) const;
  /// Queues the whole forward pass of `step`; `device_logits` (backend memory, or null to skip
  /// the final norm and projection) receives step.logits_rows rows.
  absl::Status Enqueue(const Step& step, KvCache& cache, float* device_logits,
                       const StageIo& io = {});
  absl::Status RunLayer(int layer, const Step& step, KvCache& cache);
  /// Where a forward pass leaves its logits: copied to `host`, left in device_logits_
  /// (`on_device`), or not computed (neither).
  struct LogitsTarget {
    float* host = nullptr;
    bool on_device = false;
    bool wanted() const { return host != nullptr || on_device; }
  };
  /// Forward and ForwardKeepingLogits.
  absl::Status ForwardTo(const ForwardBatch& batch, KvCache& cache, LogitsTarget logits,
                         const StageIo& io);
  /// Whether `batch` is a decode step a graph can replay.
  bool GraphableDecode(const ForwardBatch& batch) const;
  /// Forward of a graphable decode step: pad, stage, capture if needed, replay.
  absl::Status ForwardDecodeGraph(const ForwardBatch& batch, KvCache& cache, LogitsTarget logits);
  /// Makes `*buffer` hold `bytes`, bumping buffers_epoch_ when it moves.
  absl::Status GrowTracked(DeviceBuffer* buffer, int64_t bytes);
  /// The dense SwiGLU MLP of `w` on normed_, into delta_.
  void DenseMlp(const Layer& w, int64_t tokens);
  /// Standard attention of layer `layer` on normed_, into attn_out_ ([T, heads * head_dim]).
  void Attention(int layer, const Step& step, KvCache& cache);
  /// Multi-head latent attention of layer `layer` on normed_, into attn_out_ ([T, heads *
  /// v_head_dim]).
  void MlaAttention(int layer, const Step& step, KvCache& cache);
  /// Builds layer `l`'s w_q_absorb and w_uv from `w`.wkv_b.
  absl::Status PrepareMla(const LayerWeights& w, Layer& l);
  /// Picks each token's experts for `w` from router_logits_ into routes_.
  void RouteTokens(const Layer& w, int64_t tokens, const float* router_logits);
  /// The mixture-of-experts MLP of `w` on normed_, into delta_. Routing runs on the host (the
  /// router's logits are read back), so the step synchronizes once per MoE layer.
  absl::Status MoeMlp(const Layer& w, int64_t tokens);
  /// What a Linear writes: an activation (act_dtype_) or f32 (the projections into the
  /// residual stream, router logits, logits).
  enum class Out : uint8_t { kActivation, kF32 };
  /// y = x W^T (+ bias) over m rows; x in act_dtype_.
  void Linear(const float* x, const PreparedMatrix& w, const PreparedVector& bias, float* y,
              int64_t m, Out out = Out::kActivation);
  /// Linear with explicit row strides (elements) of x and y.
  void LinearStrided(const float* x, int64_t x_stride, const PreparedMatrix& w, float* y,
                     int64_t y_stride, int64_t m, const PreparedVector& bias = PreparedVector{},
                     Out out = Out::kActivation);
  /// `p` advanced by `elems` activations (act_dtype_ elements, whatever p's static type).
  float* ActAt(float* p, int64_t elems) const {
    return reinterpret_cast<float*>(reinterpret_cast<char*>(p) + elems * act_bytes_);
  }
  /// out (f32) = down(silu(gate x) * up x) over `rows` rows of x (hidden wide, act_dtype_),
  /// through gate_ / up_.
  /// SwiGlu with gate and up stacked in one matrix [2 · width, k]: one GEMM writes [rows, 2 ·
  /// width] over gate_ and up_ (adjacent in the workspace), SiLU·mul runs in place.
  void SwiGluStacked(const float* x, const PreparedMatrix& gate_up, const PreparedMatrix& down,
                     float* out, int64_t rows);
  void SwiGlu(const float* x, const PreparedMatrix& gate, const PreparedMatrix& up,
              const PreparedMatrix& down, float* out, int64_t rows);
  void Norm(float* x, const float* residual, const PreparedVector& weight, float* y, int64_t rows);
  /// RMSNorm in place of `rows` rows of x, `stride` apart, over their first `dim` values, with
  /// `weight` ([dim]): Qwen3's per-head q/k norms, MLA's q_a and kv_a norms.
  void NormRows(float* x, int64_t stride, const PreparedVector& weight, int64_t dim, int64_t rows);

  const ModelWeights* weights_;
  cpu::ThreadPool* pool_;
  AllReduceFn all_reduce_;
  bool all_reduce_enqueues_ = false;  // all_reduce_ only enqueues on the backend's stream
  std::vector<float> inv_freq_;
  std::unique_ptr<Backend> owned_backend_;  // the CPU backend when none was given
  Backend* backend_ = nullptr;
  DType act_dtype_ = DType::kF32;  // backend_->activation_dtype(): f32 or bf16
  int64_t act_bytes_ = 4;          // bytes of one activation

  // Weights in backend form (views of the file's bytes on the CPU).
  PreparedMatrix embedding_;
  PreparedMatrix output_;  // data == embedding_.data when tied and the backend shares them
  PreparedVector final_norm_;
  PreparedVector inv_freq_dev_;
  std::vector<Layer> layers_;

  // Activation workspace in backend memory, grown to the largest batch seen; rows are tokens.
  // Slices marked "f32" are f32 on every backend; the others hold act_dtype_ elements (bf16 on
  // CUDA: the pointers then address 16-bit elements; offset them with ActAt).
  int64_t workspace_tokens_ = 0;
  DeviceBuffer workspace_;
  float* hidden_ = nullptr;       // [T, hidden] residual stream, f32
  float* delta_ = nullptr;        // [T, hidden] output of the last attention / MLP block, f32
  float* normed_ = nullptr;       // [T, hidden]
  float* q_ = nullptr;            // [T, heads * head_dim]
  float* k_ = nullptr;            // [T, kv_heads * head_dim]
  float* v_ = nullptr;            // [T, kv_heads * head_dim]
  float* attn_out_ = nullptr;     // [T, heads * head_dim]
  float* gate_ = nullptr;         // [T, intermediate]
  float* up_ = nullptr;           // [T, intermediate]
  float* final_rows_ = nullptr;   // [logits rows, hidden] hidden rows that need logits, f32
  float* final_delta_ = nullptr;  // [logits rows, hidden] their pending block outputs, f32
  // Mixture of experts only (empty slices otherwise).
  float* router_logits_ = nullptr;  // [T, num_experts] f32
  // Multi-head latent attention only (empty slices otherwise).
  float* q_lora_ = nullptr;      // [T, q_lora_rank]
  float* q_heads_ = nullptr;     // [T, heads * (nope + rope)]: q before absorption
  float* latent_out_ = nullptr;  // [T, heads * (kv_lora_rank + rope)]: attention over latents
  // Host copies of MLA's absorbed-query matrices (the CPU backend's prepared views point here).
  std::vector<std::vector<uint8_t>> absorb_storage_;
  float* expert_in_ = nullptr;   // [T * k, hidden] the routed rows, gathered expert by expert
  float* expert_out_ = nullptr;  // [T * (k + 1), hidden] the experts' outputs (shared last), f32
  // Per expert, the tokens routed to it this layer in token order, with their weights.
  std::vector<std::vector<Route>> routes_;
  // MoeMlp's host arrays (router logits read back from a device; the rows to gather, and each
  // token's slots and weights for MoeCombine) and their device copy.
  std::vector<float> host_logits_;
  std::vector<int32_t> moe_gather_;
  std::vector<int32_t> moe_slots_;
  std::vector<float> moe_weights_;
  DeviceBuffer moe_staging_;
  // Device backends only: the staged batch arrays and the logits before they go to the host
  // (graph replays use device_logits_ on every backend).
  DeviceBuffer staging_;
  DeviceBuffer device_logits_;
  // Bumped whenever workspace_ or device_logits_ moves (graphs point into them).
  uint64_t buffers_epoch_ = 0;

  // Decode graphs.
  bool graphs_enabled_ = false;
  DecodeGraphOptions graph_options_;
  std::vector<int32_t> graph_sizes_;  // DecodeGraphBatchSizes(max_batch)
  std::vector<DecodeGraph> graphs_;   // one per size
  DeviceBuffer graph_staging_;        // fixed layout for max_batch, shared by every graph
  std::vector<uint8_t> graph_host_;   // its host image
  int64_t graph_offsets_[8] = {};     // of the staged arrays inside it (Stage's order)
  std::string graph_error_;
  DecodeGraphStats graph_stats_;
};

/// Computes RoPE inverse frequencies for `config` (theta, linear or llama3 scaling, and the
/// optional per-frequency divisors of a GGUF rope_freqs tensor).
std::vector<float> ComputeRopeInvFreq(const ModelConfig& config, const TensorView& rope_freqs);

}  // namespace kvserve

#endif  // KVSERVE_WORKER_MODEL_LLAMA_MODEL_H_
