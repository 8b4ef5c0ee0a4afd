#include "common/gguf/gguf_vocab_reader.h"

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace kvserve {
namespace {

/// Reads an optional special-token id; absent, 0xFFFFFFFF and -1 give kNoToken.
absl::Status ReadTokenId(const GgufFile& file, const std::string& key, size_t vocab_size,
                         TokenId* out) {
  *out = kNoToken;
  const GgufValue* v = file.Find(key);
  if (v == nullptr) return absl::OkStatus();
  std::optional<int64_t> id = v->AsInt64();
  if (!id.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat(file.path(), ": metadata key '", key,
                                                   "' has type ", GgufTypeName(v->type()),
                                                   ", expected an integer token id"));
  }
  if (*id == 0xFFFFFFFFll || *id == -1) return absl::OkStatus();
  if (*id < 0 || static_cast<uint64_t>(*id) >= vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat(file.path(), ": metadata key '", key, "' is ",
                                                   *id, ", outside the vocabulary of ", vocab_size,
                                                   " tokens"));
  }
  *out = static_cast<TokenId>(*id);
  return absl::OkStatus();
}

absl::Status ReadOptionalBool(const GgufFile& file, const std::string& key,
                              std::optional<bool>* out) {
  if (!file.Has(key)) return absl::OkStatus();
  absl::StatusOr<bool> b = file.GetBool(key);
  if (!b.ok()) return b.status();
  *out = *b;
  return absl::OkStatus();
}

absl::Status ReadOptionalString(const GgufFile& file, const std::string& key, std::string* out) {
  if (!file.Has(key)) return absl::OkStatus();
  absl::StatusOr<std::string> s = file.GetString(key);
  if (!s.ok()) return s.status();
  *out = *std::move(s);
  return absl::OkStatus();
}

absl::Status LengthMismatch(const GgufFile& file, const std::string& key, size_t got, size_t want) {
  return absl::InvalidArgumentError(absl::StrCat(file.path(), ": metadata key '", key, "' has ",
                                                 got, " entries but tokenizer.ggml.tokens has ",
                                                 want));
}

}  // namespace

absl::StatusOr<GgufVocab> ReadGgufVocab(const GgufFile& file) {
  if (!file.Has("tokenizer.ggml.tokens")) {
    return absl::InvalidArgumentError(
        absl::StrCat(file.path(), ": no tokenizer in GGUF metadata (tokenizer.ggml.tokens)"));
  }
  GgufVocab vocab;
  absl::StatusOr<std::vector<std::string>> tokens = file.GetStringArray("tokenizer.ggml.tokens");
  if (!tokens.ok()) return tokens.status();
  vocab.tokens = *std::move(tokens);
  if (vocab.tokens.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(file.path(), ": metadata key 'tokenizer.ggml.tokens' is empty"));
  }
  const size_t n = vocab.tokens.size();
  if (file.Has("tokenizer.ggml.scores")) {
    absl::StatusOr<std::vector<float>> scores = file.GetF32Array("tokenizer.ggml.scores");
    if (!scores.ok()) return scores.status();
    if (scores->size() != n)
      return LengthMismatch(file, "tokenizer.ggml.scores", scores->size(), n);
    vocab.scores = *std::move(scores);
  }
  if (file.Has("tokenizer.ggml.token_type")) {
    absl::StatusOr<std::vector<int32_t>> types = file.GetI32Array("tokenizer.ggml.token_type");
    if (!types.ok()) return types.status();
    if (types->size() != n) {
      return LengthMismatch(file, "tokenizer.ggml.token_type", types->size(), n);
    }
    vocab.token_types = *std::move(types);
  }
  if (file.Has("tokenizer.ggml.merges")) {
    absl::StatusOr<std::vector<std::string>> merges = file.GetStringArray("tokenizer.ggml.merges");
    if (!merges.ok()) return merges.status();
    vocab.merges = *std::move(merges);
  }
  for (auto [key, out] : {std::pair{"tokenizer.ggml.model", &vocab.model},
                          std::pair{"tokenizer.ggml.pre", &vocab.pre}}) {
    if (absl::Status s = ReadOptionalString(file, key, out); !s.ok()) return s;
  }
  for (auto [key, out] : {std::pair{"tokenizer.ggml.bos_token_id", &vocab.bos_id},
                          std::pair{"tokenizer.ggml.eos_token_id", &vocab.eos_id},
                          std::pair{"tokenizer.ggml.unknown_token_id", &vocab.unk_id},
                          std::pair{"tokenizer.ggml.padding_token_id", &vocab.pad_id}}) {
    if (absl::Status s = ReadTokenId(file, key, n, out); !s.ok()) return s;
  }
  for (auto [key, out] : {std::pair{"tokenizer.ggml.add_bos_token", &vocab.add_bos},
                          std::pair{"tokenizer.ggml.add_eos_token", &vocab.add_eos},
                          std::pair{"tokenizer.ggml.add_space_prefix", &vocab.add_space_prefix}}) {
    if (absl::Status s = ReadOptionalBool(file, key, out); !s.ok()) return s;
  }
  return vocab;
}

}  // namespace kvserve
