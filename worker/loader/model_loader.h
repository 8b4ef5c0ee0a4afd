#ifndef KVSERVE_WORKER_LOADER_MODEL_LOADER_H_
#define KVSERVE_WORKER_LOADER_MODEL_LOADER_H_

#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "common/gguf/gguf_file.h"
#include "kernels/dtype.h"
#include "worker/model/weights.h"

namespace kvserve {

/// Loads a model for serving. `path` is either
///   - a GGUF file (general.architecture "llama"; tensors token_embd, blk.N.attn_{norm,q,k,v,
///     output}, blk.N.ffn_{norm,gate,up,down}, output_norm, optional output (absent: tied) and
///     rope_freqs), or
///   - a Hugging Face directory with config.json, tokenizer.json and either model.safetensors or
///     model.safetensors.index.json (every shard named in its weight_map is mapped once).
/// Every tensor's shape is checked against the config; matmul weights and the embedding stay in
/// the file's dtype as zero-copy views into the mapping (copied only if misaligned for their
/// element type); norm weights, biases and rope_freqs are converted to F32 owned buffers.
/// Errors name the file and the problem, e.g. "<file>: tensor 'blk.3.attn_k.weight' has shape
/// [64, 30], expected [32, 64]". A model without a tokenizer is refused.
absl::StatusOr<std::unique_ptr<ModelWeights>> LoadModelWeights(const std::string& path);

/// The dtype a GGUF tensor of type `t` loads as; nullopt for the types kvserve does not load.
std::optional<DType> DTypeFromGgml(GgmlType t);

/// The GGUF tensor type of `d` (every DType has one; DTypeFromGgml(GgmlTypeOf(d)) == d).
GgmlType GgmlTypeOf(DType d);

}  // namespace kvserve

#endif  // KVSERVE_WORKER_LOADER_MODEL_LOADER_H_
