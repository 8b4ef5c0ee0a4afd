#include "common/tokenizer/bpe_model.h"

#include <queue>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/tokenizer/utf8.h"

namespace kvserve {
namespace {

struct Candidate {
  double priority;
  int32_t left;
  int32_t right;
  uint32_t right_end;  // the right symbol's end when queued; a change means it grew since
  TokenId merged_id;
};

struct LaterCandidate {
  bool operator()(const Candidate& a, const Candidate& b) const {
    if (a.priority != b.priority) return a.priority > b.priority;
    return a.left > b.left;
  }
};

using CandidateQueue = std::priority_queue<Candidate, std::vector<Candidate>, LaterCandidate>;

void PushPair(std::string_view word, const PairPriority& priority,
              const std::vector<BpeSymbol>& symbols, int32_t left, CandidateQueue* queue) {
  if (left < 0) return;
  const int32_t right = symbols[left].next;
  if (right < 0) return;
  BpeMerge merge;
  if (priority.Find(word, symbols[left], symbols[right], &merge)) {
    queue->push({merge.priority, left, right, symbols[right].end, merge.merged_id});
  }
}

void Link(std::vector<BpeSymbol>* symbols) {
  for (size_t i = 0; i < symbols->size(); ++i) {
    (*symbols)[i].prev = static_cast<int32_t>(i) - 1;
    (*symbols)[i].next = i + 1 < symbols->size() ? static_cast<int32_t>(i) + 1 : -1;
    (*symbols)[i].alive = true;
  }
}

// Byte length of the character at `pos` (invalid bytes count as one character each).
size_t CharLength(std::string_view word, size_t pos) {
  const size_t len = utf8::SequenceLength(word, pos);
  return len == 0 ? 1 : len;
}

}  // namespace

void MergeSymbols(std::string_view word, const PairPriority& priority,
                  std::vector<BpeSymbol>* symbols) {
  std::vector<BpeSymbol>& s = *symbols;
  if (s.size() < 2) return;
  std::vector<Candidate> storage;
  storage.reserve(s.size());
  CandidateQueue queue(LaterCandidate(), std::move(storage));
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(s.size()); ++i) {
    PushPair(word, priority, s, i, &queue);
  }
  while (!queue.empty()) {
    const Candidate c = queue.top();
    queue.pop();
    BpeSymbol& left = s[c.left];
    if (!left.alive || left.next != c.right) continue;
    BpeSymbol& right = s[c.right];
    if (!right.alive || right.end != c.right_end) continue;
    left.id = c.merged_id;
    left.end = right.end;
    left.next = right.next;
    if (right.next >= 0) s[right.next].prev = c.left;
    right.alive = false;
    PushPair(word, priority, s, left.prev, &queue);
    PushPair(word, priority, s, c.left, &queue);
  }
}

std::string BytePieceName(uint8_t b) { return absl::StrFormat("<0x%02X>", b); }

int ParseBytePiece(std::string_view piece) {
  if (piece.size() != 6 || !piece.starts_with("<0x") || piece[5] != '>') return -1;
  int value = 0;
  for (size_t i = 3; i < 5; ++i) {
    const char c = piece[i];
    int digit;
    if (c >= '0' && c <= '9') {
      digit = c - '0';
    } else if (c >= 'A' && c <= 'F') {
      digit = c - 'A' + 10;
    } else if (c >= 'a' && c <= 'f') {
      digit = c - 'a' + 10;
    } else {
      return -1;
    }
    value = value * 16 + digit;
  }
  return value;
}

absl::StatusOr<std::unique_ptr<BpeModel>> BpeModel::Create(
    absl::flat_hash_map<std::string, TokenId> vocab,
    const std::vector<std::pair<std::string, std::string>>& merges, BpeModelOptions options) {
  std::unique_ptr<BpeModel> model(new BpeModel());
  model->vocab_ = std::move(vocab);
  model->options_ = std::move(options);
  model->merges_.reserve(merges.size());
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [a, b] = merges[rank];
    const TokenId left = model->Lookup(a);
    const TokenId right = model->Lookup(b);
    const TokenId merged = model->Lookup(absl::StrCat(a, b));
    if (left == kNoToken || right == kNoToken || merged == kNoToken) {
      return absl::InvalidArgumentError(
          absl::StrCat("model.merges[", rank, "]: '", a, " ", b, "' uses a piece (",
                       left == kNoToken ? a : (right == kNoToken ? b : absl::StrCat(a, b)),
                       ") that is not in model.vocab"));
    }
    const uint64_t key = (static_cast<uint64_t>(left) << 32) | static_cast<uint32_t>(right);
    // The first (best) rank of a duplicated merge wins.
    model->merges_.try_emplace(key, static_cast<int32_t>(rank), merged);
  }
  for (int b = 0; b < 256; ++b) {
    model->byte_ids_[b] = model->Lookup(BytePieceName(static_cast<uint8_t>(b)));
  }
  return model;
}

