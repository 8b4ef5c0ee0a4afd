#ifndef KVSERVE_WORKER_CONSTRAINT_GRAMMAR_H_
#define KVSERVE_WORKER_CONSTRAINT_GRAMMAR_H_

#include <bitset>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace kvserve::constraint {

/// A set of byte values: one terminal of a grammar matches one byte in the set.
using ByteSet = std::bitset<256>;

/// One element of a rule's alternative: a terminal (one byte from a set), a reference to a rule,
/// or the end marker that closes every alternative.
struct GrammarElement {
  enum class Kind : uint8_t { kBytes, kRule, kEnd };
  Kind kind = Kind::kEnd;
  /// kBytes: index into Grammar::byte_set(); kRule: the rule's index.
  int32_t index = -1;
};

/// A context-free grammar over bytes, ready for GrammarMatcher. Every constraint (JSON schema,
/// regular expression, GBNF text) compiles into one.
///
/// Layout: the alternatives of every rule are stored back to back in one element array, each
/// ending with a kEnd element, so a parser position is a single int32 index into that array (the
/// element to match next). alternatives(rule) gives the start position of each alternative.
///
/// Guarantees checked by GrammarBuilder::Build: every referenced rule has an alternative, and no
/// rule can reach itself without consuming a byte (no left recursion, direct or through rules
/// that match the empty string), so expanding a position always terminates.
class Grammar {
 public:
  int32_t root() const { return root_; }
  int32_t num_rules() const { return static_cast<int32_t>(rule_names_.size()); }
  const GrammarElement& at(int32_t pos) const { return elements_[pos]; }
  std::span<const int32_t> alternatives(int32_t rule) const {
    return {alt_starts_.data() + rule_alt_begin_[rule],
            alt_starts_.data() + rule_alt_begin_[rule + 1]};
  }
  const ByteSet& byte_set(int32_t index) const { return byte_sets_[index]; }
  const std::string& rule_name(int32_t rule) const { return rule_names_[rule]; }
  /// Number of elements (positions), for size limits and tests.
  size_t size() const { return elements_.size(); }
  /// GBNF-like text of the grammar, for errors and debugging.
  std::string ToString() const;

 private:
  friend class GrammarBuilder;
  int32_t root_ = 0;
  std::vector<GrammarElement> elements_;
  std::vector<int32_t> alt_starts_;
  /// alternatives of rule r: alt_starts_[rule_alt_begin_[r] .. rule_alt_begin_[r + 1]).
  std::vector<int32_t> rule_alt_begin_;
  std::vector<ByteSet> byte_sets_;
  std::vector<std::string> rule_names_;
};

/// One symbol of an alternative while a grammar is being built.
struct Symbol {
  /// -1: a terminal matching one byte of `bytes`; otherwise a rule index.
  int32_t rule = -1;
  ByteSet bytes;

  static Symbol Byte(uint8_t b) {
    Symbol s;
    s.bytes.set(b);
    return s;
  }
  static Symbol Bytes(const ByteSet& set) {
    Symbol s;
    s.bytes = set;
    return s;
  }
  static Symbol Rule(int32_t rule) {
    Symbol s;
    s.rule = rule;
    return s;
  }
};

/// A sequence of symbols (one alternative of a rule).
using Sequence = std::vector<Symbol>;

/// Builds a Grammar rule by rule. The compilers (GBNF, regular expressions, JSON schemas) share
/// its helpers for literals, UTF-8 character classes and repetition, which lower everything to
/// byte terminals and rule references.
class GrammarBuilder {
 public:
  /// Most elements a grammar may have (bounds the memory a request's constraint can take).
  static constexpr size_t kMaxElements = 1 << 20;

  /// Declares a rule and returns its index; its alternatives can be added later (forward and
  /// recursive references).
  int32_t AddRule(std::string name);
  /// The index of a declared rule, or -1.
  int32_t FindRule(std::string_view name) const;
  const std::string& RuleName(int32_t rule) const { return rules_[rule].name; }
  /// Appends one alternative to `rule` (an empty sequence matches the empty string).
  void AddAlternative(int32_t rule, Sequence seq);
  /// True when `rule` has at least one alternative.
  bool IsDefined(int32_t rule) const { return !rules_[rule].alternatives.empty(); }

  /// A new rule with the given alternatives; `hint` names it (made unique).
  int32_t NewRule(std::string_view hint, std::vector<Sequence> alternatives);
  /// Rules for repetition of `seq`: min..max times (max < 0: unbounded). Returns a rule index.
  /// Counted repetition is unrolled, so max is limited to kMaxRepeat.
  absl::StatusOr<int32_t> Repeat(std::string_view hint, const Sequence& seq, int64_t min,
                                 int64_t max);
  static constexpr int64_t kMaxRepeat = 10000;

  /// One UTF-8 encoded character whose code point lies in one of `ranges` (inclusive pairs,
  /// surrogates never match), as a rule. With `negate`, any character outside the ranges.
  int32_t CharClass(std::string_view hint, std::vector<std::pair<uint32_t, uint32_t>> ranges,
                    bool negate);

  /// The bytes of `text`, one terminal each.
  static Sequence Literal(std::string_view text);

  /// Checks the grammar (undefined rules, left recursion, size) and freezes it.
  absl::StatusOr<Grammar> Build(int32_t root) const;

 private:
  struct Rule {
    std::string name;
    std::vector<Sequence> alternatives;
  };
  std::string UniqueName(std::string_view hint);

  std::vector<Rule> rules_;
  int32_t next_anonymous_ = 0;
};

/// Code point ranges (inclusive pairs, any order, may overlap): their complement within
/// [0, 0x10FFFF], sorted.
std::vector<std::pair<uint32_t, uint32_t>> ComplementRanges(
    std::vector<std::pair<uint32_t, uint32_t>> ranges);

}  // namespace kvserve::constraint

#endif  // KVSERVE_WORKER_CONSTRAINT_GRAMMAR_H_
