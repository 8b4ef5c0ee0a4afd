// Request validation from arbitrary bytes: parse a kvserve.v1.GenerateRequest, convert it as
// the worker does (ToEngineRequest: prompt tokenization, vocabulary checks, count saturation)
// and run SamplingParams::Validate. Every request must either be refused with
// INVALID_ARGUMENT or yield an engine request whose prompt ids are inside the vocabulary.
// The model is stories260K's tokenizer with its config's vocabulary and context; no weights.

#include <cstdint>
#include <memory>
#include <string>

#include "tests/fuzz/fuzz_util.h"
#include "worker/server/proto_convert.h"

namespace kvserve {
namespace {

const LoadedModel& Model() {
  static const LoadedModel* model = [] {
    auto* m = new LoadedModel;
    m->weights = std::make_unique<ModelWeights>();
    m->weights->config.vocab_size = 512;
    m->weights->config.max_position_embeddings = 512;
    absl::StatusOr<std::unique_ptr<Tokenizer>> t =
        Tokenizer::FromJsonFile(KVSERVE_SHARED_DIR "/models/stories260K-hf/tokenizer.json");
    if (!t.ok()) fuzz::Fail("cannot load the tokenizer: " + t.status().ToString());
    m->tokenizer = *std::move(t);
    return m;
  }();
  return *model;
}

}  // namespace
}  // namespace kvserve

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvserve;  // NOLINT: a fuzz entry point outside the namespace
  const LoadedModel& model = Model();
  v1::GenerateRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return 0;
  absl::StatusOr<EngineRequest> converted = ToEngineRequest(request, model);
  if (!converted.ok()) {
    if (converted.status().code() != absl::StatusCode::kInvalidArgument) {
      fuzz::Fail("conversion failed with " + converted.status().ToString());
    }
    return 0;
  }
  const int vocab = model.config().vocab_size;
  if (converted->prompt_ids.empty()) fuzz::Fail("an empty prompt was accepted");
  for (TokenId id : converted->prompt_ids) {
    if (id < 0 || id >= vocab) fuzz::Fail("a prompt id outside the vocabulary was accepted");
  }
  if (converted->n < 1) fuzz::Fail("n below 1 after conversion");
  absl::Status valid = converted->params.Validate(vocab);
  if (!valid.ok() && valid.code() != absl::StatusCode::kInvalidArgument) {
    fuzz::Fail("Validate failed with " + valid.ToString());
  }
  return 0;
}
