#include "worker/model/loaded_model.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/tokenizer_loader/tokenizer_loader.h"
#include "worker/loader/model_loader.h"

namespace kvserve {

std::vector<TokenId> LoadedModel::StopTokenIds() const {
  std::vector<TokenId> ids = weights->config.eos_token_ids;
  if (tokenizer->eos_id() != kNoToken &&
      std::find(ids.begin(), ids.end(), tokenizer->eos_id()) == ids.end()) {
    ids.push_back(tokenizer->eos_id());
  }
  return ids;
}

absl::StatusOr<LoadedModel> LoadModel(const std::string& path) {
  LoadedModel model;
  absl::StatusOr<std::unique_ptr<ModelWeights>> weights = LoadModelWeights(path);
  if (!weights.ok()) return weights.status();
  model.weights = std::move(*weights);
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = LoadTokenizer(path);
  if (!tokenizer.ok()) return tokenizer.status();
  model.tokenizer = std::move(*tokenizer);
  if (model.tokenizer->vocab_size() > model.config().vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": tokenizer has ", model.tokenizer->vocab_size(), " tokens but the model only ",
        model.config().vocab_size));
  }
  return model;
}

}  // namespace kvserve
