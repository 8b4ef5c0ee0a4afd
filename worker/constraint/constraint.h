#ifndef KVSERVE_WORKER_CONSTRAINT_CONSTRAINT_H_
#define KVSERVE_WORKER_CONSTRAINT_CONSTRAINT_H_

#include <cstdint>
#include <list>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/token.h"
#include "worker/constraint/grammar.h"
#include "worker/constraint/matcher.h"
#include "worker/constraint/token_trie.h"

namespace kvserve::constraint {

/// What a request's output must match.
struct ConstraintSpec {
  enum class Kind : uint8_t {
    kNone,
    /// `text` is a JSON schema (JsonSchemaGrammar).
    kJsonSchema,
    /// Any JSON object; `text` is unused.
    kJsonObject,
    /// `text` is a regular expression the whole output matches (AddRegexRule).
    kRegex,
    /// `text` is a GBNF grammar (GbnfGrammar).
    kGrammar,
    /// `text` is a tool-call spec as JSON (ToolCallGrammar): the output is tool calls only.
    kToolCalls,
  };
  Kind kind = Kind::kNone;
  std::string text;

  bool active() const { return kind != Kind::kNone; }
  /// "json_schema", "json_object", "regex", "grammar", "tool_calls" or "none".
  std::string_view KindName() const;
};

/// A constraint compiled to a grammar, with the token masks of the parser states met so far.
/// Shared (immutable but for the mask cache, which locks) by every request with the same spec.
class CompiledConstraint {
 public:
  /// Most masks kept per constraint; past it the cache starts over.
  static constexpr size_t kMaxCachedMasks = 4096;

  explicit CompiledConstraint(std::shared_ptr<const Grammar> grammar)
      : grammar_(std::move(grammar)) {}

  const std::shared_ptr<const Grammar>& grammar() const { return grammar_; }
  /// The tokens of `trie` that may follow `matcher`'s state (EOS not included), from the cache
  /// or computed and cached.
  std::shared_ptr<const TokenBitmask> Mask(GrammarMatcher& matcher, const TokenTrie& trie) const;
  /// Cache counters, for tests and the step-cost benchmark.
  uint64_t mask_hits() const;
  uint64_t mask_misses() const;

 private:
  std::shared_ptr<const Grammar> grammar_;
  mutable absl::Mutex mu_;
  mutable absl::flat_hash_map<std::string, std::shared_ptr<const TokenBitmask>> masks_
      ABSL_GUARDED_BY(mu_);
  mutable uint64_t hits_ ABSL_GUARDED_BY(mu_) = 0;
  mutable uint64_t misses_ ABSL_GUARDED_BY(mu_) = 0;
};

/// Compiles constraint specs, keeping the most recently used ones so that a schema many requests
/// share compiles once and its masks are shared. Thread-safe.
class ConstraintCompiler {
 public:
  explicit ConstraintCompiler(size_t capacity = 64) : capacity_(capacity) {}

  /// INVALID_ARGUMENT naming the problem (a bad schema, an unsupported keyword, a regex or grammar
  /// syntax error); null for a spec of kind kNone.
  absl::StatusOr<std::shared_ptr<const CompiledConstraint>> Compile(const ConstraintSpec& spec);

 private:
  using Entry = std::pair<std::string, std::shared_ptr<const CompiledConstraint>>;
  size_t capacity_;
  absl::Mutex mu_;
  std::list<Entry> lru_ ABSL_GUARDED_BY(mu_);  // most recent first
  absl::flat_hash_map<std::string, std::list<Entry>::iterator> index_ ABSL_GUARDED_BY(mu_);
};

/// One sequence's progress through its constraint: which tokens may come next, and the parser
/// state after each token it takes. Not thread-safe; one per sequence.
class ConstraintState {
 public:
  /// `eos_ids` are allowed exactly where the output may end.
  ConstraintState(std::shared_ptr<const CompiledConstraint> constraint,
                  std::shared_ptr<const TokenTrie> trie, std::span<const TokenId> eos_ids);

  /// The tokens that may come next. Empty (no bit set) only when the vocabulary has no token
  /// that continues the output and it cannot end here.
  const TokenBitmask& Allowed();
  /// Takes `token`; INVALID_ARGUMENT when it cannot follow (it was outside Allowed()).
  absl::Status Accept(TokenId token);
  /// The output is complete and nothing may follow it.
  bool Complete() const { return matcher_.CanEnd() && !matcher_.CanContinue(); }
  /// The output so far is a complete match.
  bool CanEnd() const { return matcher_.CanEnd(); }
  /// Why Allowed() came back empty: the grammar was too ambiguous to follow (an error for the
  /// request), or no token of the vocabulary continues the text.
  std::string EmptyMaskReason() const;

 private:
  std::shared_ptr<const CompiledConstraint> constraint_;
  std::shared_ptr<const TokenTrie> trie_;
  std::vector<TokenId> eos_ids_;
  GrammarMatcher matcher_;
  TokenBitmask allowed_;
};

}  // namespace kvserve::constraint

#endif  // KVSERVE_WORKER_CONSTRAINT_CONSTRAINT_H_
