#ifndef KVSERVE_COMMON_GGUF_GGUF_VOCAB_READER_H_
#define KVSERVE_COMMON_GGUF_GGUF_VOCAB_READER_H_

#include "absl/status/statusor.h"
#include "common/gguf/gguf_file.h"
#include "common/tokenizer/gguf_vocab.h"

namespace kvserve {

/// Fills a GgufVocab from the `tokenizer.ggml.*` metadata of `file`. Special-token ids stored as
/// 0xFFFFFFFF (or -1) mean "none"; other ids outside the vocabulary are errors. Errors name the
/// path and key; a file without `tokenizer.ggml.tokens` is refused.
absl::StatusOr<GgufVocab> ReadGgufVocab(const GgufFile& file);

}  // namespace kvserve

#endif  // KVSERVE_COMMON_GGUF_GGUF_VOCAB_READER_H_
