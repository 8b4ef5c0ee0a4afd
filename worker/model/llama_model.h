#ifndef KVSERVE_WORKER_MODEL_LLAMA_MODEL_H_
#define KVSERVE_WORKER_MODEL_LLAMA_MODEL_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/token.h"
#include "kernels/backend.h"
#include "kernels/cpu/thread_pool.h"
#include "worker/kv/kv_cache.h"
#include "worker/model/weights.h"

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

/// Sums `n` floats at `data` in place across the tensor-parallel ranks (Communicator::
/// AllReduceSum); every rank must call it at the same points with the same n.
using AllReduceFn = std::function<absl::Status(float* data, int64_t n)>;

/// A Llama-family decoder (Llama 2/3, Mistral, Qwen2, TinyLlama, SmolLM) with fp32 activations,
/// running every op through a Backend (kernels/backend.h): by default the CPU backend, whose
/// kernels read weights in their stored dtype and fan out over the thread pool; or a CUDA
/// backend, whose weights are prepared (uploaded, converted) once at Create and whose
/// activations, workspace and KV cache live in device memory. Not thread-safe: one engine loop
/// drives it.
///
/// Tensor parallelism: given the weights of one rank's shard (worker/tp/shard.h: its config has
/// the rank's head counts and MLP rows) and an `all_reduce` hook, the model computes that rank's
/// partial attention-output and MLP-down projections and sums each across ranks before adding it
/// to the residual stream, so every rank carries the full hidden state.
class LlamaModel {
 public:
  /// `weights` and `pool` must outlive the model. `all_reduce` is empty for a whole model (it
  /// gets device pointers on a device backend). `backend` (must outlive the model) runs the ops;
  /// null means a CPU backend over `pool`, owned by the model.
  static absl::StatusOr<std::unique_ptr<LlamaModel>> Create(const ModelWeights* weights,
                                                            cpu::ThreadPool* pool,
                                                            AllReduceFn all_reduce = nullptr,
                                                            Backend* backend = nullptr);
  ~LlamaModel();
  LlamaModel(const LlamaModel&) = delete;
  LlamaModel& operator=(const LlamaModel&) = delete;

  /// Runs the batch, writing its K/V into `cache` (made with this model's backend) and
  /// `batch.logits_rows.size()` rows of vocab_size logits into the host buffer `logits`. A null
  /// `logits` skips the final norm and vocabulary projection (tensor-parallel ranks other
  /// than 0). The batch's arrays are host memory; a device backend copies them over.
  absl::Status Forward(const ForwardBatch& batch, KvCache& cache, float* logits);

  /// The backend the ops run on.
  Backend& backend() { return *backend_; }

  const ModelConfig& config() const { return weights_->config; }
  /// RoPE inverse frequencies per rotated pair, with the model's scaling applied.
  const std::vector<float>& inv_freq() const { return inv_freq_; }

 private:
  /// One layer's weights as the backend uses them.
  struct Layer {
    PreparedVector attn_norm, ffn_norm, bq, bk, bv;
    PreparedMatrix wq, wk, wv, wo, w_gate, w_up, w_down;
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

  LlamaModel(const ModelWeights* weights, cpu::ThreadPool* pool, AllReduceFn all_reduce);
  absl::Status PrepareWeights();
  absl::Status CheckBatch(const ForwardBatch& batch, const KvCache& cache) const;
  absl::Status EnsureWorkspace(int64_t num_tokens);
  absl::StatusOr<StagedBatch> Stage(const ForwardBatch& batch);
  absl::Status RunLayer(int layer, const ForwardBatch& batch, const StagedBatch& staged,
                        const AttentionPlan& plan, KvCache& cache, int64_t num_tokens);
  void Linear(const float* x, const PreparedMatrix& w, const PreparedVector& bias, float* y,
              int64_t m);
  void Norm(float* x, const float* residual, const PreparedVector& weight, float* y, int64_t rows);

  const ModelWeights* weights_;
  cpu::ThreadPool* pool_;
  AllReduceFn all_reduce_;
  std::vector<float> inv_freq_;
  std::unique_ptr<Backend> owned_backend_;  // the CPU backend when none was given
  Backend* backend_ = nullptr;

  // Weights in backend form (views of the file's bytes on the CPU).
  PreparedMatrix embedding_;
  PreparedMatrix output_;  // data == embedding_.data when tied and the backend shares them
  PreparedVector final_norm_;
  PreparedVector inv_freq_dev_;
  std::vector<Layer> layers_;

  // Activation workspace in backend memory, grown to the largest batch seen; rows are tokens.
  int64_t workspace_tokens_ = 0;
  DeviceBuffer workspace_;
  float* hidden_ = nullptr;       // [T, hidden] residual stream
  float* delta_ = nullptr;        // [T, hidden] output of the last attention / MLP block
  float* normed_ = nullptr;       // [T, hidden]
  float* q_ = nullptr;            // [T, heads * head_dim]
  float* k_ = nullptr;            // [T, kv_heads * head_dim]
  float* v_ = nullptr;            // [T, kv_heads * head_dim]
  float* attn_out_ = nullptr;     // [T, heads * head_dim]
  float* gate_ = nullptr;         // [T, intermediate]
  float* up_ = nullptr;           // [T, intermediate]
  float* final_rows_ = nullptr;   // [logits rows, hidden] hidden rows that need logits
  float* final_delta_ = nullptr;  // [logits rows, hidden] their pending block outputs
  // Device backends only: the staged batch arrays and the logits before they go to the host.
  DeviceBuffer staging_;
  DeviceBuffer device_logits_;
};

/// Computes RoPE inverse frequencies for `config` (theta, linear or llama3 scaling, and the
/// optional per-frequency divisors of a GGUF rope_freqs tensor).
std::vector<float> ComputeRopeInvFreq(const ModelConfig& config, const TensorView& rope_freqs);

}  // namespace kvserve

#endif  // KVSERVE_WORKER_MODEL_LLAMA_MODEL_H_
