#ifndef KVSERVE_COMMON_TOKENIZER_PRE_TOKENIZER_H_
#define KVSERVE_COMMON_TOKENIZER_PRE_TOKENIZER_H_

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/tokenizer/regex.h"
#include "nlohmann/json_fwd.hpp"

namespace kvserve {

/// The GPT-2 split pattern (contractions, letter runs, digit runs, other runs, whitespace).
inline constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
/// The Llama-3 split pattern (case-insensitive contractions, digit runs of at most 3).
inline constexpr std::string_view kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3})"
    R"(| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
/// The Qwen2 split pattern (like Llama-3, but single digits).
inline constexpr std::string_view kQwen2Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N})"
    R"(| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

/// What a Split does with the pattern's matches (tokenizer.json "behavior").
enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

/// Cuts one section of normalized text into the words the model tokenizes separately, like
/// tokenizer.json's "pre_tokenizer". Works on a list of pieces, so steps compose.
class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  /// Replaces `pieces` by their sub-pieces. `at_text_start` says the first piece begins at offset
  /// 0 of the caller's input (Metaspace's "first" prepend scheme needs it).
  virtual void Split(std::vector<std::string>* pieces, bool at_text_start) const;

 protected:
  /// Splits one piece, appending the results to `out`; `first` is true for the very first piece
  /// of the input text.
  virtual void SplitOne(std::string_view piece, bool first,
                        std::vector<std::string>* out) const = 0;
};

/// Splits on a pattern's matches with a SplitBehavior ("Split"; "invert" swaps matches and gaps).
class RegexSplitPreTokenizer : public PreTokenizer {
 public:
  RegexSplitPreTokenizer(std::unique_ptr<Regex> pattern, SplitBehavior behavior, bool invert)
      : pattern_(std::move(pattern)), behavior_(behavior), invert_(invert) {}

 protected:
  void SplitOne(std::string_view piece, bool first, std::vector<std::string>* out) const override;

 private:
  std::unique_ptr<Regex> pattern_;
  SplitBehavior behavior_;
  bool invert_;
};

/// GPT-2 byte-level step ("ByteLevel"): optional leading space, optional split with the GPT-2
/// pattern, then every byte spelled as its byte-level character (see byte_level.h).
class ByteLevelPreTokenizer : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, std::unique_ptr<Regex> gpt2_pattern_or_null)
      : add_prefix_space_(add_prefix_space), pattern_(std::move(gpt2_pattern_or_null)) {}

 protected:
  void SplitOne(std::string_view piece, bool first, std::vector<std::string>* out) const override;

 private:
  bool add_prefix_space_;
  std::unique_ptr<Regex> pattern_;
};

/// SentencePiece-style "Metaspace": spaces become `replacement` (▁), a ▁ is prepended per the
/// prepend scheme, and with `split` each ▁ starts a new piece.
class MetaspacePreTokenizer : public PreTokenizer {
 public:
  enum class Prepend { kAlways, kFirst, kNever };
  MetaspacePreTokenizer(std::string replacement, Prepend prepend, bool split);

 protected:
  void SplitOne(std::string_view piece, bool first, std::vector<std::string>* out) const override;

 private:
  std::string replacement_;
  Prepend prepend_;
  bool split_;
  std::unique_ptr<Regex> replacement_pattern_;
};

/// Runs pre-tokenizers in order ("Sequence").
class SequencePreTokenizer : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> steps)
      : steps_(std::move(steps)) {}
  void Split(std::vector<std::string>* pieces, bool at_text_start) const override;

 protected:
  void SplitOne(std::string_view, bool, std::vector<std::string>*) const override {}

 private:
  std::vector<std::unique_ptr<PreTokenizer>> steps_;
};

/// A byte-level pre-tokenizer over `pattern` (GGUF "gpt2" vocabularies): split with the pattern
/// (isolated), then the byte-level map. With `individual_digits`, digits are isolated first.
absl::StatusOr<std::unique_ptr<PreTokenizer>> MakeByteLevelPreTokenizer(std::string_view pattern,
                                                                        bool individual_digits);

/// Builds a pre-tokenizer from its tokenizer.json object; `where` names it in errors.
absl::StatusOr<std::unique_ptr<PreTokenizer>> PreTokenizerFromJson(const nlohmann::json& j,
                                                                   const std::string& where);

}  // namespace kvserve

#endif  // KVSERVE_COMMON_TOKENIZER_PRE_TOKENIZER_H_
