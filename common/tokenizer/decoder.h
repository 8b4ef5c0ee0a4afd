#ifndef KVSERVE_COMMON_TOKENIZER_DECODER_H_
#define KVSERVE_COMMON_TOKENIZER_DECODER_H_

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/tokenizer/regex.h"
#include "nlohmann/json_fwd.hpp"

namespace kvserve {

/// Turns token pieces back into text, like tokenizer.json's "decoder": each step rewrites the
/// list of piece strings, and the final list is concatenated.
class Decoder {
 public:
  virtual ~Decoder() = default;
  /// Rewrites `tokens` in place. Output strings are valid UTF-8.
  virtual void DecodeChain(std::vector<std::string>* tokens) const = 0;
};

/// Byte-level pieces back to bytes, then to text (ill-formed UTF-8 becomes U+FFFD); one output.
class ByteLevelDecoder : public Decoder {
 public:
  void DecodeChain(std::vector<std::string>* tokens) const override;
};

/// Replaces every match of a pattern in each piece ("Replace", e.g. ▁ -> space).
class ReplaceDecoder : public Decoder {
 public:
  ReplaceDecoder(std::unique_ptr<Regex> pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void DecodeChain(std::vector<std::string>* tokens) const override;

 private:
  std::unique_ptr<Regex> pattern_;
  std::string content_;
};

/// Runs of <0xXX> pieces become the text of their bytes ("ByteFallback"; ill-formed UTF-8
/// becomes U+FFFD).
class ByteFallbackDecoder : public Decoder {
 public:
  void DecodeChain(std::vector<std::string>* tokens) const override;
};

/// Joins all pieces into one ("Fuse").
class FuseDecoder : public Decoder {
 public:
  void DecodeChain(std::vector<std::string>* tokens) const override;
};

/// Removes up to `start` leading and `stop` trailing copies of `content` from each piece
/// ("Strip"; Llama uses it to drop the dummy-prefix space).
class StripDecoder : public Decoder {
 public:
  StripDecoder(std::string content, size_t start, size_t stop)
      : content_(std::move(content)), start_(start), stop_(stop) {}
  void DecodeChain(std::vector<std::string>* tokens) const override;

 private:
  std::string content_;
  size_t start_;
  size_t stop_;
};

/// "Metaspace": `replacement` (▁) back to spaces; the first piece loses its leading space when
/// the pre-tokenizer prepends one.
class MetaspaceDecoder : public Decoder {
 public:
  MetaspaceDecoder(std::string replacement, bool strip_first_space)
      : replacement_(std::move(replacement)), strip_first_space_(strip_first_space) {}
  void DecodeChain(std::vector<std::string>* tokens) const override;

 private:
  std::string replacement_;
  bool strip_first_space_;
};

/// Runs decoders in order ("Sequence").
class SequenceDecoder : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> steps)
      : steps_(std::move(steps)) {}
  void DecodeChain(std::vector<std::string>* tokens) const override;

 private:
  std::vector<std::unique_ptr<Decoder>> steps_;
};

/// The SentencePiece decoder chain: Replace(▁ -> " "), ByteFallback, Fuse and, when
/// `strip_leading_space`, Strip(" ", 1, 0).
std::unique_ptr<Decoder> MakeSentencePieceDecoder(bool strip_leading_space);

/// Builds a decoder from its tokenizer.json object; `where` names it in errors.
absl::StatusOr<std::unique_ptr<Decoder>> DecoderFromJson(const nlohmann::json& j,
                                                         const std::string& where);

}  // namespace kvserve

#endif  // KVSERVE_COMMON_TOKENIZER_DECODER_H_
