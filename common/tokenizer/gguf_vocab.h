#ifndef KVSERVE_COMMON_TOKENIZER_GGUF_VOCAB_H_
#define KVSERVE_COMMON_TOKENIZER_GGUF_VOCAB_H_

#include <optional>
#include <string>
#include <vector>

#include "common/token.h"

namespace kvserve {

/// A tokenizer as GGUF metadata describes it (the `tokenizer.ggml.*` keys). Filled from a GGUF file
/// by ReadGgufVocab (common/gguf/), turned into a Tokenizer by Tokenizer::FromGgufVocab.
struct GgufVocab {
  /// tokenizer.ggml.model: "llama" (SentencePiece BPE over scores, byte fallback) or "gpt2"
  /// (byte-level BPE over merges).
  std::string model;
  /// tokenizer.ggml.pre: the pre-tokenizer name for "gpt2" models ("default", "gpt-2",
  /// "llama-bpe", "qwen2", "smollm", ...); empty when absent.
  std::string pre;
  std::vector<std::string> tokens;
  /// Same length as tokens when present, else empty.
  std::vector<float> scores;
  /// GGUF token types: 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte.
  std::vector<int32_t> token_types;
  /// "left right" strings, for "gpt2" models.
  std::vector<std::string> merges;
  TokenId bos_id = kNoToken;
  TokenId eos_id = kNoToken;
  TokenId unk_id = kNoToken;
  TokenId pad_id = kNoToken;
  std::optional<bool> add_bos;
  std::optional<bool> add_eos;
  std::optional<bool> add_space_prefix;
};

}  // namespace kvserve

#endif  // KVSERVE_COMMON_TOKENIZER_GGUF_VOCAB_H_
