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

/// A Llama-family decoder (Llama 2/3, Mistral, Qwen2, TinyLlama, SmolLM) running on the CPU
/// kernels in fp32, with weights read in their stored dtype. Not thread-safe: one engine loop
/// drives it; the kernels fan out over the thread pool.
///
/// Tensor parallelism: given the weights of one rank's shard (worker/tp/shard.h: its config has
/// the rank's head counts and MLP rows) and an `all_reduce` hook, the model computes that rank's
/// partial attention-output and MLP-down projections and sums each across ranks before adding it
/// to the residual stream, so every rank carries the full hidden state.
class LlamaModel {
 public:
  /// `weights` and `pool` must outlive the model. `all_reduce` is empty for a whole model.
  static absl::StatusOr<std::unique_ptr<LlamaModel>> Create(const ModelWeights* weights,
                                                            cpu::ThreadPool* pool,
                                                            AllReduceFn all_reduce = nullptr);

  /// Runs the batch, writing its K/V into `cache` and `batch.logits_rows.size()` rows of
  /// vocab_size logits into `logits`. A null `logits` skips the final norm and vocabulary
  /// projection (tensor-parallel ranks other than 0).
  absl::Status Forward(const ForwardBatch& batch, KvCache& cache, float* logits);

  const ModelConfig& config() const { return weights_->config; }
  /// RoPE inverse frequencies per rotated pair, with the model's scaling applied.
  const std::vector<float>& inv_freq() const { return inv_freq_; }

 private:
  LlamaModel(const ModelWeights* weights, cpu::ThreadPool* pool, AllReduceFn all_reduce);
  absl::Status CheckBatch(const ForwardBatch& batch, const KvCache& cache) const;
  void EnsureWorkspace(int64_t num_tokens);
  absl::Status RunLayer(int layer, const ForwardBatch& batch, KvCache& cache, int64_t num_tokens);

  const ModelWeights* weights_;
  cpu::ThreadPool* pool_;
  AllReduceFn all_reduce_;
  std::vector<float> inv_freq_;

  // Activation workspace, grown to the largest batch seen; rows are tokens.
  int64_t workspace_tokens_ = 0;
  std::vector<float> hidden_;    // [T, hidden] residual stream
  std::vector<float> delta_;     // [T, hidden] output of the last attention / MLP block
  std::vector<float> normed_;    // [T, hidden]
  std::vector<float> q_;         // [T, heads * head_dim]
  std::vector<float> k_;         // [T, kv_heads * head_dim]
  std::vector<float> v_;         // [T, kv_heads * head_dim]
  std::vector<float> attn_out_;  // [T, heads * head_dim]
  std::vector<float> gate_;      // [T, intermediate]
  std::vector<float> up_;        // [T, intermediate]
  std::vector<float> final_rows_;  // [logits_rows, hidden]
};

/// Computes RoPE inverse frequencies for `config` (theta, linear or llama3 scaling, and the
/// optional per-frequency divisors of a GGUF rope_freqs tensor).
std::vector<float> ComputeRopeInvFreq(const ModelConfig& config, const TensorView& rope_freqs);

}  // namespace kvserve

#endif  // KVSERVE_WORKER_MODEL_LLAMA_MODEL_H_
