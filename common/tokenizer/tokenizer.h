#ifndef KVSERVE_COMMON_TOKENIZER_TOKENIZER_H_
#define KVSERVE_COMMON_TOKENIZER_TOKENIZER_H_

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/token.h"
#include "common/tokenizer/gguf_vocab.h"

namespace kvserve {

struct TokenizerParts;

/// Options of Tokenizer::Encode.
struct EncodeOptions {
  /// Apply the post-processor (e.g. prepend <s>).
  bool add_special_tokens = true;
};

/// Options of Tokenizer::Decode.
struct DecodeOptions {
  /// Drop special tokens (<s>, <|endoftext|>, ...) from the text.
  bool skip_special_tokens = false;
};

/// A text <-> token id converter: Hugging Face tokenizer.json pipelines (normalizer,
/// pre-tokenizer, BPE model, post-processor, decoder) and GGUF vocabularies. Immutable after
/// construction: every method may be called from several threads at once.
///
/// Encode: added tokens are matched in the raw text first (leftmost, longest); each text section
/// between them is normalized, pre-tokenized into words, and each word is BPE-merged.
class Tokenizer {
 public:
  /// tokenizer.json (path to the file); reads tokenizer_config.json from the same directory when
  /// present (add_bos_token/add_eos_token override the post-processor like LlamaTokenizerFast;
  /// bos_token/eos_token names; chat_template).
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromJsonFile(
      const std::string& tokenizer_json_path);
  /// A tokenizer described by GGUF metadata (see gguf_vocab.h).
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromGgufVocab(const GgufVocab& vocab);

  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  /// Token ids of `text` (valid UTF-8, else INVALID_ARGUMENT naming the byte offset).
  absl::StatusOr<std::vector<TokenId>> Encode(std::string_view text,
                                              const EncodeOptions& options = {}) const;
  /// Decodes ids; ids outside the vocabulary are an error. The result is valid UTF-8.
  absl::StatusOr<std::string> Decode(std::span<const TokenId> ids,
                                     const DecodeOptions& options = {}) const;

  /// One more than the largest token id.
  int vocab_size() const;
  /// kNoToken when none.
  TokenId bos_id() const;
  /// kNoToken when none.
  TokenId eos_id() const;
  /// True for special tokens (those skip_special_tokens drops).
  bool IsSpecial(TokenId id) const;
  /// The raw vocabulary string of `id` (empty for an unknown id).
  std::string_view IdToPiece(TokenId id) const;
  /// The id of a raw vocabulary string.
  std::optional<TokenId> PieceToId(std::string_view piece) const;
  /// The chat template (Jinja source); empty when none.
  const std::string& chat_template() const;

 private:
  explicit Tokenizer(std::unique_ptr<TokenizerParts> parts);
  void EncodeSection(std::string_view text, bool at_text_start, std::vector<TokenId>* ids) const;

  std::unique_ptr<const TokenizerParts> parts_;
};

/// Streaming detokenizer: feed ids one at a time, get the new text; never returns a
/// broken/incomplete UTF-8 sequence (holds bytes back until complete), and the concatenation of
/// all outputs + Finish() equals Decode(all ids).
///
/// Works like TGI: it decodes a window that starts a few tokens back (prefix offset) with and
/// without the tokens not yet shown (read offset) and emits the difference, so decoders that
/// strip a leading space (SentencePiece) or join bytes (byte fallback) see the same context as a
/// full decode. Text ending in U+FFFD is held back until a later token completes it.
class IncrementalDecoder {
 public:
  /// `tokenizer` must outlive this decoder.
  IncrementalDecoder(const Tokenizer& tokenizer, DecodeOptions options = {});
  /// Adds one id and returns the text it completes (possibly empty). An id outside the
  /// vocabulary is an error and is not added.
  absl::StatusOr<std::string> Add(TokenId id);
  /// Seeds the decoder with the last tokens of the prompt as context (not emitted), so the first
  /// generated token decodes as it does after the prompt: a SentencePiece "▁were" then yields
  /// " were", and prompt text + generated text equals decoding everything. Call before Add.
  void SetPrompt(std::span<const TokenId> prompt_ids);
  /// Whatever is still held back (a truncated UTF-8 tail is emitted as U+FFFD).
  std::string Finish();

 private:
  const Tokenizer* tokenizer_;
  DecodeOptions options_;
  std::vector<TokenId> ids_;
  size_t prefix_offset_ = 0;
  size_t read_offset_ = 0;
};

}  // namespace kvserve

#endif  // KVSERVE_COMMON_TOKENIZER_TOKENIZER_H_
