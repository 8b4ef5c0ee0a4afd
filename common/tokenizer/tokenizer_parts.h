#ifndef KVSERVE_COMMON_TOKENIZER_TOKENIZER_PARTS_H_
#define KVSERVE_COMMON_TOKENIZER_TOKENIZER_PARTS_H_

// The pieces a Tokenizer is assembled from. Internal to common/tokenizer: the loaders
// (tokenizer_json.cc, gguf_tokenizer.cc) fill it, Tokenizer runs it.

#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "common/token.h"
#include "common/tokenizer/added_tokens.h"
#include "common/tokenizer/bpe_model.h"
#include "common/tokenizer/decoder.h"
#include "common/tokenizer/normalizer.h"
#include "common/tokenizer/pre_tokenizer.h"

namespace kvserve {

struct TokenizerParts {
  /// Piece text by id (model vocabulary and added tokens); `has_piece[id]` is false for holes.
  std::vector<std::string> pieces;
  std::vector<bool> has_piece;
  std::vector<bool> special;
  absl::flat_hash_map<std::string, TokenId> piece_ids;

  /// Added tokens matched in the raw input / in normalized text.
  AddedTokenMatcher raw_tokens;
  AddedTokenMatcher normalized_tokens;

  std::unique_ptr<Normalizer> normalizer;       // may be null
  std::unique_ptr<PreTokenizer> pre_tokenizer;  // may be null: the section is one word
  std::unique_ptr<TokenModel> model;
  /// The post-processor for one sequence: ids put before and after it.
  std::vector<TokenId> prefix_ids;
  std::vector<TokenId> suffix_ids;
  std::unique_ptr<Decoder> decoder;  // may be null: pieces are joined with spaces

  TokenId bos_id = kNoToken;
  TokenId eos_id = kNoToken;
  std::string chat_template;

  /// Records piece `text` for `id`, growing the tables as needed; a later call for the same id
  /// or text wins.
  void SetPiece(TokenId id, std::string text, bool is_special) {
    const auto index = static_cast<size_t>(id);
    if (index >= pieces.size()) {
      pieces.resize(index + 1);
      has_piece.resize(index + 1, false);
      special.resize(index + 1, false);
    }
    piece_ids[text] = id;
    pieces[index] = std::move(text);
    has_piece[index] = true;
    special[index] = is_special;
  }
};

}  // namespace kvserve

#endif  // KVSERVE_COMMON_TOKENIZER_TOKENIZER_PARTS_H_
