#ifndef KVSERVE_COMMON_TOKENIZER_GGUF_TOKENIZER_H_
#define KVSERVE_COMMON_TOKENIZER_GGUF_TOKENIZER_H_

#include <memory>

#include "absl/status/statusor.h"
#include "common/tokenizer/gguf_vocab.h"
#include "common/tokenizer/tokenizer_parts.h"

namespace kvserve {

/// Builds the tokenizer pipeline a GGUF vocabulary describes:
/// - "llama": SentencePiece BPE over piece scores; "▁" dummy prefix per text section when
///   add_space_prefix (default true), spaces as "▁", <0xXX> byte fallback; adds BOS unless
///   add_bos is false.
/// - "gpt2": byte-level BPE over `merges`, split pattern chosen by `pre` ("default"/"gpt-2",
///   "llama-bpe", "qwen2", "smollm"); adds BOS/EOS only when add_bos/add_eos say so.
/// Control (3), unknown (2) and user-defined (4) tokens are matched literally in input text;
/// control and unknown ones are special. Inconsistent metadata is an INVALID_ARGUMENT error
/// naming the tokenizer.ggml.* key.
absl::StatusOr<std::unique_ptr<TokenizerParts>> BuildGgufTokenizer(const GgufVocab& vocab);

}  // namespace kvserve

#endif  // KVSERVE_COMMON_TOKENIZER_GGUF_TOKENIZER_H_
