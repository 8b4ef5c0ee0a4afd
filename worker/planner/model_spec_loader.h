#ifndef KVSERVE_WORKER_PLANNER_MODEL_SPEC_LOADER_H_
#define KVSERVE_WORKER_PLANNER_MODEL_SPEC_LOADER_H_

#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "common/gguf/gguf_file.h"
#include "worker/planner/model_spec.h"

namespace kvserve {

/// Reads a ModelSpec from `path`:
///  - a Hugging Face model directory: its config.json, plus the exact weight bytes from the
///    safetensors headers (model.safetensors.index.json and its shards, else model.safetensors,
///    else every *.safetensors but consolidated*); only the headers are read;
///  - a config.json file alone (no tensors: weight bytes come from the parameter count);
///  - a GGUF file (hyper-parameters from its metadata, bytes from its tensor table).
/// Errors name the file and the field.
absl::StatusOr<ModelSpec> LoadModelSpec(const std::string& path);

/// Parses the text of a config.json. Knows model_type llama, mistral, qwen2, qwen3, mixtral,
/// deepseek_v2 and deepseek_v3; any other type with the Llama fields (hidden_size,
/// num_hidden_layers, num_attention_heads, intermediate_size, vocab_size) is treated as Llama
/// and flagged `assumed_llama_like`. `origin` names the file in errors.
absl::StatusOr<ModelSpec> ModelSpecFromConfigJson(std::string_view json_text,
                                                  const std::string& origin);

/// Exact weight bytes from the safetensors headers in `dir` (see LoadModelSpec); nullopt when the
/// directory holds no safetensors file. Tensors of layers >= `num_layers` are skipped.
absl::StatusOr<std::optional<ShardedSizes>> SafetensorsWeightBytes(const std::string& dir,
                                                                   int num_layers);

/// Builds a ModelSpec from a parsed GGUF file (architectures llama — Mixtral when it has
/// experts —, qwen2, qwen3 and deepseek2).
absl::StatusOr<ModelSpec> ModelSpecFromGguf(const GgufFile& file);

}  // namespace kvserve

#endif  // KVSERVE_WORKER_PLANNER_MODEL_SPEC_LOADER_H_
