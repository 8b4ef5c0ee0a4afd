#ifndef KVSERVE_COMMON_TOKENIZER_ADDED_TOKENS_H_
#define KVSERVE_COMMON_TOKENIZER_ADDED_TOKENS_H_

#include <array>
#include <string>
#include <string_view>
#include <vector>

#include "common/token.h"

namespace kvserve {

/// A token matched literally in input text before the model runs (tokenizer.json
/// "added_tokens"; GGUF control and user-defined tokens).
struct AddedToken {
  TokenId id = kNoToken;
  std::string content;
  /// Special tokens are dropped by Decode with skip_special_tokens.
  bool special = false;
  /// The match also swallows whitespace on its left / right.
  bool lstrip = false;
  bool rstrip = false;
  /// Matches only when not inside a word.
  bool single_word = false;
  /// Matched in normalized text rather than in the raw input.
  bool normalized = false;
};

/// A piece of input text: an added token (id != kNoToken) or plain text to tokenize.
struct TextSection {
  std::string_view text;
  TokenId id = kNoToken;
};

/// Finds added tokens in text: leftmost match first, longest content at that position.
class AddedTokenMatcher {
 public:
  AddedTokenMatcher() = default;
  /// Tokens with empty content are ignored.
  explicit AddedTokenMatcher(const std::vector<AddedToken>& tokens);

  /// True when there is nothing to match.
  bool empty() const { return tokens_.empty(); }

  /// Cuts `text` into sections in order; text sections are never empty.
  std::vector<TextSection> Split(std::string_view text) const;

 private:
  std::vector<AddedToken> tokens_;
  // Indices into tokens_ by first byte of content, longest content first.
  std::array<std::vector<int>, 256> by_first_byte_;
};

}  // namespace kvserve

#endif  // KVSERVE_COMMON_TOKENIZER_ADDED_TOKENS_H_