TokenId BpeModel::Lookup(std::string_view piece) const {
  const auto it = vocab_.find(ToAbsl(piece));
  return it == vocab_.end() ? kNoToken : it->second;
}

bool BpeModel::Find(std::string_view /*word*/, const BpeSymbol& left, const BpeSymbol& right,
                    BpeMerge* merge) const {
  if (left.id == kNoToken || right.id == kNoToken) return false;
  const uint64_t key = (static_cast<uint64_t>(left.id) << 32) | static_cast<uint32_t>(right.id);
  const auto it = merges_.find(key);
  if (it == merges_.end()) return false;
  merge->priority = it->second.first;
  merge->merged_id = it->second.second;
  return true;
}

void BpeModel::Tokenize(std::string_view word, std::vector<TokenId>* ids) const {
  if (word.empty()) return;
  if (options_.ignore_merges) {
    if (const TokenId id = Lookup(word); id != kNoToken) {
      ids->push_back(id);
      return;
    }
  }
  std::vector<BpeSymbol> symbols;
  symbols.reserve(word.size());
  bool last_is_unk = false;
  std::string piece;
  for (size_t pos = 0; pos < word.size();) {
    const size_t len = CharLength(word, pos);
    const auto begin = static_cast<uint32_t>(pos);
    const auto end = static_cast<uint32_t>(pos + len);
    piece.clear();
    if (pos > 0) piece.append(options_.continuing_subword_prefix);
    piece.append(word.substr(pos, len));
    if (pos + len == word.size()) piece.append(options_.end_of_word_suffix);
    pos += len;
    if (const TokenId id = Lookup(piece); id != kNoToken) {
      symbols.push_back({id, begin, end, 0, 0, true});
      last_is_unk = false;
      continue;
    }
    if (options_.byte_fallback) {
      bool all_bytes = true;
      for (uint32_t b = begin; b < end; ++b) {
        all_bytes = all_bytes && byte_ids_[static_cast<unsigned char>(word[b])] != kNoToken;
      }
      if (all_bytes) {
        for (uint32_t b = begin; b < end; ++b) {
          symbols.push_back({byte_ids_[static_cast<unsigned char>(word[b])], b, b + 1, 0, 0, true});
        }
        last_is_unk = false;
        continue;
      }
    }
    if (options_.unk_id == kNoToken) continue;  // No unknown token: the character is dropped.
    if (options_.fuse_unk && last_is_unk) {
      symbols.back().end = end;
    } else {
      symbols.push_back({options_.unk_id, begin, end, 0, 0, true});
    }
    last_is_unk = true;
  }
  Link(&symbols);
  MergeSymbols(word, *this, &symbols);
  for (int32_t i = symbols.empty() ? -1 : 0; i >= 0; i = symbols[i].next) {
    ids->push_back(symbols[i].id);
  }
}

bool SentencePieceBpeModel::Find(std::string_view word, const BpeSymbol& left,
                                 const BpeSymbol& right, BpeMerge* merge) const {
  const auto it = pieces_.find(ToAbsl(word.substr(left.begin, right.end - left.begin)));
  if (it == pieces_.end()) return false;
  merge->priority = -static_cast<double>(it->second.second);
  merge->merged_id = it->second.first;
  return true;
}

void SentencePieceBpeModel::Tokenize(std::string_view word, std::vector<TokenId>* ids) const {
  if (word.empty()) return;
  std::vector<BpeSymbol> symbols;
  symbols.reserve(word.size());
  for (size_t pos = 0; pos < word.size();) {
    const size_t len = CharLength(word, pos);
    const auto it = pieces_.find(ToAbsl(word.substr(pos, len)));
    const TokenId id = it == pieces_.end() ? kNoToken : it->second.first;
    symbols.push_back(
        {id, static_cast<uint32_t>(pos), static_cast<uint32_t>(pos + len), 0, 0, true});
    pos += len;
  }
  Link(&symbols);
  MergeSymbols(word, *this, &symbols);
  for (int32_t i = 0; i >= 0; i = symbols[i].next) {
    const BpeSymbol& s = symbols[i];
    if (s.id != kNoToken) {
      ids->push_back(s.id);
      continue;
    }
    for (uint32_t b = s.begin; b < s.end; ++b) {
      const TokenId byte_id = byte_ids_[static_cast<unsigned char>(word[b])];
      if (byte_id != kNoToken) {
        ids->push_back(byte_id);
      } else if (unk_id_ != kNoToken) {
        ids->push_back(unk_id_);
      }
    }
  }
}

}  // namespace kvserve
