#ifndef KVSERVE_WORKER_LOADER_HF_CONFIG_H_
#define KVSERVE_WORKER_LOADER_HF_CONFIG_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/gguf/gguf_file.h"
#include "worker/model/model_config.h"

namespace kvserve {

/// Builds a ModelConfig from the text of a Hugging Face config.json and, when not empty, of
/// generation_config.json (whose eos_token_id list is merged into the config's). Supports
/// model_type llama / mistral / qwen2 (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM).
/// rope_style is kHalfSplit: HF checkpoints store q/k rows permuted for rotate_half. The result
/// is validated. Errors start with `config_name` (e.g. "config.json: unsupported architecture
/// 'gpt2' (supported: llama, mistral, qwen2, qwen3)").
absl::StatusOr<ModelConfig> ParseHfConfig(absl::string_view config_json,
                                          absl::string_view generation_config_json,
                                          absl::string_view config_name = "config.json");

/// Reads `dir`/config.json and, if present, `dir`/generation_config.json, then ParseHfConfig.
/// Error messages name the file by its full path.
absl::StatusOr<ModelConfig> LoadHfConfig(const std::string& dir);

/// Builds a ModelConfig from GGUF metadata (general.architecture "llama" or "qwen3"; the
/// `<arch>.*` keys, tokenizer.ggml.* special ids) and the token_embd.weight / output.weight
/// tensors (vocab size, tied embedding). rope_style is kInterleaved for llama (llama.cpp's
/// converter permutes q/k back to Meta's layout) and kHalfSplit for qwen3 (kept as in the HF
/// checkpoint, run with NeoX RoPE). The result is validated; errors name the path.
absl::StatusOr<ModelConfig> ModelConfigFromGguf(const GgufFile& file);

}  // namespace kvserve

#endif  // KVSERVE_WORKER_LOADER_HF_CONFIG_H_
