#ifndef KVSERVE_WORKER_CONSTRAINT_TOKEN_TRIE_H_
#define KVSERVE_WORKER_CONSTRAINT_TOKEN_TRIE_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "common/token.h"

namespace kvserve {
class Tokenizer;
}

namespace kvserve::constraint {

/// The vocabulary as a byte trie: every token that can appear in constrained text, keyed by the
/// bytes it adds to the text when it follows other text. Token masks are computed by walking it
/// once per parser state, so tokens sharing a prefix share the parser's work. Immutable; one per
/// tokenizer, shared by every request.
class TokenTrie {
 public:
  /// A node's children are children()[first_child, first_child + num_children), byte ascending;
  /// the tokens whose bytes end here are tokens()[first_token, first_token + num_tokens).
  struct Node {
    int32_t first_child = 0;
    int32_t num_children = 0;
    int32_t first_token = 0;
    int32_t num_tokens = 0;
  };
  struct Child {
    uint8_t byte;
    int32_t node;
  };

  /// The tokens of `tokenizer` except special tokens and tokens that add no bytes. A token's
  /// bytes are what decoding it after another token adds (so SentencePiece's "▁the" is " the"),
  /// and the raw byte for byte-fallback (<0xE2>) and byte-level pieces that are part of a UTF-8
  /// character.
  static std::unique_ptr<TokenTrie> FromTokenizer(const Tokenizer& tokenizer);
  /// From explicit (id, bytes) pairs (ids < vocab_size; empty bytes are left out), for tests.
  static std::unique_ptr<TokenTrie> FromTokens(int32_t vocab_size,
                                               std::vector<std::pair<TokenId, std::string>> tokens);

  int32_t vocab_size() const { return vocab_size_; }
  /// The bytes of token `id` (empty for a token left out of the trie).
  const std::string& bytes(TokenId id) const { return bytes_[id]; }
  /// The node for the empty prefix.
  const Node& root() const { return nodes_[0]; }
  const Node& node(int32_t index) const { return nodes_[index]; }
  std::span<const Child> children(const Node& n) const {
    return {children_.data() + n.first_child, static_cast<size_t>(n.num_children)};
  }
  std::span<const TokenId> tokens(const Node& n) const {
    return {tokens_.data() + n.first_token, static_cast<size_t>(n.num_tokens)};
  }
  size_t num_nodes() const { return nodes_.size(); }

 private:
  TokenTrie() = default;

  int32_t vocab_size_ = 0;
  std::vector<std::string> bytes_;
  std::vector<Node> nodes_;
  std::vector<Child> children_;
  std::vector<TokenId> tokens_;
};

}  // namespace kvserve::constraint

#endif  // KVSERVE_WORKER_CONSTRAINT_TOKEN_TRIE_H_
