#include "common/tokenizer/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "absl/strings/str_cat.h"
#include "common/tokenizer/utf8.h"

namespace kvserve {
namespace {

pcre2_code* Code(void* p) { return static_cast<pcre2_code*>(p); }

}  // namespace

absl::StatusOr<std::unique_ptr<Regex>> Regex::Compile(std::string_view pattern, bool literal) {
  // PCRE2_UCP is not allowed with PCRE2_LITERAL (and means nothing there).
  const uint32_t options = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP);
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   options, &error_code, &error_offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR buffer[256];
    pcre2_get_error_message(error_code, buffer, sizeof(buffer));
    return absl::InvalidArgumentError(absl::StrCat("invalid regex '", std::string(pattern),
                                                   "' at offset ", error_offset, ": ",
                                                   reinterpret_cast<const char*>(buffer)));
  }
  // JIT is an optimisation only; the interpreter is used when it is unavailable.
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  return std::unique_ptr<Regex>(new Regex(code));
}

Regex::~Regex() { pcre2_code_free(Code(code_)); }

std::vector<std::pair<size_t, size_t>> Regex::FindAll(std::string_view text) const {
  std::vector<std::pair<size_t, size_t>> matches;
  pcre2_match_data* data = pcre2_match_data_create_from_pattern(Code(code_), nullptr);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t start = 0;
  while (start <= text.size()) {
    const int rc =
        pcre2_match(Code(code_), subject, text.size(), start, PCRE2_NO_UTF_CHECK, data, nullptr);
    if (rc < 0) break;  // PCRE2_ERROR_NOMATCH, or a resource limit: stop splitting here.
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(data);
    const size_t begin = ovector[0];
    const size_t end = ovector[1];
    if (end > begin) {
      matches.emplace_back(begin, end);
      start = end;
    } else {
      // Empty match: step over one character.
      if (begin >= text.size()) break;
      const size_t len = utf8::SequenceLength(text, begin);
      start = begin + (len == 0 ? 1 : len);
    }
  }
  pcre2_match_data_free(data);
  return matches;
}

}  // namespace kvserve
