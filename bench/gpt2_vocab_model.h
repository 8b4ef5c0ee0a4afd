// The synthetic model the engine and cluster benchmarks serve: a Llama of 4 layers, hidden 512,
// 8 heads (and 8 KV heads) of 64, FFN 1408, bf16 weights, with the GPT-2 vocabulary (50257 ids)
// and tokenizer, so that sampling and detokenization work over a realistic vocabulary.
#ifndef KVSERVE_BENCH_GPT2_VOCAB_MODEL_H_
#define KVSERVE_BENCH_GPT2_VOCAB_MODEL_H_

#include <memory>

#include "common/tokenizer_loader/tokenizer_loader.h"
#include "worker/model/loaded_model.h"
#include "worker/model/synthetic_model.h"

namespace kvserve {

/// The GPT-2 tokenizer.json the model uses (the router loads it too).
inline constexpr char kGpt2Tokenizer[] =
    KVSERVE_SHARED_DIR "/models/tokenizers/gpt2/tokenizer.json";

/// Built once per process; null when the tokenizer cannot be loaded.
inline const LoadedModel* Gpt2VocabModel() {
  static LoadedModel* model = [] {
    auto* m = new LoadedModel;
    absl::StatusOr<std::unique_ptr<Tokenizer>> tok = LoadTokenizer(kGpt2Tokenizer);
    if (!tok.ok()) return static_cast<LoadedModel*>(nullptr);
    m->tokenizer = *std::move(tok);
    SyntheticModelOptions o;
    o.num_layers = 4;
    o.hidden_size = 512;
    o.num_heads = 8;
    o.num_kv_heads = 8;
    o.intermediate_size = 1408;
    o.vocab_size = 50257;
    o.dtype = DType::kBF16;
    m->weights = *MakeSyntheticModel(o);
    return m;
  }();
  return model;
}

}  // namespace kvserve

#endif  // KVSERVE_BENCH_GPT2_VOCAB_MODEL_H_
