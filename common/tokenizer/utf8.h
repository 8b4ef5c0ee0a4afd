#ifndef KVSERVE_COMMON_TOKENIZER_UTF8_H_
#define KVSERVE_COMMON_TOKENIZER_UTF8_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace kvserve::utf8 {

/// Length in bytes of the well-formed UTF-8 sequence starting at `s[pos]`, or 0 when the bytes
/// there are not a complete, well-formed sequence (RFC 3629: no overlongs, no surrogates).
size_t SequenceLength(std::string_view s, size_t pos);

/// Byte offset of the first ill-formed byte in `s`, or `s.size()` when all of `s` is valid UTF-8.
size_t FindInvalid(std::string_view s);

/// True when `s` is well-formed UTF-8.
inline bool IsValid(std::string_view s) { return FindInvalid(s) == s.size(); }

/// Returns `bytes` with every maximal ill-formed subpart replaced by U+FFFD (the WHATWG /
/// Unicode "substitution of maximal subparts" rule that TextDecoder and from_utf8_lossy follow).
std::string ToValidLossy(std::string_view bytes);

/// Decodes the well-formed sequence at `s[pos]` (length `len` from SequenceLength).
char32_t Decode(std::string_view s, size_t pos, size_t len);

/// Appends the UTF-8 encoding of `cp` to `out`.
void Append(char32_t cp, std::string* out);

/// The UTF-8 encoding of U+FFFD.
inline constexpr std::string_view kReplacement = "\xEF\xBF\xBD";

}  // namespace kvserve::utf8

#endif  // KVSERVE_COMMON_TOKENIZER_UTF8_H_
