#ifndef KVSERVE_WORKER_MODEL_SYNTHETIC_MODEL_H_
#define KVSERVE_WORKER_MODEL_SYNTHETIC_MODEL_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "kernels/dtype.h"
#include "worker/model/weights.h"

namespace kvserve {

/// Shape and storage of a random-weight Llama model, for benchmarks and tests at realistic sizes.
struct SyntheticModelOptions {
  int num_layers = 2;
  int hidden_size = 256;
  int num_heads = 4;
  int num_kv_heads = 4;
  int intermediate_size = 688;
  int vocab_size = 1024;
  int max_position_embeddings = 2048;
  /// dtype of the matmul weights and the embedding (norms are always F32).
  DType dtype = DType::kF32;
  bool tie_word_embeddings = false;
  uint64_t seed = 1;
};

/// Builds a model in memory with weights drawn uniformly from [-a, a], a = 1/sqrt(fan_in) (so
/// activations stay O(1) through the layers), norm weights 1. Deterministic for a given seed.
absl::StatusOr<std::unique_ptr<ModelWeights>> MakeSyntheticModel(const SyntheticModelOptions& options);

}  // namespace kvserve

#endif  // KVSERVE_WORKER_MODEL_SYNTHETIC_MODEL_H_
