#ifndef KVSERVE_COMMON_TOKENIZER_LOADER_TOKENIZER_LOADER_H_
#define KVSERVE_COMMON_TOKENIZER_LOADER_TOKENIZER_LOADER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/tokenizer/tokenizer.h"

namespace kvserve {

/// Loads a tokenizer from `path`: a tokenizer.json file, a directory holding one (a Hugging Face
/// model directory), or a GGUF file (its tokenizer.ggml.* metadata). Errors name the path.
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer(const std::string& path);

}  // namespace kvserve

#endif  // KVSERVE_COMMON_TOKENIZER_LOADER_TOKENIZER_LOADER_H_
