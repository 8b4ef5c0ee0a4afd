#include "worker/constraint/token_trie.h"

#include <algorithm>
#include <map>
#include <optional>

#include "common/tokenizer/token_bytes.h"
#include "common/tokenizer/tokenizer.h"

namespace kvserve::constraint {
std::unique_ptr<TokenTrie> TokenTrie::FromTokenizer(const Tokenizer& tokenizer) {
  std::vector<std::pair<TokenId, std::string>> tokens;
  const int32_t vocab = tokenizer.vocab_size();
  tokens.reserve(vocab);
  for (TokenId id = 0; id < vocab; ++id) {
    if (tokenizer.IsSpecial(id) || tokenizer.IdToPiece(id).empty()) continue;
    std::string bytes = TokenBytesMidText(tokenizer, id);
    if (!bytes.empty()) tokens.emplace_back(id, std::move(bytes));
  }
  return FromTokens(vocab, std::move(tokens));
}

std::unique_ptr<TokenTrie> TokenTrie::FromTokens(
    int32_t vocab_size, std::vector<std::pair<TokenId, std::string>> tokens) {
  std::unique_ptr<TokenTrie> trie(new TokenTrie());
  trie->vocab_size_ = vocab_size;
  trie->bytes_.resize(vocab_size);
  std::erase_if(tokens, [&](const auto& t) {
    return t.first < 0 || t.first >= vocab_size || t.second.empty();
  });
  std::sort(tokens.begin(), tokens.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  struct Pending {
    std::map<uint8_t, int32_t> children;
    std::vector<TokenId> tokens;
  };
  std::vector<Pending> pending(1);
  for (const auto& [id, bytes] : tokens) {
    int32_t node = 0;
    for (char c : bytes) {
      const auto b = static_cast<uint8_t>(c);
      auto it = pending[node].children.find(b);
      if (it == pending[node].children.end()) {
        pending.emplace_back();
        it = pending[node].children.emplace(b, static_cast<int32_t>(pending.size() - 1)).first;
      }
      node = it->second;
    }
    pending[node].tokens.push_back(id);
    trie->bytes_[id] = bytes;
  }
  trie->nodes_.resize(pending.size());
  for (size_t i = 0; i < pending.size(); ++i) {
    Node& n = trie->nodes_[i];
    n.first_child = static_cast<int32_t>(trie->children_.size());
    n.num_children = static_cast<int32_t>(pending[i].children.size());
    for (const auto& [b, child] : pending[i].children) trie->children_.push_back({b, child});
    n.first_token = static_cast<int32_t>(trie->tokens_.size());
    n.num_tokens = static_cast<int32_t>(pending[i].tokens.size());
    trie->tokens_.insert(trie->tokens_.end(), pending[i].tokens.begin(), pending[i].tokens.end());
  }
  return trie;
}

}  // namespace kvserve::constraint
