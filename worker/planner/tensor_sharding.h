#ifndef KVSERVE_WORKER_PLANNER_TENSOR_SHARDING_H_
#define KVSERVE_WORKER_PLANNER_TENSOR_SHARDING_H_

#include <cstdint>
#include <string_view>

#include "worker/planner/model_spec.h"

namespace kvserve {

/// How a checkpoint tensor is laid out under tensor parallelism (see ShardedSizes).
enum class TensorSharding { kSplit, kReplicated, kVocabParallel, kKvHeads, kSkip };

/// Classifies a Hugging Face tensor name ("model.layers.3.self_attn.k_proj.weight"). Tensors of
/// layers at or past `num_layers` (DeepSeek-V3's multi-token-prediction layer) and rotary
/// caches are kSkip: inference does not load them.
TensorSharding ClassifyHfTensor(std::string_view name, int num_layers);

/// Classifies a GGUF tensor name ("blk.3.attn_k.weight", "token_embd.weight").
TensorSharding ClassifyGgufTensor(std::string_view name, int num_layers);

/// Adds `bytes` to the field of `sizes` that `sharding` names (nothing for kSkip).
void AddShardedBytes(TensorSharding sharding, int64_t bytes, ShardedSizes& sizes);

}  // namespace kvserve

#endif  // KVSERVE_WORKER_PLANNER_TENSOR_SHARDING_H_
