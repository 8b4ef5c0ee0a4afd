#ifndef KVSERVE_COMMON_TOKENIZER_TOKENIZER_JSON_H_
#define KVSERVE_COMMON_TOKENIZER_TOKENIZER_JSON_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/tokenizer/tokenizer_parts.h"

namespace kvserve {

/// Loads a Hugging Face tokenizer.json (and tokenizer_config.json from the same directory when
/// present). Errors name the file and the field: NOT_FOUND for a missing file, INVALID_ARGUMENT
/// for bad JSON or an unsupported component type.
absl::StatusOr<std::unique_ptr<TokenizerParts>> LoadTokenizerJson(const std::string& path);

}  // namespace kvserve

#endif  // KVSERVE_COMMON_TOKENIZER_TOKENIZER_JSON_H_
