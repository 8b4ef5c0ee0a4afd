#ifndef KVSERVE_COMMON_TOKENIZER_BPE_MODEL_H_
#define KVSERVE_COMMON_TOKENIZER_BPE_MODEL_H_

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "common/token.h"

namespace kvserve {

/// One symbol of a word during BPE: the token it currently is (kNoToken when its text is not in
/// the vocabulary) and the byte range [begin, end) of the word it covers. Symbols form a doubly
/// linked list through prev/next (-1 at the ends); merged-away symbols have alive == false.
struct BpeSymbol {
  TokenId id;
  uint32_t begin;
  uint32_t end;
  int32_t prev;
  int32_t next;
  bool alive;
};

/// A possible merge of two adjacent symbols: lower priority merges first (ties: leftmost first).
struct BpeMerge {
  double priority;
  TokenId merged_id;
};

/// Decides whether two adjacent symbols merge and how urgently: the one pluggable part of the
/// merge engine (merge ranks for tokenizer.json BPE, piece scores for SentencePiece).
class PairPriority {
 public:
  virtual ~PairPriority() = default;
  /// Fills `merge` and returns true when `left` followed by `right` can merge.
  virtual bool Find(std::string_view word, const BpeSymbol& left, const BpeSymbol& right,
                    BpeMerge* merge) const = 0;
};

/// The merge engine: repeatedly merges the adjacent pair with the lowest priority (leftmost on
/// ties) until no pair can merge. A min-heap of candidate pairs with lazy invalidation over the
/// linked list of symbols makes it O(n log n) in the number of symbols.
void MergeSymbols(std::string_view word, const PairPriority& priority,
                  std::vector<BpeSymbol>* symbols);

/// Turns one pre-tokenized word into token ids.
class TokenModel {
 public:
  virtual ~TokenModel() = default;
  /// Appends the ids of `word` to `ids`.
  virtual void Tokenize(std::string_view word, std::vector<TokenId>* ids) const = 0;
};

/// Options of a tokenizer.json BPE model.
struct BpeModelOptions {
  TokenId unk_id = kNoToken;
  std::string continuing_subword_prefix;
  std::string end_of_word_suffix;
  bool fuse_unk = false;
  /// Characters missing from the vocabulary become <0xXX> byte tokens.
  bool byte_fallback = false;
  /// A word that is itself in the vocabulary is one token, without merging (Llama-3).
  bool ignore_merges = false;
};

/// Hugging Face BPE: words start as characters and merge in merge-rank order.
class BpeModel : public TokenModel, private PairPriority {
 public:
  /// `merges` are (left, right) piece pairs in rank order; every piece and every merged piece
  /// must be in `vocab`, else an INVALID_ARGUMENT error naming the merge.
  static absl::StatusOr<std::unique_ptr<BpeModel>> Create(
      absl::flat_hash_map<std::string, TokenId> vocab,
      const std::vector<std::pair<std::string, std::string>>& merges, BpeModelOptions options);
  void Tokenize(std::string_view word, std::vector<TokenId>* ids) const override;

 private:
  BpeModel() = default;
  bool Find(std::string_view word, const BpeSymbol& left, const BpeSymbol& right,
            BpeMerge* merge) const override;
  TokenId Lookup(std::string_view piece) const;

  absl::flat_hash_map<std::string, TokenId> vocab_;
  // (left id << 32 | right id) -> (rank, merged id).
  absl::flat_hash_map<uint64_t, std::pair<int32_t, TokenId>> merges_;
  std::array<TokenId, 256> byte_ids_{};
  BpeModelOptions options_;
};

/// SentencePiece BPE (GGUF "llama"): the adjacent pair whose concatenation is a vocabulary piece
/// with the highest score merges first (leftmost on ties); characters that end up outside the
/// vocabulary fall back to <0xXX> byte tokens, or to `unk_id` when those are missing too.
class SentencePieceBpeModel : public TokenModel, private PairPriority {
 public:
  /// `pieces[i]` with `scores[i]` for each mergeable piece; `byte_ids[b]` is the id of <0xXX>
  /// (kNoToken when absent).
  SentencePieceBpeModel(absl::flat_hash_map<std::string, std::pair<TokenId, float>> pieces,
                        std::array<TokenId, 256> byte_ids, TokenId unk_id)
      : pieces_(std::move(pieces)), byte_ids_(byte_ids), unk_id_(unk_id) {}
  void Tokenize(std::string_view word, std::vector<TokenId>* ids) const override;

 private:
  bool Find(std::string_view word, const BpeSymbol& left, const BpeSymbol& right,
            BpeMerge* merge) const override;

  absl::flat_hash_map<std::string, std::pair<TokenId, float>> pieces_;
  std::array<TokenId, 256> byte_ids_;
  TokenId unk_id_;
};

/// Views a std::string_view as absl::string_view (this abseil keeps them distinct), for
/// heterogeneous lookups in absl hash maps keyed by std::string.
inline absl::string_view ToAbsl(std::string_view s) { return {s.data(), s.size()}; }

/// "<0xXX>" for byte `b`.
std::string BytePieceName(uint8_t b);

/// The byte of a "<0xXX>" piece, or -1 when `piece` is not one.
int ParseBytePiece(std::string_view piece);

}  // namespace kvserve

#endif  // KVSERVE_COMMON_TOKENIZER_BPE_MODEL_H_
