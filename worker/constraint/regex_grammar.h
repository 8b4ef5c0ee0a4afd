#ifndef KVSERVE_WORKER_CONSTRAINT_REGEX_GRAMMAR_H_
#define KVSERVE_WORKER_CONSTRAINT_REGEX_GRAMMAR_H_

#include <cstdint>
#include <string_view>

#include "absl/status/statusor.h"
#include "worker/constraint/grammar.h"

namespace kvserve::constraint {

/// Options of AddRegexRule.
struct RegexOptions {
  /// The text is the inside of a JSON string: a quote, a backslash or a control character the
  /// pattern matches is written as its JSON escape (\" \\ \n \t \r; other control characters
  /// are left out), so the output stays a valid JSON string whose value matches the pattern.
  bool json_string = false;
};

/// Adds a rule matching exactly the strings of the regular expression `pattern` (the whole text:
/// `^` at the start and `$` at the end are accepted and change nothing), and returns it.
///
/// Supported: literals and escapes (\n \t \r \f \v \0 \xHH \uHHHH \u{H..} and escaped
/// punctuation), `.` (any character but a newline), classes `[...]` with ranges and negation,
/// \d \w \s and their negations, groups `( )`, `(?: )`, `(?<name> )`, `(?P<name> )`,
/// alternation `|`, and the quantifiers * + ? {n} {n,} {n,m} (lazy forms too, which match the
/// same strings). Backreferences, lookaround, word boundaries and anchors elsewhere are refused
/// with INVALID_ARGUMENT naming the construct and its offset. Matching is on Unicode characters
/// encoded as UTF-8.
absl::StatusOr<int32_t> AddRegexRule(GrammarBuilder* builder, std::string_view pattern,
                                     const RegexOptions& options = {});

/// A grammar whose root is the regular expression `pattern` (AddRegexRule).
absl::StatusOr<Grammar> RegexGrammar(std::string_view pattern);

}  // namespace kvserve::constraint

#endif  // KVSERVE_WORKER_CONSTRAINT_REGEX_GRAMMAR_H_
