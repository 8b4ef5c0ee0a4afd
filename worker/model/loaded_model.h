#ifndef KVSERVE_WORKER_MODEL_LOADED_MODEL_H_
#define KVSERVE_WORKER_MODEL_LOADED_MODEL_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/tokenizer/tokenizer.h"
#include "worker/model/weights.h"

namespace kvserve {

/// A model ready to run: its weights (memory-mapped) and its tokenizer.
struct LoadedModel {
  std::unique_ptr<ModelWeights> weights;
  std::unique_ptr<Tokenizer> tokenizer;

  const ModelConfig& config() const { return weights->config; }
  /// Token ids that end generation: the config's EOS ids plus the tokenizer's EOS.
  std::vector<TokenId> StopTokenIds() const;
};

/// Loads a GGUF file or a Hugging Face model directory with its tokenizer. Every failure is a
/// one-line message naming the file and the problem.
absl::StatusOr<LoadedModel> LoadModel(const std::string& path);

}  // namespace kvserve

#endif  // KVSERVE_WORKER_MODEL_LOADED_MODEL_H_
