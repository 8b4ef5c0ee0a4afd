#include "common/tokenizer/tokenizer.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/tokenizer/gguf_tokenizer.h"
#include "common/tokenizer/tokenizer_json.h"
#include "common/tokenizer/tokenizer_parts.h"
#include "common/tokenizer/utf8.h"

namespace kvserve {

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromJsonFile(
    const std::string& tokenizer_json_path) {
  absl::StatusOr<std::unique_ptr<TokenizerParts>> parts = LoadTokenizerJson(tokenizer_json_path);
  if (!parts.ok()) return parts.status();
  return std::unique_ptr<Tokenizer>(new Tokenizer(*std::move(parts)));
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromGgufVocab(const GgufVocab& vocab) {
  absl::StatusOr<std::unique_ptr<TokenizerParts>> parts = BuildGgufTokenizer(vocab);
  if (!parts.ok()) return parts.status();
  return std::unique_ptr<Tokenizer>(new Tokenizer(*std::move(parts)));
}

Tokenizer::Tokenizer(std::unique_ptr<TokenizerParts> parts) : parts_(std::move(parts)) {}

Tokenizer::~Tokenizer() = default;

void Tokenizer::EncodeSection(std::string_view text, bool at_text_start,
                              std::vector<TokenId>* ids) const {
  const TokenizerParts& p = *parts_;
  std::string normalized(text);
  if (p.normalizer != nullptr) p.normalizer->Normalize(&normalized);
  std::vector<TextSection> sections;
  if (p.normalized_tokens.empty()) {
    if (!normalized.empty()) sections.push_back({normalized, kNoToken});
  } else {
    sections = p.normalized_tokens.Split(normalized);
  }
  for (size_t i = 0; i < sections.size(); ++i) {
    if (sections[i].id != kNoToken) {
      ids->push_back(sections[i].id);
      continue;
    }
    std::vector<std::string> words{std::string(sections[i].text)};
    if (p.pre_tokenizer != nullptr) p.pre_tokenizer->Split(&words, at_text_start && i == 0);
    for (const std::string& word : words) p.model->Tokenize(word, ids);
  }
}

absl::StatusOr<std::vector<TokenId>> Tokenizer::Encode(std::string_view text,
                                                       const EncodeOptions& options) const {
  const size_t bad = utf8::FindInvalid(text);
  if (bad != text.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("Encode: text is not valid UTF-8 (ill-formed byte at offset ", bad, ")"));
  }
  const TokenizerParts& p = *parts_;
  std::vector<TokenId> ids;
  if (options.add_special_tokens) ids = p.prefix_ids;
  for (const TextSection& section : p.raw_tokens.Split(text)) {
    if (section.id != kNoToken) {
      ids.push_back(section.id);
    } else {
      EncodeSection(section.text, section.text.data() == text.data(), &ids);
    }
  }
  if (options.add_special_tokens) ids.insert(ids.end(), p.suffix_ids.begin(), p.suffix_ids.end());
  return ids;
}

absl::StatusOr<std::string> Tokenizer::Decode(std::span<const TokenId> ids,
                                              const DecodeOptions& options) const {
  const TokenizerParts& p = *parts_;
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    const TokenId id = ids[i];
    if (id < 0 || static_cast<size_t>(id) >= p.pieces.size() || !p.has_piece[id]) {
      return absl::InvalidArgumentError(absl::StrCat("Decode: token id ", id, " at position ", i,
                                                     " is outside the vocabulary (size ",
                                                     p.pieces.size(), ")"));
    }
    if (options.skip_special_tokens && p.special[id]) continue;
    tokens.push_back(p.pieces[id]);
  }
  if (p.decoder == nullptr) return utf8::ToValidLossy(absl::StrJoin(tokens, " "));
  p.decoder->DecodeChain(&tokens);
  return utf8::ToValidLossy(absl::StrJoin(tokens, ""));
}

int Tokenizer::vocab_size() const { return static_cast<int>(parts_->pieces.size()); }

TokenId Tokenizer::bos_id() const { return parts_->bos_id; }

TokenId Tokenizer::eos_id() const { return parts_->eos_id; }

bool Tokenizer::IsSpecial(TokenId id) const {
  return id >= 0 && static_cast<size_t>(id) < parts_->special.size() && parts_->special[id];
}

std::string_view Tokenizer::IdToPiece(TokenId id) const {
  if (id < 0 || static_cast<size_t>(id) >= parts_->pieces.size()) return {};
  return parts_->pieces[id];
}

std::optional<TokenId> Tokenizer::PieceToId(std::string_view piece) const {
  const auto it = parts_->piece_ids.find(ToAbsl(piece));
  if (it == parts_->piece_ids.end()) return std::nullopt;
  return it->second;
}

const std::string& Tokenizer::chat_template() const { return parts_->chat_template; }

}  // namespace kvserve
