#ifndef KVSERVE_WORKER_CONSTRAINT_GBNF_H_
#define KVSERVE_WORKER_CONSTRAINT_GBNF_H_

#include <string_view>

#include "absl/status/statusor.h"
#include "worker/constraint/grammar.h"

namespace kvserve::constraint {

/// Parses a grammar in GBNF, the EBNF dialect of llama.cpp (also read by xgrammar), rooted at
/// the rule named `root`:
///
///     root   ::= answer ("," ws answer)*
///     answer ::= "yes" | "no" | [0-9]+   # comments run to the end of the line
///     ws     ::= [ \t\n]*
///
/// Rules are `name ::= alternatives`; a rule ends where the next `name ::=` begins. Elements:
/// "literals" and [character classes] (with ranges, ^ negation and the escapes \n \t \r \\ \"
/// \] \xHH \uHHHH \UHHHHHHHH), `.` (any character), rule names, ( groups ), and the postfix
/// operators * + ? {m} {m,} {m,n}. Characters are Unicode code points matched as UTF-8.
/// Errors (undefined or left-recursive rules, bad syntax) are INVALID_ARGUMENT with the line.
absl::StatusOr<Grammar> GbnfGrammar(std::string_view text);

}  // namespace kvserve::constraint

#endif  // KVSERVE_WORKER_CONSTRAINT_GBNF_H_
