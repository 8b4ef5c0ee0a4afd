#ifndef KVSERVE_COMMON_TOKENIZER_REGEX_H_
#define KVSERVE_COMMON_TOKENIZER_REGEX_H_

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace kvserve {

/// A compiled PCRE2 pattern over UTF-8 text with Unicode properties (\p{L}, \s are Unicode
/// aware), JIT-compiled when available. Immutable after Compile, so FindAll may run on several
/// threads at once (each call owns its match data).
class Regex {
 public:
  /// Compiles `pattern`; with `literal` the pattern is matched as plain text.
  static absl::StatusOr<std::unique_ptr<Regex>> Compile(std::string_view pattern, bool literal);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  /// Non-overlapping leftmost matches in `text` (valid UTF-8) as [begin, end) byte ranges.
  /// Empty matches are skipped.
  std::vector<std::pair<size_t, size_t>> FindAll(std::string_view text) const;

 private:
  explicit Regex(void* code) : code_(code) {}
  void* code_;  // pcre2_code_8*
};

}  // namespace kvserve

#endif  // KVSERVE_COMMON_TOKENIZER_REGEX_H_
