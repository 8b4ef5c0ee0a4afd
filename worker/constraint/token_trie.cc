#include "worker/constraint/token_trie.h"

#include <algorithm>
#include <map>
#include <optional>

#include "common/tokenizer/byte_level.h"
#include "common/tokenizer/tokenizer.h"
#include "common/tokenizer/utf8.h"

namespace kvserve::constraint {
namespace {

// "<0xAB>" -> 0xAB.
std::optional<uint8_t> ByteFallbackValue(std::string_view piece) {
  if (piece.size() != 6 || !piece.starts_with("<0x") || piece[5] != '>') return std::nullopt;
  int value = 0;
  for (char c : piece.substr(3, 2)) {
    value <<= 4;
    if (c >= '0' && c <= '9') {
      value |= c - '0';
    } else if (c >= 'A' && c <= 'F') {
      value |= c - 'A' + 10;
    } else if (c >= 'a' && c <= 'f') {
      value |= c - 'a' + 10;
    } else {
      return std::nullopt;
    }
  }
  return static_cast<uint8_t>(value);
}

}  // namespace

std::string TokenBytesMidText(const Tokenizer& tokenizer, TokenId id) {
  const std::string_view piece = tokenizer.IdToPiece(id);
  if (std::optional<uint8_t> b = ByteFallbackValue(piece); b.has_value()) {
    return std::string(1, static_cast<char>(*b));
  }
  // Decoding a token twice shows what it adds after other text: decoders only treat the first
  // token of a text differently (SentencePiece drops its leading space).
  const TokenId twice[] = {id, id};
  absl::StatusOr<std::string> one = tokenizer.Decode(std::span<const TokenId>(twice, 1));
  absl::StatusOr<std::string> two = tokenizer.Decode(twice);
  if (!one.ok() || !two.ok()) return {};
  std::string text = two->starts_with(*one) ? two->substr(one->size()) : *one;
  if (text.find(utf8::kReplacement) != std::string::npos &&
      piece.find(utf8::kReplacement) == std::string_view::npos) {
    // Part of a UTF-8 character: only its raw bytes mean anything (byte-level vocabularies).
    std::string raw;
    if (!ByteLevelToBytes(piece, &raw)) return {};
    return raw;
  }
  return text;
}

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
