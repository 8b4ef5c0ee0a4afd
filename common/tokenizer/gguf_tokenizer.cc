#include "common/tokenizer/gguf_tokenizer.h"

#include "absl/strings/str_cat.h"

namespace kvserve {
namespace {

constexpr int32_t kTypeNormal = 1;
constexpr int32_t kTypeUnknown = 2;
constexpr int32_t kTypeControl = 3;
constexpr int32_t kTypeUserDefined = 4;
constexpr int32_t kTypeByte = 6;

constexpr std::string_view kMetaspace = "\xE2\x96\x81";  // U+2581 '▁'

int32_t TypeOf(const GgufVocab& v, size_t id) {
  return v.token_types.empty() ? kTypeNormal : v.token_types[id];
}

absl::Status Validate(const GgufVocab& v) {
  if (v.tokens.empty()) return absl::InvalidArgumentError("tokenizer.ggml.tokens is empty");
  if (!v.scores.empty() && v.scores.size() != v.tokens.size()) {
    return absl::InvalidArgumentError(absl::StrCat("tokenizer.ggml.scores has ", v.scores.size(),
                                                   " entries but there are ", v.tokens.size(),
                                                   " tokens"));
  }
  if (!v.token_types.empty() && v.token_types.size() != v.tokens.size()) {
    return absl::InvalidArgumentError(absl::StrCat("tokenizer.ggml.token_type has ",
                                                   v.token_types.size(), " entries but there are ",
                                                   v.tokens.size(), " tokens"));
  }
  const auto n = static_cast<TokenId>(v.tokens.size());
  for (const auto& [name, id] : {std::pair<const char*, TokenId>{"bos_token_id", v.bos_id},
                                 {"eos_token_id", v.eos_id},
                                 {"unknown_token_id", v.unk_id},
                                 {"padding_token_id", v.pad_id}}) {
    if (id != kNoToken && (id < 0 || id >= n)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tokenizer.ggml.", name, " = ", id, " is outside the vocabulary (", n, " tokens)"));
    }
  }
  return absl::OkStatus();
}

// Pieces, specials and literally matched tokens, shared by both models.
void FillVocab(const GgufVocab& v, TokenizerParts* parts) {
  std::vector<AddedToken> matched;
  for (size_t i = 0; i < v.tokens.size(); ++i) {
    const int32_t type = TypeOf(v, i);
    const bool special = type == kTypeControl || type == kTypeUnknown;
    parts->SetPiece(static_cast<TokenId>(i), v.tokens[i], special);
    if (special || type == kTypeUserDefined) {
      AddedToken t;
      t.id = static_cast<TokenId>(i);
      t.content = v.tokens[i];
      t.special = special;
      matched.push_back(std::move(t));
    }
  }
  parts->raw_tokens = AddedTokenMatcher(matched);
  // PieceToId of a piece listed twice gives its first id.
  for (size_t i = v.tokens.size(); i-- > 0;) {
    parts->piece_ids[v.tokens[i]] = static_cast<TokenId>(i);
  }
  parts->bos_id = v.bos_id;
  parts->eos_id = v.eos_id;
}

absl::Status BuildLlama(const GgufVocab& v, TokenizerParts* parts) {
  absl::flat_hash_map<std::string, std::pair<TokenId, float>> pieces;
  std::array<TokenId, 256> byte_ids;
  byte_ids.fill(kNoToken);
  for (size_t i = 0; i < v.tokens.size(); ++i) {
    const int32_t type = TypeOf(v, i);
    const auto id = static_cast<TokenId>(i);
    const int byte = ParseBytePiece(v.tokens[i]);
    if (byte >= 0 && (type == kTypeByte || byte_ids[byte] == kNoToken)) byte_ids[byte] = id;
    if (type == kTypeNormal || type == kTypeUserDefined) {
      pieces.try_emplace(v.tokens[i], id, v.scores.empty() ? 0.0f : v.scores[i]);
    }
  }
  parts->model = std::make_unique<SentencePieceBpeModel>(std::move(pieces), byte_ids, v.unk_id);
  const bool space_prefix = v.add_space_prefix.value_or(true);
  std::vector<std::unique_ptr<Normalizer>> steps;
  if (space_prefix) steps.push_back(std::make_unique<PrependNormalizer>(std::string(kMetaspace)));
  steps.push_back(std::make_unique<ReplaceNormalizer>(*Regex::Compile(" ", /*literal=*/true),
                                                      std::string(kMetaspace)));
  parts->normalizer = std::make_unique<SequenceNormalizer>(std::move(steps));
  parts->decoder = MakeSentencePieceDecoder(space_prefix);
  if (v.add_bos.value_or(true)) {
    if (v.bos_id == kNoToken) {
      return absl::InvalidArgumentError(
          "tokenizer.ggml.add_bos_token is true but tokenizer.ggml.bos_token_id is missing");
    }
    parts->prefix_ids.push_back(v.bos_id);
  }
  return absl::OkStatus();
}

absl::Status BuildGpt2(const GgufVocab& v, TokenizerParts* parts) {
  const std::string pre = v.pre.empty() ? "default" : v.pre;
  absl::StatusOr<std::unique_ptr<PreTokenizer>> pre_tokenizer;
  bool ignore_merges = false;
  if (pre == "default" || pre == "gpt-2" || pre == "gpt2") {
    pre_tokenizer = MakeByteLevelPreTokenizer(kGpt2Pattern, false);
  } else if (pre == "llama-bpe" || pre == "llama3") {
    pre_tokenizer = MakeByteLevelPreTokenizer(kLlama3Pattern, false);
    ignore_merges = true;
  } else if (pre == "qwen2") {
    pre_tokenizer = MakeByteLevelPreTokenizer(kQwen2Pattern, false);
  } else if (pre == "smollm") {
    pre_tokenizer = MakeByteLevelPreTokenizer(kGpt2Pattern, true);
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer.ggml.pre: unsupported pre-tokenizer '", pre, "'"));
  }
  if (!pre_tokenizer.ok()) return pre_tokenizer.status();
  parts->pre_tokenizer = *std::move(pre_tokenizer);

  absl::flat_hash_map<std::string, TokenId> vocab;
  vocab.reserve(v.tokens.size());
  for (size_t i = v.tokens.size(); i-- > 0;) vocab[v.tokens[i]] = static_cast<TokenId>(i);
  std::vector<std::pair<std::string, std::string>> merges;
  merges.reserve(v.merges.size());
  for (size_t i = 0; i < v.merges.size(); ++i) {
    const std::string& m = v.merges[i];
    const size_t space = m.find(' ', 1);
    if (space == std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("tokenizer.ggml.merges[", i, "]: expected \"left right\", got '", m, "'"));
    }
    merges.emplace_back(m.substr(0, space), m.substr(space + 1));
  }
  BpeModelOptions options;
  options.unk_id = v.unk_id;
  options.ignore_merges = ignore_merges;
  absl::StatusOr<std::unique_ptr<BpeModel>> model =
      BpeModel::Create(std::move(vocab), merges, std::move(options));
  if (!model.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer.ggml.merges: ", model.status().message()));
  }
  parts->model = *std::move(model);
  parts->decoder = std::make_unique<ByteLevelDecoder>();
  if (v.add_bos.value_or(false)) {
    if (v.bos_id == kNoToken) {
      return absl::InvalidArgumentError(
          "tokenizer.ggml.add_bos_token is true but tokenizer.ggml.bos_token_id is missing");
    }
    parts->prefix_ids.push_back(v.bos_id);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<TokenizerParts>> BuildGgufTokenizer(const GgufVocab& vocab) {
  absl::Status s = Validate(vocab);
  if (!s.ok()) return s;
  auto parts = std::make_unique<TokenizerParts>();
  FillVocab(vocab, parts.get());
  if (vocab.model == "llama") {
    s = BuildLlama(vocab, parts.get());
  } else if (vocab.model == "gpt2") {
    s = BuildGpt2(vocab, parts.get());
  } else {
    return absl::InvalidArgumentError(absl::StrCat("tokenizer.ggml.model: unsupported model '",
                                                   vocab.model, "' (expected llama or gpt2)"));
  }
  if (!s.ok()) return s;
  if (vocab.add_eos.value_or(false)) {
    if (vocab.eos_id == kNoToken) {
      return absl::InvalidArgumentError(
          "tokenizer.ggml.add_eos_token is true but tokenizer.ggml.eos_token_id is missing");
    }
    parts->suffix_ids.push_back(vocab.eos_id);
  }
  return parts;
}

}  // namespace kvserve
