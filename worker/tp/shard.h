#ifndef KVSERVE_WORKER_TP_SHARD_H_
#define KVSERVE_WORKER_TP_SHARD_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "worker/model/weights.h"

namespace kvserve {

/// Which part of the model one tensor-parallel rank holds (Megatron-style). Ranges are
/// half-open, in units of heads or of intermediate (MLP) rows.
///
///  - Query heads: num_heads / tp consecutive heads per rank (num_heads % tp == 0 required).
///  - KV heads: when tp divides num_kv_heads, num_kv_heads / tp consecutive heads per rank;
///    when num_kv_heads divides tp, each rank holds the one kv head its query heads read
///    (replicated on tp / num_kv_heads ranks). Anything else is an error.
///  - MLP: the intermediate rows split as evenly as possible in units of the down projection's
///    quantization block (1 for plain dtypes), so ranks may differ by one unit. In a
///    mixture-of-experts model every expert is cut at the same rows of its own width
///    (moe_intermediate_size), DeepSeek's shared experts at rows of theirs, and the router is
///    replicated.
///  - Multi-head latent attention: query heads as above (q / q_b and kv_b rows, o columns); the
///    latent down-projections (q_a, kv_a) and their norms are replicated, and every rank caches
///    the whole latent row.
///  - Token embedding, output layer and norms: replicated on every rank. (A vocab-parallel
///    embedding/output is a later optimisation: it saves vocab * hidden * (tp - 1) / tp weights
///    per rank at the price of an all-gather of the logits.)
struct ShardPlan {
  int rank = 0;
  int tp = 1;
  int q_head_begin = 0, q_head_end = 0;
  int kv_head_begin = 0, kv_head_end = 0;
  /// Rows of the dense MLP (intermediate_size); empty when every layer is mixture-of-experts.
  int64_t ffn_begin = 0, ffn_end = 0;
  /// Rows of each routed expert and of the shared experts (mixture of experts only).
  int64_t expert_begin = 0, expert_end = 0;
  int64_t shared_begin = 0, shared_end = 0;
  /// True when several ranks hold copies of the same kv head (tp > num_kv_heads).
  bool kv_replicated = false;
};

/// Works out rank `rank`'s part of `weights` under tensor parallelism `tp`. INVALID_ARGUMENT
/// (naming the tensor or config field) when tp does not divide the heads, the kv heads cannot be
/// distributed, a rank would get no MLP rows, or a quantized tensor would be cut inside a block.
absl::StatusOr<ShardPlan> PlanShard(const ModelWeights& weights, int rank, int tp);

/// Builds rank `rank`'s weights at load time from the full model (no pre-split files):
///  - wq / wk / wv / w_gate / w_up (and q/k/v biases) split by output rows: zero-copy views of
///    a contiguous row range of the full tensor;
///  - wo / w_down split by input columns: copied into buffers owned by the shard (the CPU
///    matmul has no row stride), on quantization-block boundaries;
///  - everything else shared as the same views.
/// The shard's config carries the per-rank head counts and intermediate size. The result points
/// into `weights`' storage: `weights` must outlive it.
absl::StatusOr<std::unique_ptr<ModelWeights>> ShardWeights(const ModelWeights& weights, int rank,
                                                           int tp);

/// Pipeline stage weights: decoder layers [first, first + count) of `weights` as views (no
/// copies), with config.layer_offset = first and config.total_layers = the whole model's layer
/// count. The first stage keeps the token embedding, the last the final norm and the output
/// layer (and the embedding when the output is tied to it); other stages hold neither. The result
/// points into `weights`' storage: `weights` must outlive it. INVALID_ARGUMENT for a range outside
/// the model. Shard the result (ShardWeights) for tensor parallelism inside the stage.
absl::StatusOr<std::unique_ptr<ModelWeights>> StageWeights(const ModelWeights& weights, int first,
                                                           int count);

}  // namespace kvserve

#endif  // KVSERVE_WORKER_TP_SHARD_H_
