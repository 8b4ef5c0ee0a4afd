#include "worker/constraint/matcher.h"

#include <algorithm>

namespace kvserve::constraint {

GrammarMatcher::GrammarMatcher(std::shared_ptr<const Grammar> grammar)
    : grammar_(std::move(grammar)) {
  ++state_stamp_;
  for (int32_t start : grammar_->alternatives(grammar_->root())) {
    Expand(Intern(start, -1), &state_);
  }
  std::sort(state_.leaves.begin(), state_.leaves.end());
}

int32_t GrammarMatcher::Intern(int32_t pos, int32_t parent) {
  const uint64_t key =
      (static_cast<uint64_t>(static_cast<uint32_t>(pos)) << 32) | static_cast<uint32_t>(parent + 1);
  auto [it, inserted] = node_index_.try_emplace(key, static_cast<int32_t>(nodes_.size()));
  if (inserted) {
    if (nodes_.size() >= kMaxNodes) overflowed_ = true;
    nodes_.push_back({pos, parent});
    seen_.push_back(0);
    in_state_.push_back(0);
  }
  return it->second;
}

void GrammarMatcher::Expand(int32_t node, State* out) {
  const Grammar& g = *grammar_;
  ++stamp_;
  work_.clear();
  work_.push_back(node);
  while (!work_.empty()) {
    const int32_t n = work_.back();
    work_.pop_back();
    if (seen_[n] == stamp_) continue;
    seen_[n] = stamp_;
    const Node current = nodes_[n];
    const GrammarElement& e = g.at(current.pos);
    switch (e.kind) {
      case GrammarElement::Kind::kBytes:
        if (in_state_[n] == state_stamp_) break;  // reached from another stack already
        if (out->leaves.size() >= kMaxLeaves) {
          overflowed_ = true;
          return;
        }
        in_state_[n] = state_stamp_;
        out->leaves.push_back(n);
        break;
      case GrammarElement::Kind::kEnd:
        // The rule is finished: continue where its caller left off.
        if (current.parent < 0) {
          out->accepting = true;
        } else {
          work_.push_back(current.parent);
        }
        break;
      case GrammarElement::Kind::kRule: {
        const bool tail = g.at(current.pos + 1).kind == GrammarElement::Kind::kEnd;
        const int32_t ret = tail ? current.parent : Intern(current.pos + 1, current.parent);
        for (int32_t start : g.alternatives(e.index)) work_.push_back(Intern(start, ret));
        break;
      }
    }
  }
}

void GrammarMatcher::Step(const State& from, uint8_t byte, State* out) {
  out->leaves.clear();
  out->accepting = false;
  ++state_stamp_;
  const Grammar& g = *grammar_;
  for (int32_t leaf : from.leaves) {
    const Node n = nodes_[leaf];
    if (!g.byte_set(g.at(n.pos).index).test(byte)) continue;
    Expand(Intern(n.pos + 1, n.parent), out);
  }
  std::sort(out->leaves.begin(), out->leaves.end());
}

bool GrammarMatcher::Advance(std::string_view bytes) {
  if (overflowed_) return false;
  State next;
  State current = state_;
  for (char c : bytes) {
    Step(current, static_cast<uint8_t>(c), &next);
    if (overflowed_ || (next.leaves.empty() && !next.accepting)) return false;
    std::swap(current, next);
  }
  state_ = std::move(current);
  return true;
}

std::string GrammarMatcher::StateKey() const {
  std::vector<std::vector<int32_t>> stacks;
  stacks.reserve(state_.leaves.size());
  for (int32_t leaf : state_.leaves) {
    std::vector<int32_t> stack;
    for (int32_t n = leaf; n >= 0; n = nodes_[n].parent) stack.push_back(nodes_[n].pos);
    stacks.push_back(std::move(stack));
  }
  std::sort(stacks.begin(), stacks.end());
  std::string key;
  key.push_back(state_.accepting ? 'A' : 'a');
  for (const std::vector<int32_t>& stack : stacks) {
    for (int32_t pos : stack) key.append(reinterpret_cast<const char*>(&pos), sizeof(pos));
    const int32_t separator = -1;
    key.append(reinterpret_cast<const char*>(&separator), sizeof(separator));
  }
  return key;
}

ByteSet GrammarMatcher::FirstBytes(const State& s) const {
  const Grammar& g = *grammar_;
  ByteSet first;
  for (int32_t leaf : s.leaves) first |= g.byte_set(g.at(nodes_[leaf].pos).index);
  return first;
}

void GrammarMatcher::FillFrom(const State& s, const TokenTrie& trie, const TokenTrie::Node& node,
                              int depth, TokenBitmask* mask) {
  const ByteSet first = FirstBytes(s);
  if (scratch_.size() <= static_cast<size_t>(depth)) scratch_.resize(depth + 1);
  for (const TokenTrie::Child& child : trie.children(node)) {
    if (!first.test(child.byte)) continue;
    State& next = scratch_[depth];
    Step(s, child.byte, &next);
    if (overflowed_) return;
    const TokenTrie::Node& child_node = trie.node(child.node);
    for (TokenId id : trie.tokens(child_node)) {
      (*mask)[static_cast<size_t>(id) >> 6] |= uint64_t{1} << (id & 63);
    }
    if (child_node.num_children > 0 && !next.leaves.empty()) {
      FillFrom(next, trie, child_node, depth + 1, mask);
    }
  }
}

void GrammarMatcher::FillTokenMask(const TokenTrie& trie, TokenBitmask* mask) {
  mask->assign((static_cast<size_t>(trie.vocab_size()) + 63) / 64, 0);
  if (overflowed_) return;
  FillFrom(state_, trie, trie.root(), 0, mask);
  // A walk that overflowed may have missed tokens: allow none rather than some.
  if (overflowed_) std::fill(mask->begin(), mask->end(), 0);
}

}  // namespace kvserve::constraint
