#ifndef KVSERVE_WORKER_CONSTRAINT_MATCHER_H_
#define KVSERVE_WORKER_CONSTRAINT_MATCHER_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "worker/constraint/grammar.h"
#include "worker/constraint/token_trie.h"

namespace kvserve::constraint {

/// One bit per token id: bit (id % 64) of word (id / 64) is set when the token is allowed.
using TokenBitmask = std::vector<uint64_t>;

inline bool MaskAllows(const TokenBitmask& mask, int32_t id) {
  return (mask[static_cast<size_t>(id) >> 6] >> (id & 63)) & 1;
}

/// Tracks how far a text has come through a Grammar, byte by byte, and which tokens may come
/// next.
///
/// The parser is a pushdown automaton that follows every alternative at once. A *stack* is the
/// chain of positions still to finish: its top is a terminal waiting for a byte, below it the
/// positions to return to when each enclosing rule ends. Stacks are interned as nodes
/// (position, parent node), so the many stacks alternatives create share their common bottoms
/// and comparing two stacks is comparing two integers. The *state* is the set of live stacks plus
/// whether the text so far is a complete match. A byte keeps the stacks whose top terminal
/// accepts it, steps each past that terminal and expands rule references (and finished rules)
/// until every top is a terminal again. A reference that is the last element of its alternative
/// pushes no return position (a tail call), so repetition written as right recursion runs in
/// constant stack depth. Termination is guaranteed by the builder's left-recursion check.
///
/// An ambiguous grammar can make the number of live stacks grow exponentially with the text
/// (`r ::= "a" r "b" | "a" r "c" | ""` doubles them per "a"): past kMaxLeaves stacks in one
/// state or kMaxNodes interned nodes the matcher stops, overflowed() turns true, and it accepts
/// nothing more.
///
/// Not thread-safe: one per sequence.
class GrammarMatcher {
 public:
  static constexpr size_t kMaxLeaves = 16384;
  static constexpr size_t kMaxNodes = size_t{1} << 21;

  explicit GrammarMatcher(std::shared_ptr<const Grammar> grammar);

  /// Consumes `bytes`; returns false and leaves the state unchanged when they do not continue a
  /// valid prefix.
  bool Advance(std::string_view bytes);
  /// The text so far is a complete match (EOS may come now).
  bool CanEnd() const { return state_.accepting; }
  /// Some byte may follow.
  bool CanContinue() const { return !state_.leaves.empty(); }
  /// The current state, independent of this matcher's node numbering: equal keys mean equal
  /// states, in any matcher of the same grammar (the mask cache's key).
  std::string StateKey() const;
  /// Sets, in `mask` (trie.vocab_size() bits, cleared first), every token of `trie` whose bytes
  /// continue a valid prefix. End-of-sequence tokens are the caller's (see CanEnd).
  void FillTokenMask(const TokenTrie& trie, TokenBitmask* mask);
  /// Number of interned stack nodes (memory use, for tests and limits).
  size_t num_nodes() const { return nodes_.size(); }
  /// The grammar was too ambiguous to follow (see the class comment); the matcher is stuck.
  bool overflowed() const { return overflowed_; }

 private:
  struct Node {
    int32_t pos;
    int32_t parent;  // -1: the root rule's level
  };
  struct State {
    std::vector<int32_t> leaves;  // nodes whose position is a terminal; sorted, unique
    bool accepting = false;
  };

  int32_t Intern(int32_t pos, int32_t parent);
  /// Adds to `out` every leaf (and acceptance) reachable from `node` without consuming a byte.
  void Expand(int32_t node, State* out);
  /// The state after `byte` from `from` (which `out` must not alias).
  void Step(const State& from, uint8_t byte, State* out);
  /// The bytes any leaf of `s` accepts.
  ByteSet FirstBytes(const State& s) const;
  void FillFrom(const State& s, const TokenTrie& trie, const TokenTrie::Node& node, int depth,
                TokenBitmask* mask);

  std::shared_ptr<const Grammar> grammar_;
  std::vector<Node> nodes_;
  absl::flat_hash_map<uint64_t, int32_t> node_index_;
  State state_;
  bool overflowed_ = false;
  /// Expand's bookkeeping: a node was visited in the current expansion when its stamp equals
  /// stamp_ (no clearing between expansions).
  std::vector<uint32_t> seen_;
  uint32_t stamp_ = 0;
  /// The same for leaves already in the state being built (one stamp per state).
  std::vector<uint32_t> in_state_;
  uint32_t state_stamp_ = 0;
  std::vector<int32_t> work_;
  /// One scratch state per trie depth for FillTokenMask (a deque: growing it keeps the states
  /// of shallower depths in place).
  std::deque<State> scratch_;
};

}  // namespace kvserve::constraint

#endif  // KVSERVE_WORKER_CONSTRAINT_MATCHER_H_
