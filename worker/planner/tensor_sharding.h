#ifndef KVSERVE_WORKER_PLANNER_TENSOR_SHARDING_H_
#define KVSERVE_WORKER_PLANNER_TENSOR_SHARDING_H_

#include <cstdint>
#include <string_view>

#include "worker/planner/model_spec.h"

namespace kvserve {

/// How a checkpoint tensor is laid out under tensor parallelism (see ShardedAmounts).
enum class TensorSharding { kSplit, kReplicated, kVocabParallel, kKvHeads, kSkip };

/// Which part of the model a tensor belongs to, which decides the pipeline stages that hold it
/// (see ShardedSizes).
enum class ModelPart {
  /// Decoder layer TensorClass::layer: the stage owning that layer.
  kLayer,
  /// The token embedding: the first stage.
  kEmbedding,
  /// The final norm and the output head: the last stage.
  kOutput,
  /// Anything else outside the decoder layers (GGUF rope_freqs): every stage.
  kOther,
};

/// A checkpoint tensor's sharding and place in the model.
struct TensorClass {
  TensorSharding sharding = TensorSharding::kSkip;
  ModelPart part = ModelPart::kOther;
  /// The decoder layer (0-based) for part kLayer, else -1.
  int layer = -1;

  /// Compares the sharding alone, for callers that only ask how the tensor is laid out.
  friend bool operator==(const TensorClass& tensor, TensorSharding sharding) {
    return tensor.sharding == sharding;
  }
};

/// Classifies a Hugging Face tensor name ("model.layers.3.self_attn.k_proj.weight"). Tensors of
/// layers at or past `num_layers` (DeepSeek-V3's multi-token-prediction layer) and rotary
/// caches are kSkip: inference does not load them.
TensorClass ClassifyHfTensor(std::string_view name, int num_layers);

/// Classifies a GGUF tensor name ("blk.3.attn_k.weight", "token_embd.weight").
TensorClass ClassifyGgufTensor(std::string_view name, int num_layers);

/// Adds `bytes` to the field of `sizes` that `sharding` names (nothing for kSkip).
void AddShardedBytes(TensorSharding sharding, int64_t bytes, ShardedAmounts& sizes);

/// Adds `bytes` to the totals of `sizes` and to the part of the model `tensor` sits in (nothing
/// for kSkip).
void AddShardedBytes(const TensorClass& tensor, int64_t bytes, ShardedSizes& sizes);

}  // namespace kvserve

#endif  // KVSERVE_WORKER_PLANNER_TENSOR_SHARDING_H_
